// A decoder layer's residual update in ONE kernel, computed exactly as MLX 0.32.2's CUDA
// kernels compute the ops it replaces:
//   out = (h + rms_norm(y, w)) [* s]          (MLX: RMSNorm, Add [, Multiply])
//   xn  = rms_norm(out, wn)                    (MLX: RMSNorm; only when HAS_NEXT)
// A Gemma-4 layer does this three times (after attention, after the MLP, after the per-layer
// input branch), so a decode step's 1 + 2 (+ 2) nodes each time become one.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`). MLX writes the signature
// (inputs `h`, `y` with `_shape` / `_strides` / `_ndim`, `w`, `s`, `wn`; output `out` and, with
// HAS_NEXT, `xn`) and the template constants `T` (activation type), `D` (the normalized axis),
// `BLOCK` / `CHUNKS` (MLX's launch for D, see src/model/residual_norm.rs), `EPS_BITS` (the f32
// eps's bits), `HAS_SCALE`, `HAS_NEXT`. memexec prepends `T* xn = nullptr;` when the kernel has
// no `xn` output. Launch: one block of BLOCK threads per row (grid rows * BLOCK).
//
// Each step mirrors MLX (public source, mlx/backend/cuda/rms_norm.cu, `rms_norm_small`, and
// device/binary_ops.cuh): thread t of the block takes N_READS consecutive elements at
// (BLOCK * i + t) * N_READS for i < CHUNKS (zeros past D), sums their f32 squares in that order
// with fma, the block sums with `cg::reduce` per warp then over the warps' sums, the normalizer
// is rsqrt(sum / D + eps), an output element is `w * T(x * normalizer)`; the add and the
// multiply are T's own operations (MLX's `x + y`, `x * y`), each rounded once: explicit `_rn`
// intrinsics keep the roundings whatever NVRTC's flags and stop it fusing a product and an add
// that MLX runs in separate kernels. Each block reads its own row only: a row's bits do not
// depend on the batch.
constexpr int N_READS = 16 / sizeof(T);
constexpr int WARPS = BLOCK / 32;
static_assert(BLOCK % 32 == 0 && BLOCK >= 64, "MLX's small RMSNorm launches 64 or 128 threads");

__shared__ float s_sum[WARPS];
__shared__ float s_sum_next[WARPS];

auto block = cg::this_thread_block();
auto warp = cg::tiled_partition<32>(block);
const int row = blockIdx.x;
const int t = threadIdx.x;
const float eps = __int_as_float(EPS_BITS);

// MLX's BlockBroadcastReduce: every thread gets the block's sum.
auto block_sum = [&](float x, float* tmp) {
  x = cg::reduce(warp, x, cg::plus<float>());
  if (warp.thread_rank() == 0) {
    tmp[warp.meta_group_rank()] = x;
  }
  block.sync();
  x = warp.thread_rank() < warp.meta_group_size() ? tmp[warp.thread_rank()] : 0.f;
  return cg::reduce(warp, x, cg::plus<float>());
};

// Where this row starts in h and y, whatever their layout (MLX's RMSNorm would copy a view
// first; the values are the same).
int64_t h_at = 0, y_at = 0;
for (int a = h_ndim - 2, rest = row; a >= 0; --a) {
  h_at += static_cast<int64_t>(rest % h_shape[a]) * h_strides[a];
  rest /= h_shape[a];
}
for (int a = y_ndim - 2, rest = row; a >= 0; --a) {
  y_at += static_cast<int64_t>(rest % y_shape[a]) * y_strides[a];
  rest /= y_shape[a];
}
const int64_t h_step = h_strides[h_ndim - 1];
const int64_t y_step = y_strides[y_ndim - 1];

