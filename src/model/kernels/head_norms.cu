// A decoder layer's query / key / value head norms in ONE kernel, computed exactly as MLX 0.32.2's
// CUDA `RMSNorm` computes each of them, and with ROPE the queries' and keys' rotation as its
// `RoPE` computes it:
//   qn = rope(rms_norm(q heads, qw)), kn = rope(rms_norm(k heads, kw)), vn = rms_norm(v heads)
// (the value norm has no weight) where q / k / v are one decode position's projections
// `[B, 1, heads * D]` (views of the fused q/k/v product: any row stride, contiguous within a
// row) and the outputs are `[B, heads, 1, D]` (what `split_heads` + `RMSNorm` + `RoPE` give).
// Up to five nodes (and three reshapes) become one.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`, or memexec's precompiled form of
// it). Inputs `q`, `k`, `v` (their `_strides` read: the row stride), `qw`, `kw`, and with ROPE
// `offsets` (int32: each row's position, OFFSET_STRIDE 0 for one shared scalar) and `freqs`
// (f32 per-pair periods when FREQS); outputs `qn`, `kn`, `vn`; template constants `T`, `D`
// (head dim), `BLOCK` / `CHUNKS` (MLX's launch for D, src/model/residual_norm.rs `mlx_launch`),
// `EPS_BITS`, `HQ` / `HK` (query / key-value heads: HK 0 for a layer that only has queries),
// `ROPE`, `FREQS`, `LOG2_BASE_BITS`, `SCALE_BITS`, `OFFSET_STRIDE`, `VARIANT` (below). memexec
// prepends `nullptr` declarations of what a variant of the kernel lacks (`offsets` / `freqs`
// without ROPE, `kn` / `vn` without keys). Launch: one block of BLOCK threads per head vector,
// grid B * (HQ + 2 * HK) blocks; block j of a row takes query head j, then the key heads, then
// the value heads.
//
// Each norm mirrors MLX (mlx/backend/cuda/rms_norm.cu, `rms_norm_small`), as
// kernels/residual_norm.cu does: thread t takes N_READS consecutive elements at
// (BLOCK * i + t) * N_READS for i < CHUNKS (zeros past D), sums their f32 squares in that order
// with fma, the block sums per warp with `cg::reduce` and then over the warps' sums, the
// normalizer is rsqrt(sum / D + eps), an element is `w * T(x * normalizer)` with one rounding per
// operation (explicit `_rn` intrinsics: NVRTC must not contract what MLX computes apart). The
// weightless value norm multiplies by nothing (MLX's weight there is 1: the same bits).
//
// The rotation mirrors MLX's `rope_single` / `rope` kernels (mlx/backend/cuda/rope.cu,
// non-traditional): pair i < D / 2 of a head (elements i and i + D / 2) turns by
// theta = (scale * offset) * inv_freq with inv_freq = exp2(-(i / (D / 2)) * log2(base)), or
// 1.0 / freqs[i] (a double division, as MLX writes it), then
//   x1' = x1 * cos(theta) - x2 * sin(theta),  x2' = x1 * sin(theta) + x2 * cos(theta)
// in f32 from the normed values (T), each rounded to T. MLX's nvcc build may contract those
// products into fmas differently from NVRTC: VARIANT 0 writes the expressions as MLX's source
// does (the compiler's choice), 1 contracts the first product of each, 2 the second, 3 none;
// src/model/head_norms.rs takes the first variant whose bits equal MLX's at load.
constexpr int N_READS = 16 / sizeof(T);
constexpr int WARPS = BLOCK / 32;
constexpr int HEADS = HQ + 2 * HK;
static_assert(BLOCK % 32 == 0 && BLOCK >= 64, "MLX's small RMSNorm launches 64 or 128 threads");

__shared__ float s_sum[WARPS];

auto block = cg::this_thread_block();
auto warp = cg::tiled_partition<32>(block);
const int row = blockIdx.x / HEADS;
const int head = blockIdx.x % HEADS;
const int t = threadIdx.x;
const float eps = __int_as_float(EPS_BITS);

// The head vector this block norms, its weight (none for values) and where it goes.
const T* src;
const T* w = nullptr;
T* dst;
if (head < HQ) {
  src = q + static_cast<int64_t>(row) * q_strides[0] + head * D;
  w = qw;
  dst = qn + (static_cast<int64_t>(row) * HQ + head) * D;
} else if (head < HQ + HK) {
  src = k + static_cast<int64_t>(row) * k_strides[0] + (head - HQ) * D;
  w = kw;
  dst = kn + (static_cast<int64_t>(row) * HK + (head - HQ)) * D;
} else {
  src = v + static_cast<int64_t>(row) * v_strides[0] + (head - HQ - HK) * D;
  dst = vn + (static_cast<int64_t>(row) * HK + (head - HQ - HK)) * D;
}

