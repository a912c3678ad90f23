// The attention output of one query position per sequence, o = p . V, for every row of a decode
// step in ONE kernel, each element summed in the order cuBLAS (13.1, H200) sums it when MLX
// 0.32.2 CUDA runs `matmul(p, expand_dims(v, 2))` (p `[1, kv_heads, groups, 1, S]` bf16 / f16
// probabilities, v a `[1, kv_heads, S, D]` cache view): the last step of MLX's decomposed
// `scaled_dot_product_attention`, so a row's output keeps mlx-lm's bits while the matmul's
// ~26 us of host work per row and layer becomes one node per layer.
//
// cublasLt's heuristic picks a kernel by S (scripts/gpu/values_order.py recorded every S up to
// 8192 and the summation tree of each kernel; src/model/values_product.rs holds the table):
// - S a multiple of 8: `nvjet_sm90_tst_64x8_64x16` (wgmma): 16 keys at a time in key order, each
//   16 products and the f32 accumulator added by the tensor core (truncating, not IEEE): here the
//   same k16 steps with `mma.sync.m16n8k16` (bit-equal on the H200);
// - otherwise CUDA-core gemv kernels, f32 accumulation, each element a set of Y partial sums
//   combined by a tree with falling offsets (Y/2, ..., 1):
//   * S <= HALVES_MAX: `gemvx<6>` [32, 2]: two contiguous halves (the first ceil(S / 2) keys);
//   * S <= NSP_MAX: `gemvNSP<1, 32, 4>`: Y = 32, partial y takes keys 4y..4y+3, then + 128, ...;
//   * otherwise (up to the table's last count, which the host checks): `gemvx<9>`: Y =
//     STRIDED_Y partials, partial y takes runs of v = min(STRIDED_V, ceil(S / Y)) consecutive
//     keys at v * y, then + v * Y, ...
// Products of bf16 / f16 values are exact in f32, so cuBLAS's fma equals a product then a sum;
// `__fmul_rn` / `__fadd_rn` keep NVRTC from contracting differently.
//
// Body of an MLX custom kernel, bf16 only (the mma instruction's type). MLX writes the
// signature (per row `p<r>`, `v<r>` with `_shape` / `_strides`, output `o` `[rows, kv_heads,
// groups, 1, D]`) and the template constants `T`, `D`, `HALVES_MAX`, `NSP_MAX`, `STRIDED_Y`,
// `STRIDED_V`. memexec prepends a prologue (src/model/values_product.rs, `source`)
// that picks the block's row `row` and defines `pr`, `vr`, `n_keys`, `kv_heads`, `groups` (at
// most 8), `v_head`, `v_step`. Launch: rows * kv_heads * (D / 32) blocks of 1024 threads, a
// block per (row, KV head, 32 dims); every row's S in the table (the host checks).
static_assert(D % 128 == 0, "head dim must be a multiple of 128");
constexpr int MAX_GROUPS = 8;
const int tiles = D / 32;
const int g = (blockIdx.x / tiles) % kv_heads;
const int d_base = (blockIdx.x % tiles) * 32;
const int lane = threadIdx.x % 32;
const int warp = threadIdx.x / 32;
const T* ph = pr + g * groups * n_keys;
const T* vh = vr + g * v_head;
T* oh = o + (static_cast<int64_t>(row) * kv_heads + g) * groups * D;

if (n_keys % 8 == 0) {
  // Tensor cores: warps 0 and 1 each compute 16 dims of every group (A = V^T, B = p^T).
  if (warp >= 2) {
    return;
  }
  const int d0 = d_base + warp * 16;
  const int gid = lane >> 2;
  const int tig = lane & 3;
  auto bits = [](T x) -> uint32_t { return static_cast<uint32_t>(__bfloat16_as_ushort(x)); };
  auto ldv = [&](int k, int m) -> uint32_t {
    return k < n_keys ? bits(vh[k * v_step + d0 + m]) : 0u;
  };
  auto ldp = [&](int k, int n) -> uint32_t {
    return (n < groups && k < n_keys) ? bits(ph[n * n_keys + k]) : 0u;
  };
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < n_keys; k0 += 16) {
    const int k = k0 + tig * 2;
    const uint32_t a0 = ldv(k, gid) | (ldv(k + 1, gid) << 16);
    const uint32_t a1 = ldv(k, gid + 8) | (ldv(k + 1, gid + 8) << 16);
    const uint32_t a2 = ldv(k + 8, gid) | (ldv(k + 9, gid) << 16);
    const uint32_t a3 = ldv(k + 8, gid + 8) | (ldv(k + 9, gid + 8) << 16);
    const uint32_t b0 = ldp(k, gid) | (ldp(k + 1, gid) << 16);
    const uint32_t b1 = ldp(k + 8, gid) | (ldp(k + 9, gid) << 16);
    MEMEXEC_MMA_K16(c, a0, a1, a2, a3, b0, b1);
  }
  for (int e = 0; e < 4; e++) {
    const int m = gid + (e >= 2 ? 8 : 0);
    const int n = tig * 2 + (e & 1);
    if (n < groups) {
      oh[n * D + d0 + m] = static_cast<T>(c[e]);
    }
  }
  return;
}

// CUDA cores: each element is Y partial sums, partial y over runs of `run` consecutive keys at
// run * y, run * (y + Y), ... (the halves: Y = 2, one run each), then a tree with falling
// offsets. Thread (warp y, lane) sums partial y of dim d_base + lane for every group; the
// partials meet in shared memory and one thread per group combines them.
__shared__ float s_part[MAX_GROUPS][32][33];
int parts;
int run;
if (n_keys <= HALVES_MAX) {
  parts = 2;
  run = (n_keys + 1) / 2;
} else if (n_keys <= NSP_MAX) {
  parts = 32;
  run = 4;
} else {
  parts = STRIDED_Y;
  run = min(STRIDED_V, (n_keys + STRIDED_Y - 1) / STRIDED_Y);
}
const int d = d_base + lane;
float acc[MAX_GROUPS];
for (int n = 0; n < MAX_GROUPS; n++) {
  acc[n] = 0.f;
}
if (warp < parts) {
  for (int base = run * warp; base < n_keys; base += run * parts) {
    const int end = min(n_keys, base + run);
    for (int k = base; k < end; k++) {
      const float vk = static_cast<float>(vh[k * v_step + d]);
      for (int n = 0; n < MAX_GROUPS; n++) {
        if (n < groups) {
          acc[n] = __fadd_rn(acc[n], __fmul_rn(static_cast<float>(ph[n * n_keys + k]), vk));
        }
      }
    }
  }
  for (int n = 0; n < groups; n++) {
    s_part[n][warp][lane] = acc[n];
  }
}
__syncthreads();
if (warp < groups) {
  float part[32];
  for (int y = 0; y < parts; y++) {
    part[y] = s_part[warp][y][lane];
  }
  for (int off = parts / 2; off >= 1; off /= 2) {
    for (int l = 0; l < off; l++) {
      part[l] = __fadd_rn(part[l], part[l + off]);
    }
  }
  oh[warp * D + d] = static_cast<T>(part[0]);
}
