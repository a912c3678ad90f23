// The attention probabilities of one query position per sequence, for every row of a batch in
// ONE kernel, computed exactly as MLX 0.32.2's CUDA fallback for `scaled_dot_product_attention`
// computes them: p[r, h] = softmax(T(q[r, h] * T(scale)) . K_r[g]^T) (g = h / (heads /
// kv_heads), grouped-query attention), stored in the activation type T. The caller multiplies
// p by the values with MLX's own matmul, as the fallback does, so a row's attention output has
// the fallback's bits (mlx-lm's numbers) while the scaling, both scores and softmax, their
// reshapes and broadcasts (8 of the fallback's 12 graph nodes per row) become one node for the
// whole batch.
//
// Body of an MLX custom kernel (`mlx::core::fast::cuda_kernel`). MLX writes the signature
// (`q`, per row `k<r>` with `_shape` / `_strides`, outputs `p<r>`) and the template constants
// `T` (bf16 / f16), `D` (head dim, a multiple of 128), `SCALE_BITS` (the f32 scale's bits),
// `MAX_KEYS`. memexec prepends a prologue (src/model/attention_probs.rs, `source`) that picks
// this block's row and defines `heads`, `h`, `kv_heads`, `n_keys`, the row's keys `kr` with
// their head / position strides `k_head` / `k_step`, `qh` (this head's query) and `ph` (this
// head's `n_keys` probabilities in the row's output), and `counter`, this block's (row, head)
// arrival counter (an int32 that is 0 between calls). Launch: grid (rows * heads * threads,
// chunks, 1), threadgroup (threads, 1, 1) with threads a multiple of 32 of at least
// `softmax_threads(n_keys)` for every row. (The host adds `#include
// <cooperative_groups/reduce.h>` to MLX's header.)
//
// A (row, head)'s keys are split over `chunks` blocks (blockIdx.y): one block per head would
// leave most of the GPU idle in a one-row step. With more than one chunk each block writes its
// scores to the output, the last block to arrive at the counter (which it resets to 0) reads
// them all back and runs the softmax; with one chunk the scores stay in shared memory. A
// score is computed the same way whichever block computes it, so the bits do not depend on
// the split.
//
// Each step mirrors an MLX kernel (public source, mlx/backend/cuda/):
// - scaling: `multiply(array(scale, T), q)`, one rounding to T;
// - scores: `gemv.cu` (M = 1, keys as the transposed matrix): one warp per key, lane l reads
//   N_PER consecutive elements at N_PER * l + 32 * N_PER * i, f32 `sum += k * q`, then
//   `cg::reduce`; N_PER = 4 when the keys start 4-element aligned (MLX checks its pointers);
// - softmax: `softmax.cu` with precise f32 accumulation over BLOCK_DIM virtual threads (the
//   power of two MLX launches for the row), each taking N_READS consecutive scores per pass, the
//   online normalizer, two-level `cg::reduce`, `__expf`, probabilities times 1 / sum.
// Each block reads one row's arrays only, so a row gets the same bits in any batch.
// Scores each softmax thread takes per pass: 16 bytes' worth, as MLX (8 for bf16 / f16).
constexpr int N_READS = 16 / sizeof(T);
static_assert(D % 128 == 0, "head dim must be a multiple of 128");
static_assert(sizeof(T) == 2, "bf16 / f16 activations only");

__shared__ T s_scores[MAX_KEYS];
__shared__ float s_max[32];
__shared__ float s_norm[32];
__shared__ bool s_last;

auto block = cg::this_thread_block();
auto warp = cg::tiled_partition<32>(block);
const int warp_id = threadIdx.x / 32;
const int warps = blockDim.x / 32;
const int lane = threadIdx.x % 32;
const int g = h / (heads / kv_heads);
const T* kh = kr + g * k_head;
const T scale = static_cast<T>(__int_as_float(SCALE_BITS));
const int chunks = gridDim.y;
const int per_chunk = (n_keys + chunks - 1) / chunks;
const int key_begin = blockIdx.y * per_chunk;
const int key_end = min(n_keys, key_begin + per_chunk);
T* scores = chunks == 1 ? s_scores : ph;