auto mul = [](auto a, auto b) -> T {
  if constexpr (cuda::std::is_same_v<decltype(a), float>) {
    return __fmul_rn(a, b);
  } else {
    return __hmul_rn(a, b);
  }
};
// N_READS elements from vector index `vec`: one 16-byte load where aligned and inside D, zeros
// past D (as MLX's load_vector).
auto load = [](const T* p, int vec, T* out) {
  const int e0 = vec * N_READS;
  const T* at = p + e0;
  if (e0 + N_READS <= D && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
    const uint4 raw = *reinterpret_cast<const uint4*>(at);
    const T* r = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      out[j] = r[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      out[j] = e0 + j < D ? at[j] : static_cast<T>(0.f);
    }
  }
};

// The rotation of pair (x1, x2) by (c, s): x1' (second = false) or x2' (second = true).
auto turn = [](float x1, float x2, float c, float s, bool second) -> float {
  if constexpr (VARIANT == 1) {
    return second ? __fmaf_rn(x1, s, __fmul_rn(x2, c)) : __fmaf_rn(x1, c, -__fmul_rn(x2, s));
  } else if constexpr (VARIANT == 2) {
    return second ? __fmaf_rn(x2, c, __fmul_rn(x1, s)) : __fmaf_rn(-x2, s, __fmul_rn(x1, c));
  } else if constexpr (VARIANT == 3) {
    return second ? __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c))
                  : __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  } else {
    return second ? x1 * s + x2 * c : x1 * c - x2 * s;
  }
};

alignas(16) T x[CHUNKS][N_READS];
float sum = 0.f;
#pragma unroll
for (int i = 0; i < CHUNKS; ++i) {
  load(src, BLOCK * i + t, x[i]);
#pragma unroll
  for (int j = 0; j < N_READS; ++j) {
    const float f = static_cast<float>(x[i][j]);
    sum = __fmaf_rn(f, f, sum);
  }
}
// MLX's BlockBroadcastReduce: every thread gets the block's sum.
sum = cg::reduce(warp, sum, cg::plus<float>());
if (warp.thread_rank() == 0) {
  s_sum[warp.meta_group_rank()] = sum;
}
block.sync();
sum = warp.thread_rank() < warp.meta_group_size() ? s_sum[warp.thread_rank()] : 0.f;
sum = cg::reduce(warp, sum, cg::plus<float>());
const float normalizer = rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(D)), eps));

// Queries and keys rotate (with ROPE): the normed head goes through shared memory, where each
// thread finds the other element of its pairs.
const bool rotate = ROPE != 0 && head < HQ + HK;
__shared__ T s_head[D];
#pragma unroll
for (int i = 0; i < CHUNKS; ++i) {
  alignas(16) T wv[N_READS];
  if (w != nullptr) {
    load(w, BLOCK * i + t, wv);
  }
  const int e0 = (BLOCK * i + t) * N_READS;
#pragma unroll
  for (int j = 0; j < N_READS; ++j) {
    const T normed = static_cast<T>(__fmul_rn(static_cast<float>(x[i][j]), normalizer));
    if (e0 + j < D) {
      const T o = w != nullptr ? mul(wv[j], normed) : normed;
      if (rotate) {
        s_head[e0 + j] = o;
      } else {
        dst[e0 + j] = o;
      }
    }
  }
}
if constexpr (ROPE != 0) {
  if (rotate) {
    constexpr int HALF = D / 2;
    block.sync();
    const float L = __int_as_float(SCALE_BITS) * static_cast<float>(offsets[row * OFFSET_STRIDE]);
    for (int e = t; e < D; e += BLOCK) {
      const int pair = e < HALF ? e : e - HALF;
      float inv_freq;
      if constexpr (FREQS != 0) {
        inv_freq = 1.0 / freqs[pair];
      } else {
        const float d = static_cast<float>(pair) / static_cast<float>(HALF);
        inv_freq = exp2(-d * __int_as_float(LOG2_BASE_BITS));
      }
      const float theta = L * inv_freq;
      const float costheta = cos(theta);
      const float sintheta = sin(theta);
      const float x1 = static_cast<float>(s_head[pair]);
      const float x2 = static_cast<float>(s_head[pair + HALF]);
      dst[e] = static_cast<T>(turn(x1, x2, costheta, sintheta, e >= HALF));
    }
  }
}