// T's own operators with one rounding each, never contracted into an fma (MLX runs the
// norm's product, the add and the multiply as separate kernels).
// (Generic lambdas: the branch for the other types is then never compiled.)
auto mul = [](auto a, auto b) -> T {
  if constexpr (cuda::std::is_same_v<decltype(a), float>) {
    return __fmul_rn(a, b);
  } else {
    return __hmul_rn(a, b);
  }
};
auto add = [](auto a, auto b) -> T {
  if constexpr (cuda::std::is_same_v<decltype(a), float>) {
    return __fadd_rn(a, b);
  } else {
    return __hadd_rn(a, b);
  }
};
// N_READS elements from vector index `vec` of a row at `p` (element step `step`): one 16-byte
// load where the row is contiguous and aligned there, zeros past D (as MLX's load_vector).
auto load = [](const T* p, int64_t step, int vec, T* dst) {
  const int e0 = vec * N_READS;
  const T* at = p + e0 * step;
  if (step == 1 && e0 + N_READS <= D && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
    const uint4 raw = *reinterpret_cast<const uint4*>(at);
    const T* r = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      dst[j] = r[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      dst[j] = e0 + j < D ? at[j * step] : static_cast<T>(0.f);
    }
  }
};
auto store = [](T* p, int vec, const T* src) {
  const int e0 = vec * N_READS;
  T* at = p + e0;
  if (e0 + N_READS <= D && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
    *reinterpret_cast<uint4*>(at) = *reinterpret_cast<const uint4*>(src);
  } else {
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      if (e0 + j < D) {
        at[j] = src[j];
      }
    }
  }
};

alignas(16) T v[CHUNKS][N_READS];
float sum = 0.f;
#pragma unroll
for (int i = 0; i < CHUNKS; ++i) {
  load(y + y_at, y_step, BLOCK * i + t, v[i]);
#pragma unroll
  for (int j = 0; j < N_READS; ++j) {
    const float f = static_cast<float>(v[i][j]);
    sum = __fmaf_rn(f, f, sum);
  }
}
sum = block_sum(sum, s_sum);
const float normalizer = rsqrtf(__fadd_rn(__fdiv_rn(sum, static_cast<float>(D)), eps));

T scale = static_cast<T>(1.f);
if constexpr (HAS_SCALE != 0) {
  scale = s[0];
}
float sum_next = 0.f;
T* out_row = out + static_cast<int64_t>(row) * D;
#pragma unroll
for (int i = 0; i < CHUNKS; ++i) {
  alignas(16) T hv[N_READS];
  alignas(16) T wv[N_READS];
  load(h + h_at, h_step, BLOCK * i + t, hv);
  load(w, 1, BLOCK * i + t, wv);
#pragma unroll
  for (int j = 0; j < N_READS; ++j) {
    const T normed = mul(wv[j], static_cast<T>(__fmul_rn(static_cast<float>(v[i][j]), normalizer)));
    T o = add(hv[j], normed);
    if constexpr (HAS_SCALE != 0) {
      o = mul(o, scale);
    }
    // Past D the inputs were zeros and so is o: the next norm's sum adds nothing there.
    v[i][j] = o;
    const float f = static_cast<float>(o);
    sum_next = __fmaf_rn(f, f, sum_next);
  }
  store(out_row, BLOCK * i + t, v[i]);
}

if constexpr (HAS_NEXT != 0) {
  sum_next = block_sum(sum_next, s_sum_next);
  const float normalizer_next =
      rsqrtf(__fadd_rn(__fdiv_rn(sum_next, static_cast<float>(D)), eps));
  T* xn_row = xn + static_cast<int64_t>(row) * D;
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    alignas(16) T wv[N_READS];
    alignas(16) T xv[N_READS];
    load(wn, 1, BLOCK * i + t, wv);
#pragma unroll
    for (int j = 0; j < N_READS; ++j) {
      xv[j] = mul(wv[j], static_cast<T>(__fmul_rn(static_cast<float>(v[i][j]), normalizer_next)));
    }
    store(xn_row, BLOCK * i + t, xv);
  }
}