// Scores (gemv.cu's gemv_impl): one warp per key, the scaled query held in registers in the
// order a lane reads it.
#define MEMEXEC_SCORES(NP)                                                              \
  {                                                                                     \
    float qs[D / 32];                                                                   \
    _Pragma("unroll") for (int c = 0, i = 0; c < D; c += 32 * NP) {                     \
      _Pragma("unroll") for (int j = 0; j < NP; ++j, ++i) {                             \
        qs[i] = static_cast<float>(static_cast<T>(scale * qh[c + NP * lane + j]));      \
      }                                                                                 \
    }                                                                                   \
    _Pragma("unroll 4") for (int key = key_begin + warp_id; key < key_end; key += warps) { \
      const T* row_k = kh + key * k_step;                                               \
      float sum = 0.f;                                                                  \
      _Pragma("unroll") for (int c = 0, i = 0; c < D; c += 32 * NP) {                   \
        _Pragma("unroll") for (int j = 0; j < NP; ++j, ++i) {                           \
          sum += static_cast<float>(row_k[c + NP * lane + j]) * qs[i];                  \
        }                                                                               \
      }                                                                                 \
      sum = cg::reduce(warp, sum, cg::plus<float>());                                   \
      if (lane == 0) {                                                                  \
        scores[key] = static_cast<T>(sum);                                              \
      }                                                                                 \
    }                                                                                   \
  }
// MLX takes 4 elements per lane when both pointers are 4-element aligned (its query is a fresh
// buffer: always), else 2, else 1.
const uintptr_t k_addr = reinterpret_cast<uintptr_t>(kr);
if (k_addr % (4 * sizeof(T)) == 0) {
  MEMEXEC_SCORES(4)
} else if (k_addr % (2 * sizeof(T)) == 0) {
  MEMEXEC_SCORES(2)
} else {
  MEMEXEC_SCORES(1)
}
#undef MEMEXEC_SCORES
if (chunks > 1) {
  // The threadFenceReduction pattern: scores visible device-wide before the arrival counts.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    s_last = atomicAdd(counter, 1) == chunks - 1;
  }
  __syncthreads();
  if (!s_last) {
    return;
  }
  if (threadIdx.x == 0) {
    atomicExch(counter, 0);
  }
  __threadfence();
  // Read past this SM's L1, which other blocks' stores do not update.
  const unsigned short* written = reinterpret_cast<const unsigned short*>(ph);
  for (int key = threadIdx.x; key < n_keys; key += blockDim.x) {
    const unsigned short b = __ldcg(written + key);
    s_scores[key] = *reinterpret_cast<const T*>(&b);
  }
}
__syncthreads();

// Softmax (softmax.cu's kernel, precise) over BLOCK_DIM virtual threads.
int block_dim = 32;
while (block_dim < 1024 && block_dim * N_READS < n_keys) {
  block_dim *= 2;
}
const bool active = threadIdx.x < block_dim;
const int passes = (n_keys + block_dim * N_READS - 1) / (block_dim * N_READS);
const float neg_inf = -__int_as_float(0x7f800000);
cg::greater<float> max_op;
cg::plus<float> plus_op;
float prevmax;
float maxval = -3.40282346638528859812e+38f;
float normalizer = 0;
if (active) {
  for (int r = 0; r < passes; r++) {
    float vals[N_READS];
    const int base = (r * block_dim + threadIdx.x) * N_READS;
    for (int i = 0; i < N_READS; i++) {
      vals[i] = base + i < n_keys ? static_cast<float>(s_scores[base + i]) : neg_inf;
    }
    float thread_max = vals[0];
    for (int i = 1; i < N_READS; i++) {
      thread_max = max_op(thread_max, vals[i]);
    }
    prevmax = maxval;
    maxval = max_op(maxval, thread_max);
    normalizer = normalizer * __expf(prevmax - maxval);
    for (int i = 0; i < N_READS; i++) {
      normalizer = normalizer + __expf(vals[i] - maxval);
    }
  }
  prevmax = maxval;
  maxval = cg::reduce(warp, maxval, max_op);
  normalizer = normalizer * __expf(prevmax - maxval);
  normalizer = cg::reduce(warp, normalizer, plus_op);
  prevmax = maxval;
  if (lane == 0) {
    s_max[warp_id] = maxval;
  }
}
__syncthreads();
if (active) {
  maxval = lane < block_dim / 32 ? s_max[lane] : neg_inf;
  maxval = cg::reduce(warp, maxval, max_op);
  normalizer = normalizer * __expf(prevmax - maxval);
  if (lane == 0) {
    s_norm[warp_id] = normalizer;
  }
}
__syncthreads();
if (active) {
  normalizer = lane < block_dim / 32 ? s_norm[lane] : 0.f;
  normalizer = cg::reduce(warp, normalizer, plus_op);
  normalizer = 1 / normalizer;
  for (int r = 0; r < passes; r++) {
    const int base = (r * block_dim + threadIdx.x) * N_READS;
    for (int i = 0; i < N_READS; i++) {
      if (base + i < n_keys) {
        ph[base + i] =
            static_cast<T>(__expf(static_cast<float>(s_scores[base + i]) - maxval) * normalizer);
      }
    }
  }
}
