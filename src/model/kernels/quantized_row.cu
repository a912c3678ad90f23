// x W^T for ONE input row, with the bits of MLX CUDA's one-row quantized product (`qmv_kernel`,
// mlx/backend/cuda/quantized/qmm/qmv.cu, MLX 0.32.2), in less device time.
//
// Why: a serial decode step's products run through `qmv` (about half of the step on an H100,
// session 38), and `qmv` reaches under 1 TB/s: each warp computes one column with one 256-byte
// load of weights in flight at a time, and reads 32 bytes of x per lane for every 8 bytes of
// weights. This kernel keeps every column's arithmetic exactly as `qmv` has it (lane l takes the
// EPT consecutive inputs at l * EPT + t * 32 * EPT for t = 0, 1, ...; per-lane accumulators of
// type T updated by `fma(x, T(fma(q, scale, bias)), acc)`; the lane's accumulators summed in
// f32 in order; the warp's sums by `cg::reduce`), and changes only what is in flight:
//   - a warp takes COLS columns, so each x chunk a lane reads serves COLS columns;
//   - the loads of UNROLL steps (x chunks, weight words, scales, biases) are issued before
//     the first of those steps is computed.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`): MLX writes the signature
// (`x`, `w`, `scales`, `biases` with their `_shape`s and `x_ndim`; output `out`), the template
// constants `T`, `GROUP`, `COLS`, `UNROLL`, and its default header; memexec's header
// (quantized_rows_header.cuh, shared with the rows kernel) adds `cg::reduce` and the paired
// accumulator and dequantization helpers.
// Launch: threadgroup (32, WARPS, 1), grid (ceil(n / (WARPS * COLS)) * 32, WARPS, 1) threads:
// warp y of block b takes columns (b * WARPS + y) * COLS .. + COLS - 1. x `[..., k]` with one
// row (leading dims of size 1), row contiguous; w `[n, k / 8]` uint32 (4-bit); scales / biases
// `[n, k / GROUP]` of `T`; out `[..., n]`.
constexpr int EPT = sizeof(T) <= 2 ? 16 : 8;
constexpr int WARP_ELEMS = 32 * EPT;
// 4-bit words per lane per step, and 16-byte x chunks per lane per step (32 bytes for every T).
constexpr int NW = EPT / 8;
constexpr int XCHUNKS = EPT * sizeof(T) / 16;

auto warp = cg::tiled_partition<32>(cg::this_thread_block());
const int n = w_shape[0];
const int groups = scales_shape[1];
const int k = groups * GROUP;
const int lane = threadIdx.x;
const int col0 = (blockIdx.x * blockDim.y + threadIdx.y) * COLS;
if (col0 >= n) {
  return;
}
const bool vec = reinterpret_cast<size_t>(x) % 16 == 0 && reinterpret_cast<size_t>(w) % 8 == 0;
const int64_t row_bytes = k / 2;

using T2 = decltype(memexec_cvt2(T(0.0f), 0.0f, 0.0f));
T2 sums[COLS][EPT / 2];
#pragma unroll
for (int c = 0; c < COLS; ++c) {
#pragma unroll
  for (int j = 0; j < EPT / 2; ++j) {
    sums[c][j] = memexec_cvt2(T(0.0f), 0.0f, 0.0f);
  }
}

// Steps of WARP_ELEMS inputs, the last one partial when k is not a multiple (its lanes past k
// idle): the per-lane order of fmas of MLX's loop and its remainder step.
const int steps = (k + WARP_ELEMS - 1) / WARP_ELEMS;
for (int t0 = 0; t0 < steps; t0 += UNROLL) {
  uint4 xq[UNROLL][XCHUNKS];
  unsigned words[UNROLL][COLS][NW];
  T sc[UNROLL][COLS];
  T bi[UNROLL][COLS];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int idx = lane * EPT + (t0 + u) * WARP_ELEMS;
    if (t0 + u < steps && idx < k) {
      if (vec) {
#pragma unroll
        for (int h = 0; h < XCHUNKS; ++h) {
          xq[u][h] = *reinterpret_cast<const uint4*>(x + idx + h * (16 / sizeof(T)));
        }
      } else {
        T* dst = reinterpret_cast<T*>(&xq[u][0]);
#pragma unroll
        for (int e = 0; e < EPT; ++e) {
          dst[e] = x[idx + e];
        }
      }
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const int col = min(col0 + c, n - 1);
        const unsigned char* wc = reinterpret_cast<const unsigned char*>(w) + col * row_bytes + idx / 2;
        sc[u][c] = scales[static_cast<int64_t>(col) * groups + idx / GROUP];
        bi[u][c] = biases[static_cast<int64_t>(col) * groups + idx / GROUP];
        if (vec) {
          if constexpr (NW == 2) {
            const uint2 p = *reinterpret_cast<const uint2*>(wc);
            words[u][c][0] = p.x;
            words[u][c][1] = p.y;
          } else {
            words[u][c][0] = *reinterpret_cast<const unsigned int*>(wc);
          }
        } else {
#pragma unroll
          for (int j = 0; j < NW; ++j) {
            const unsigned char* p = wc + 4 * j;
            words[u][c][j] = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<unsigned int>(p[3]) << 24);
          }
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int idx = lane * EPT + (t0 + u) * WARP_ELEMS;
    if (t0 + u < steps && idx < k) {
      const T2* xv2 = reinterpret_cast<const T2*>(&xq[u][0]);
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        T2 wd[EPT / 2];
        memexec_dequant(words[u][c], sc[u][c], bi[u][c], wd);
#pragma unroll
        for (int j = 0; j < EPT / 2; ++j) {
          sums[c][j] = memexec_fma2(xv2[j], wd[j], sums[c][j]);
        }
      }
    }
  }
}

#pragma unroll
for (int c = 0; c < COLS; ++c) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < EPT / 2; ++j) {
    const float2 p = memexec_float2(sums[c][j]);
    sum += p.x;
    sum += p.y;
  }
  sum = cg::reduce(warp, sum, cg::plus<float>());
  if (warp.thread_rank() == 0 && col0 + c < n) {
    out[col0 + c] = T(sum);
  }
}
