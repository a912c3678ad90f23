// A decoder layer's query / key / value head norms in ONE kernel, computed exactly as MLX 0.32.2's
// CUDA `RMSNorm` computes each of them:
//   qn = rms_norm(q heads, qw), kn = rms_norm(k heads, kw), vn = rms_norm(v heads)  (no weight)
// where q / k / v are one decode position's projections `[B, 1, heads * D]` (views of the fused
// q/k/v product: any row stride, contiguous within a row) and the outputs are `[B, heads, 1, D]`
// (what `split_heads` + `RMSNorm` give). Three `RMSNorm` nodes (and three reshapes) become one.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`, or memexec's precompiled form of
// it). Inputs `q`, `k`, `v` (their `_strides` read: the row stride), `qw`, `kw`; outputs `qn`,
// `kn`, `vn`; template constants `T`, `D` (head dim), `BLOCK` / `CHUNKS` (MLX's launch for D,
// src/model/residual_norm.rs `mlx_launch`), `EPS_BITS`, `HQ` / `HK` (query / key-value heads).
// Launch: one block of BLOCK threads per head vector, grid B * (HQ + 2 * HK) blocks; block j of a
// row takes query head j, then the key heads, then the value heads.
//
// Each norm mirrors MLX (mlx/backend/cuda/rms_norm.cu, `rms_norm_small`), as
// kernels/residual_norm.cu does: thread t takes N_READS consecutive elements at
// (BLOCK * i + t) * N_READS for i < CHUNKS (zeros past D), sums their f32 squares in that order
// with fma, the block sums per warp with `cg::reduce` and then over the warps' sums, the
// normalizer is rsqrt(sum / D + eps), an element is `w * T(x * normalizer)` with one rounding per
// operation (explicit `_rn` intrinsics: NVRTC must not contract what MLX computes apart). The
// weightless value norm multiplies by nothing (MLX's weight there is 1: the same bits).
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
      dst[e0 + j] = w != nullptr ? mul(wv[j], normed) : normed;
    }
  }
}
