// x W^T for up to 8 rows of a batch in ONE kernel, each row's bits exactly those of MLX CUDA's
// one-row quantized product (`qmv_kernel`, mlx/backend/cuda/quantized/qmm/qmv.cu, MLX 0.32.2):
// the same split of the inputs over the lanes of a warp, the same per-lane accumulators in
// the same type and rounding, the same order of their sum and the same warp reduction. MLX
// runs that kernel only below 8 rows (from 8 rows on it switches to a tiled product whose sums
// run in another order), so without this kernel a batch of 8 or more rows had to be cut into
// chunks of at most 7, each a product node plus a split and a concatenation.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`). MLX writes the signature
// (`x`, `w`, `scales`, `biases` with `x_shape` / `w_shape` / `scales_shape`, output `out`),
// the template constants `T` (element type) and `GROUP` (group size), and its default header
// (cooperative groups as `cg`); memexec's header (quantized_rows_header.cuh) adds
// `<cooperative_groups/reduce.h>` and the paired-accumulator helpers.
// Launch: grid (ceil(n / 8) * 32, ceil(rows / 8) * 8, 1) threads, threadgroup (32, 8, 1): one
// warp per output column, eight columns per block, one block row per 8 input rows; the warp
// dequantizes its column's weights once for all of its rows. x `[rows, ..., k]` row
// contiguous (leading dims flattened); w `[n, k / 8]` uint32 (4-bit); scales / biases
// `[n, k / GROUP]` of `T`; out `[rows, ..., n]`.
//
// MLX's per-lane step for the lane's EPT consecutive inputs at `idx` (4-bit weights q):
//   w_dq = T(fma(q, scale, bias))      (f32 fma, one rounding to T)
//   acc  = fma(x, w_dq, acc)           (accumulators of type T: `fma.rn` of a 2-byte T)
// then the lane's accumulators are summed in f32 in order, and the warp's sums by `cg::reduce`.
// Found by trial against MLX's kernel on the H200 (scripts/gpu/quantized_rows.py): a
// dequantization rounded after the product (`T(q * s) + b`) or f32 accumulators agree in
// only ~30-40% of elements; this form in 100%.
// The kernel keeps accumulators 2j and 2j + 1 in one register and updates both with one
// paired fma (`fma.rn.bf16x2`: each half rounded once, as the scalar fma), and converts two
// dequantized weights with one paired conversion (each rounded to nearest): the same bits in
// about half the instructions, and half the registers for the 8 rows x 16 accumulators. On
// the H200 that took a product of 8 rows from 136 to 89 us (20480 x 2560) and the output head
// from 1877 to 1154 us (benchmarks/2026-12-01-h200-session14/).
constexpr int ROWS = 8;
constexpr int COLS_PER_BLOCK = 8;
constexpr int WROWS = 4;
constexpr int WCOLS = 2;
constexpr int EPT = sizeof(T) <= 2 ? 16 : 8;
constexpr int WARP_ELEMS = 32 * EPT;

auto warp = cg::tiled_partition<32>(cg::this_thread_block());
const int n = w_shape[0];
const int groups = scales_shape[1];
const int k = groups * GROUP;
const int lane = threadIdx.x;
// Warp y takes rows (y / 4) * 4 .. + 3 of the block's 8 and columns (y % 4) * 2, + 1 of its 8:
// each input read serves two columns (half the reads of one column per warp).
const int wr0 = (threadIdx.y / (COLS_PER_BLOCK / WCOLS)) * WROWS;
const int col0 = blockIdx.x * COLS_PER_BLOCK + (threadIdx.y % (COLS_PER_BLOCK / WCOLS)) * WCOLS;
int m = 1;
for (int d = 0; d + 1 < x_ndim; ++d) {
  m *= x_shape[d];
}
const int row0 = blockIdx.y * ROWS;
const int rows = min(ROWS, m - row0);
const int wrows = min(WROWS, rows - wr0);
const bool active = col0 < n && wrows > 0;
const T* xb = x + static_cast<int64_t>(row0) * k;
const bool vec = reinterpret_cast<size_t>(x) % 16 == 0 && reinterpret_cast<size_t>(w) % 8 == 0;

