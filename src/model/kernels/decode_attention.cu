// One query position per sequence attending over that sequence's cached keys / values, for
// every row of a batch in ONE kernel: out[r, h] = softmax(q[r, h] . K_r[g]^T * scale) . V_r[g]
// for each row r and query head h (one block per (r, h); g = h / (heads / kv_heads),
// grouped-query attention).
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`). MLX writes the signature
// (`q`, per row `k<r>` / `v<r>` with their `_shape` / `_strides`, output `out`) and the
// template constants `T` (element type: bf16 or f16), `D` (head dim, a multiple of 256), `SCALE_BITS` (the
// f32 scale's bits), `MAX_KEYS`. memexec prepends a prologue (src/model/decode_attention.rs,
// `source`) that picks this block's row and defines `heads`, `h`, `kv_heads`, `n_keys`, the
// row's `kr` / `vr` and their head / position strides, `qh` (this head's query) and `oh` (its
// output). Launch: grid (rows * heads * 256, 1, 1), threadgroup (256, 1, 1); q
// `[rows, heads, 1, D]`; row r's k / v `[1, kv_heads, S_r, D]` with unit last stride (cache
// views: any head / position strides), S_r <= MAX_KEYS; out `[rows, heads, 1, D]`.
//
// It rounds where MLX's decomposed attention (its CUDA fallback for these head dims) stores
// an array: the scaled query, the scores and the probabilities are `T`; sums are f32; the
// softmax is MLX's (`__expf`, times the reciprocal of the sum). Summation ORDER differs from
// MLX's matmuls, so results can differ from MLX's attention by an ulp of `T`. What matters
// for batching: each block computes one head of one row from that row's arrays alone, with
// the same code at any row count, so a row gets the same bits whatever else is in the batch.
constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
constexpr int PER_LANE = D / 32;
static_assert(D % 256 == 0, "head dim must be a multiple of 256");
static_assert(sizeof(T) == 2, "16-byte loads below hold 8 elements: bf16 / f16 only");

__shared__ T s_p[MAX_KEYS];
__shared__ float s_red[WARPS];
__shared__ float s_acc[WARPS * D];

const int g = h / (heads / kv_heads);
const int warp = threadIdx.x / 32;
const int lane = threadIdx.x % 32;
const float scale = __int_as_float(SCALE_BITS);

const T* kh = kr + g * k_head;
const T* vh = vr + g * v_head;
// 16-byte loads when every row this block reads starts 16-byte aligned (the usual case:
// MLX buffers are aligned and a row is D elements).
const bool vec = ((reinterpret_cast<uintptr_t>(kh) | reinterpret_cast<uintptr_t>(vh) |
                   (k_step * sizeof(T)) | (v_step * sizeof(T))) & 15) == 0;

auto load = [&](const T* src, float* dst) {
  if (vec) {
#pragma unroll
    for (int c = 0; c < PER_LANE / 8; ++c) {
      uint4 raw = reinterpret_cast<const uint4*>(src)[c];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dst[c * 8 + i] = static_cast<float>(e[i]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      dst[i] = static_cast<float>(src[i]);
    }
  }
};

// The scaled query (MLX multiplies q by the scale in T first).
float qf[PER_LANE];
#pragma unroll
for (int i = 0; i < PER_LANE; ++i) {
  qf[i] = static_cast<float>(
      static_cast<T>(static_cast<float>(qh[lane * PER_LANE + i]) * scale));
}

// Scores: one warp per key, each lane a PER_LANE slice of the head dim.
float x[PER_LANE];
for (int j = warp; j < n_keys; j += WARPS) {
  load(kh + j * k_step + lane * PER_LANE, x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    s += qf[i] * x[i];
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    s += __shfl_xor_sync(0xffffffff, s, off);
  }
  if (lane == 0) {
    s_p[j] = static_cast<T>(s);
  }
}
__syncthreads();

// Softmax over the scores (f32), probabilities stored as T in place.
float m = -__int_as_float(0x7f800000);
for (int j = threadIdx.x; j < n_keys; j += THREADS) {
  m = fmaxf(m, static_cast<float>(s_p[j]));
}
#pragma unroll
for (int off = 16; off > 0; off /= 2) {
  m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, off));
}
if (lane == 0) {
  s_red[warp] = m;
}
__syncthreads();
m = s_red[0];
#pragma unroll
for (int w = 1; w < WARPS; ++w) {
  m = fmaxf(m, s_red[w]);
}
__syncthreads();
float z = 0.f;
for (int j = threadIdx.x; j < n_keys; j += THREADS) {
  z += __expf(static_cast<float>(s_p[j]) - m);
}
#pragma unroll
for (int off = 16; off > 0; off /= 2) {
  z += __shfl_xor_sync(0xffffffff, z, off);
}
if (lane == 0) {
  s_red[warp] = z;
}
__syncthreads();
z = 0.f;
#pragma unroll
for (int w = 0; w < WARPS; ++w) {
  z += s_red[w];
}
const float inv = 1.f / z;
for (int j = threadIdx.x; j < n_keys; j += THREADS) {
  s_p[j] = static_cast<T>(__expf(static_cast<float>(s_p[j]) - m) * inv);
}
__syncthreads();

// Probabilities times values: one warp per key, each lane a slice; warps summed in order.
float acc[PER_LANE];
#pragma unroll
for (int i = 0; i < PER_LANE; ++i) {
  acc[i] = 0.f;
}
#pragma unroll 2
for (int j = warp; j < n_keys; j += WARPS) {
  const float p = static_cast<float>(s_p[j]);
  load(vh + j * v_step + lane * PER_LANE, x);
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    acc[i] += p * x[i];
  }
}
#pragma unroll
for (int i = 0; i < PER_LANE; ++i) {
  s_acc[warp * D + lane * PER_LANE + i] = acc[i];
}
__syncthreads();
for (int d = threadIdx.x; d < D; d += THREADS) {
  float o = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    o += s_acc[w * D + d];
  }
  oh[d] = static_cast<T>(o);
}