struct Weights {
  unsigned int words[EPT / 8];
  T s, b;
};
auto load_weights = [&](int c, int idx, Weights& o) {
  const int col = min(col0 + c, n - 1);
  const unsigned char* wc = reinterpret_cast<const unsigned char*>(w) + static_cast<int64_t>(col) * (k / 2);
  o.s = scales[static_cast<int64_t>(col) * groups + idx / GROUP];
  o.b = biases[static_cast<int64_t>(col) * groups + idx / GROUP];
  if (vec) {
    if constexpr (EPT == 16) {
      const uint2 p = *reinterpret_cast<const uint2*>(wc + idx / 2);
      o.words[0] = p.x;
      o.words[1] = p.y;
    } else {
      o.words[0] = *reinterpret_cast<const unsigned int*>(wc + idx / 2);
    }
  } else {
#pragma unroll
    for (int j = 0; j < EPT / 8; ++j) {
      const unsigned char* p = wc + idx / 2 + 4 * j;
      o.words[j] = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<unsigned int>(p[3]) << 24);
    }
  }
};

using T2 = decltype(memexec_cvt2(T(0.0f), 0.0f, 0.0f));
T2 sums[WCOLS][WROWS][EPT / 2];
#pragma unroll
for (int c = 0; c < WCOLS; ++c) {
#pragma unroll
  for (int r = 0; r < WROWS; ++r) {
#pragma unroll
    for (int j = 0; j < EPT / 2; ++j) {
      sums[c][r][j] = memexec_cvt2(T(0.0f), 0.0f, 0.0f);
    }
  }
}

constexpr int CHUNK = 16 / sizeof(T);
constexpr int CHUNKS = ROWS * 2 * 32;
constexpr int PER_THREAD = CHUNKS / (32 * COLS_PER_BLOCK);
__shared__ uint4 xs[2][CHUNKS];
const int tid = threadIdx.y * 32 + lane;
auto stage = [&](int base, uint4 (&regs)[PER_THREAD]) {
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) {
    const int c = tid + i * 32 * COLS_PER_BLOCK;
    const int r = c / 64;
    const int h = (c / 32) % 2;
    const int l = c % 32;
    const int e = base + l * EPT + h * CHUNK;
    regs[i] = make_uint4(0, 0, 0, 0);
    if (r < rows && e < k) {
      const T* src = xb + static_cast<int64_t>(r) * k + e;
      if (vec) {
        regs[i] = *reinterpret_cast<const uint4*>(src);
      } else {
        T* dst = reinterpret_cast<T*>(&regs[i]);
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
          dst[j] = src[j];
        }
      }
    }
  }
};
auto store = [&](int buf, const uint4 (&regs)[PER_THREAD]) {
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) {
    xs[buf][tid + i * 32 * COLS_PER_BLOCK] = regs[i];
  }
};
auto compute = [&](int buf, int idx) {
  T2 wd[WCOLS][EPT / 2];
#pragma unroll
  for (int c = 0; c < WCOLS; ++c) {
    Weights wt;
    load_weights(c, idx, wt);
    memexec_dequant(wt.words, wt.s, wt.b, wd[c]);
  }
#pragma unroll
  for (int r = 0; r < WROWS; ++r) {
    if (r < wrows) {
      alignas(16) T xv[EPT];
      *reinterpret_cast<uint4*>(&xv[0]) = xs[buf][((wr0 + r) * 2) * 32 + lane];
      *reinterpret_cast<uint4*>(&xv[CHUNK]) = xs[buf][((wr0 + r) * 2 + 1) * 32 + lane];
      const T2* xv2 = reinterpret_cast<const T2*>(xv);
#pragma unroll
      for (int c = 0; c < WCOLS; ++c) {
#pragma unroll
        for (int j = 0; j < EPT / 2; ++j) {
          sums[c][r][j] = memexec_fma2(xv2[j], wd[c][j], sums[c][r][j]);
        }
      }
    }
  }
};
const int steps = (k + WARP_ELEMS - 1) / WARP_ELEMS;
uint4 regs[PER_THREAD];
stage(0, regs);
store(0, regs);
__syncthreads();
for (int t = 0; t < steps; ++t) {
  const int idx = lane * EPT + t * WARP_ELEMS;
  if (t + 1 < steps) {
    stage((t + 1) * WARP_ELEMS, regs);
  }
  if (active && idx < k) {
    compute(t & 1, idx);
  }
  if (t + 1 < steps) {
    store((t + 1) & 1, regs);
  }
  __syncthreads();
}

if (!active) {
  return;
}
#pragma unroll
for (int c = 0; c < WCOLS; ++c) {
#pragma unroll
  for (int r = 0; r < WROWS; ++r) {
    if (r < wrows && col0 + c < n) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < EPT / 2; ++j) {
        const float2 p = memexec_float2(sums[c][r][j]);
        sum += p.x;
        sum += p.y;
      }
      sum = cg::reduce(warp, sum, cg::plus<float>());
      if (warp.thread_rank() == 0) {
        out[static_cast<int64_t>(row0 + wr0 + r) * n + col0 + c] = T(sum);
      }
    }
  }
}
