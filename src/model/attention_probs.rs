//! Decode-step attention on MLX CUDA with MLX's own bits in fewer graph nodes.
//!
//! Why: MLX CUDA (0.32.2) has no fused `scaled_dot_product_attention` for Gemma-4's head dims
//! (256 / 512); it decomposes the op into 12 graph nodes (scale, `q k^T`, softmax, `p v` and
//! their reshapes / broadcasts). A decode step is bound by MLX's host work per node, and a
//! batched step attends once per row (MLX CUDA's batched matmuls are not batch-invariant),
//! so that decomposition is ~500 nodes of a one-row e4b step and ~500 more per extra row.
//! `kernels/attention_probs.cu` computes the decomposition's first part — the scaled query,
//! the scores (MLX's `gemv`) and the precise softmax — for every row of a step in ONE node,
//! each step as MLX's kernel computes it (same lanes, reduction order and roundings); the
//! probabilities then meet the values as in the decomposition: in [`super::values_product`]'s
//! kernel (cuBLAS's summation order, all rows in one node) where it covers the key counts,
//! else in MLX's own matmul (4 nodes per row). So a row's output has the bits of MLX's op
//! (mlx-lm's numbers: [`self_check`] compares them at start-up and
//! `scripts/gpu/attention_probs.py` over the e4b's shapes) in a few nodes per step instead of
//! 12 per row.
//!
//! Used for one-position queries without a mask (every decode step) when the model resolved
//! its decode attention to [`super::DecodeAttention::Probs`] at load.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::ops::expand_dims;
use mlx_rs::{Array, Dtype};

use super::precompiled::Kernel;
use crate::error::{Error, Result};

const SOURCE: &str = include_str!("kernels/attention_probs.cu");

/// What the kernel needs beyond MLX's default header (which has `cooperative_groups.h`):
/// `cg::reduce`, MLX's own warp reduction.
const HEADER: &str = "#include <cooperative_groups/reduce.h>\n";

/// Most keys one row may hold (the kernel keeps the scores in shared memory).
pub const MAX_KEYS: i32 = 8192;

/// Rows one kernel call takes at most ([`super::row_kernel::ROWS_PER_CALL`]).
pub const ROWS_PER_CALL: usize = super::row_kernel::ROWS_PER_CALL;

/// Threads per block: CUDA's most, which also covers MLX's widest softmax (1024 threads).
const THREADS: i32 = 1024;

thread_local! {
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// `kernels/attention_probs.cu` without its comment lines.
fn body() -> String {
    super::row_kernel::without_comment_lines(SOURCE)
}

/// The kernel's source for `rows` input rows: a prologue that picks the block's row (inputs
/// `k<r>`, outputs `p<r>`) and defines what `kernels/attention_probs.cu` reads, then that body.
pub fn source(rows: usize) -> String {
    let mut s = String::from(
        "const int heads = q_shape[1];\n\
         const int row = blockIdx.x / heads;\n\
         const int h = blockIdx.x % heads;\n\
         const T* kr;\nT* pr;\nint n_keys, kv_heads;\n\
         int64_t k_head, k_step;\n\
         switch (row) {\n",
    );
    for r in 0..rows {
        s.push_str(&format!(
            "  case {r}: kr = k{r}; pr = p{r}; n_keys = k{r}_shape[2]; kv_heads = k{r}_shape[1];\n\
             \x20   k_head = k{r}_strides[1]; k_step = k{r}_strides[2]; break;\n"
        ));
    }
    s.push_str(
        "  default: return;\n}\n\
         const T* qh = q + row * q_strides[0] + h * q_strides[1];\n\
         T* ph = pr + h * n_keys;\n\
         int* counter = const_cast<int*>(counters) + row * heads + h;\n",
    );
    s.push_str(&body());
    s
}

/// The source of the kernel that reads keys by slot ([`super::slot_attention`]) for `rows`
/// rows: the inputs are the queries `q`, ONE key buffer `kb` `[slots, kv_heads, capacity, D]`,
/// `row_slots` and `row_keys` (int32, each row's slot and key count: MLX gives a kernel the
/// shapes of its inputs, not of its outputs). The prologue points `kr` at the row's slot,
/// which is where the row's view of that slot starts, with the view's strides, so the body
/// reads the same keys at the same addresses.
pub fn source_slots(rows: usize) -> String {
    let mut s = String::from(
        "const int heads = q_shape[1];\n\
         const int row = blockIdx.x / heads;\n\
         const int h = blockIdx.x % heads;\n\
         const int kv_heads = kb_shape[1];\n\
         const int64_t k_head = kb_strides[1];\n\
         const int64_t k_step = kb_strides[2];\n\
         T* pr;\nint n_keys;\n\
         switch (row) {\n",
    );
    for r in 0..rows {
        s.push_str(&format!("  case {r}: pr = p{r}; break;\n"));
    }
    s.push_str(
        "  default: return;\n}\n\
         n_keys = row_keys[row];\n\
         const T* kr = kb + static_cast<int64_t>(row_slots[row]) * kb_strides[0];\n\
         const T* qh = q + row * q_strides[0] + h * q_strides[1];\n\
         T* ph = pr + h * n_keys;\n\
         int* counter = const_cast<int*>(counters) + row * heads + h;\n",
    );
    s.push_str(&body());
    s
}

/// The kernel for calls of `rows` rows that reads keys by slot, and the row count it takes.
fn slots_kernel(rows: usize) -> Result<(usize, Rc<Kernel>)> {
    super::row_kernel::bucket_kernel("memexec_attention_probs_slots", rows, |name, n| {
        let outputs: Vec<String> = (0..n).map(|r| format!("p{r}")).collect();
        let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        Kernel::new(
            name,
            &["q", "kb", "row_slots", "row_keys", "counters"],
            &outputs,
            &source_slots(n),
            HEADER,
            false,
        )
    })
}

/// The kernel for calls of `rows` rows and the row count it takes.
fn kernel(rows: usize) -> Result<(usize, Rc<Kernel>)> {
    super::row_kernel::bucket_kernel("memexec_attention_probs", rows, |name, n| {
        let inputs: Vec<String> = std::iter::once("q".to_string())
            .chain((0..n).map(|r| format!("k{r}")))
            .chain(std::iter::once("counters".to_string()))
            .collect();
        let outputs: Vec<String> = (0..n).map(|r| format!("p{r}")).collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        Kernel::new(name, &inputs, &outputs, &source(n), HEADER, false)
    })
}

/// `[rows, heads, 1, D]` queries, row `r` over `kv[r]`'s `[1, kv_heads, S_r, D]` keys /
/// values, no mask: the attention output `[rows, heads, 1, D]` with the bits of MLX's
/// `scaled_dot_product_attention` of each row alone. `None` when a shape is not the kernel's
/// (the caller uses MLX's op).
pub fn attend_rows(q: &Array, kv: &[(&Array, &Array)], scale: f32) -> Result<Option<Array>> {
    let Some((heads, d)) = super::attention::decode_rows_fit(q, kv, 128, MAX_KEYS) else {
        return Ok(None);
    };
    // Keys stored row by row, as MLX's gemv reads them without a copy (the caches' are).
    if !kv
        .iter()
        .all(|(k, _)| k.strides().get(2) == Some(&(d as usize)))
    {
        return Ok(None);
    }
    let mut outs = Vec::with_capacity(kv.len());
    for (qc, chunk) in super::attention::row_calls(q, kv, ROWS_PER_CALL)? {
        let ps = probabilities(&qc, chunk, scale)?;
        let vs: Vec<&Array> = chunk.iter().map(|(_, v)| *v).collect();
        // The decomposition's last steps: `matmul(p, expand_dims(v, 2))` (one kernel node for
        // all rows with cuBLAS's bits where it covers them), then the head groups flattened
        // back into heads (once for all rows, after stacking them: one view node).
        if super::values_product::available() {
            if let Some(o) = super::values_product::product_rows(&ps, &vs)? {
                outs.push(o);
                continue;
            }
        }
        for (p, v) in ps.iter().zip(vs) {
            outs.push(p.matmul(&expand_dims(v, 2)?)?);
        }
    }
    let o = super::attention::stack_rows(outs)?;
    Ok(Some(o.reshape(&[q.dim(0), heads, 1, d])?))
}

/// Keys a block of a split (row, head) scores at most: two per warp.
const KEYS_PER_CHUNK: i32 = 2 * THREADS / 32;

/// Most blocks one (row, head)'s keys are split over.
const MAX_CHUNKS: i32 = 16;

/// Blocks a call aims to fill the GPU with (two of CUDA's largest blocks per SM on an H200).
const TARGET_BLOCKS: i32 = 264;

/// Most heads a split call takes (its counter array holds this many per row); more run one
/// block per head.
const MAX_HEADS: i32 = 64;

/// Counter arrays in the ring [`next_counters`] hands out (2 KB each). Calls that share an
/// array must not run at the same time. MLX runs a stream's CUDA graphs one after another and
/// only a graph's own independent kernels side by side (the row chunks of one layer, the split
/// forwards of `MEMEXEC_ROWS_PER_FORWARD`); a graph holds at most a few hundred nodes
/// (`MLX_MAX_OPS_PER_BUFFER`) and each call comes with a layer's ~25 other nodes, so calls this
/// many apart are never in one graph.
const COUNTER_RING: usize = 256;

/// Counters per array: one per (row, head) of a call.
const COUNTER_SLOTS: i32 = ROWS_PER_CALL as i32 * MAX_HEADS;

thread_local! {
    /// The counter ring (made on first use, all zeros) and the next array to hand out.
    static COUNTERS: RefCell<(Vec<Array>, usize)> = const { RefCell::new((Vec::new(), 0)) };
}

/// Blocks each (row, head) of a call is split over: enough blocks to fill the GPU, each
/// scoring at least [`KEYS_PER_CHUNK`] keys of the longest row.
fn chunks(rows: i32, heads: i32, most_keys: i32) -> i32 {
    if heads > MAX_HEADS {
        return 1;
    }
    let by_keys = (most_keys + KEYS_PER_CHUNK - 1) / KEYS_PER_CHUNK;
    let by_blocks = TARGET_BLOCKS / (rows * heads).max(1);
    by_keys.min(by_blocks).clamp(1, MAX_CHUNKS)
}

/// The next array of arrival counters (int32, zero between calls: the kernel's last block of
/// each (row, head) resets its counter).
fn next_counters() -> Result<Array> {
    COUNTERS.with(|c| {
        let mut c = c.borrow_mut();
        if c.0.is_empty() {
            let ring = (0..COUNTER_RING)
                .map(|_| mlx_rs::ops::zeros_dtype(&[COUNTER_SLOTS], Dtype::Int32))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            mlx_rs::transforms::eval(&ring)?;
            c.0 = ring;
        }
        let at = c.1 % c.0.len();
        c.1 = at + 1;
        Ok(c.0[at].clone())
    })
}

/// One kernel call over at most [`ROWS_PER_CALL`] rows: row `r`'s probabilities
/// `[1, kv_heads, heads / kv_heads, 1, S_r]`. Every block gets CUDA's most threads: the
/// scores take one warp per key, and a decode step's host work does not grow with them.
fn probabilities(q: &Array, kv: &[(&Array, &Array)], scale: f32) -> Result<Vec<Array>> {
    let first = kv
        .first()
        .ok_or_else(|| Error::Internal("attention probabilities: no rows".into()))?;
    let (slots, kernel) = kernel(kv.len())?;
    let mut inputs: Vec<&Array> = Vec::with_capacity(1 + slots);
    inputs.push(q);
    for r in 0..slots {
        inputs.push(kv.get(r).unwrap_or(first).0);
    }
    let keys: Vec<(i32, i32)> = kv.iter().map(|(k, _)| (k.dim(1), k.dim(2))).collect();
    launch(&kernel, slots, inputs, q, &keys, scale)
}

/// [`probabilities`] for rows that read their keys from slots of one buffer `keys`
/// (`[slots, kv_heads, capacity, D]`): row `r` scores the first `visible[r]` positions of slot
/// `row_slots[r]`, as [`probabilities`] scores the view of them (`row_slots`, `row_keys`:
/// int32 `[rows]` arrays of the slots and of `visible`).
pub(super) fn probabilities_slots(
    q: &Array,
    keys: &Array,
    row_slots: &Array,
    row_keys: &Array,
    visible: &[i32],
    scale: f32,
) -> Result<Vec<Array>> {
    let (slots, kernel) = slots_kernel(visible.len())?;
    let kv_heads = keys.dim(1);
    let rows: Vec<(i32, i32)> = visible.iter().map(|&s| (kv_heads, s)).collect();
    launch(
        &kernel,
        slots,
        vec![q, keys, row_slots, row_keys],
        q,
        &rows,
        scale,
    )
}

/// Runs a probabilities kernel made for `slots` rows on `inputs` (the counters appended):
/// `rows[r]` is row `r`'s (kv_heads, key count); the unused outputs are one element each.
fn launch(
    kernel: &Kernel,
    slots: usize,
    inputs: Vec<&Array>,
    q: &Array,
    rows: &[(i32, i32)],
    scale: f32,
) -> Result<Vec<Array>> {
    let (n, heads, d, dtype) = (q.dim(0), q.dim(1), q.dim(3), q.dtype());
    let shapes: Vec<[i32; 5]> = (0..slots)
        .map(|r| match rows.get(r) {
            Some(&(groups, keys)) => [1, groups, heads / groups, 1, keys],
            None => [1, 1, 1, 1, 1],
        })
        .collect();
    let counters = next_counters()?;
    let mut inputs = inputs;
    inputs.push(&counters);
    let most_keys = rows.iter().map(|&(_, k)| k).max().unwrap_or(1);
    let outputs: Vec<(&[i32], Dtype)> = shapes.iter().map(|s| (&s[..], dtype)).collect();
    let mut out = kernel.apply(
        &inputs,
        &outputs,
        [n * heads * THREADS, chunks(n, heads, most_keys), 1],
        [THREADS, 1, 1],
        &super::attention::kernel_constants(dtype, d, scale, MAX_KEYS),
    )?;
    if out.len() != slots {
        return Err(Error::Internal(format!(
            "attention probabilities: {} outputs",
            out.len()
        )));
    }
    out.truncate(rows.len());
    Ok(out)
}

/// [`attend_rows`] for one row: `[1, heads, 1, D]` queries over `[1, kv_heads, S, D]`.
pub fn attend(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Option<Array>> {
    attend_rows(q, &[(k, v)], scale)
}

/// Whether the kernel runs here and gives MLX's bits ([`self_check`]), asked once per thread;
/// `MEMEXEC_PROBS_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_PROBS_KERNEL",
        "decode attention",
        "MLX's op",
        self_check,
    )
}

/// Runs the kernel against MLX's `scaled_dot_product_attention` on two small cases (head dims
/// 256 and 512, Gemma-4's, so the kernels compiled here are the ones decoding uses): fails
/// where it cannot compile or run (not an MLX CUDA build) or where any element's bits differ
/// (an MLX whose kernels changed).
pub fn self_check() -> Result<()> {
    use mlx_rs::fast::scaled_dot_product_attention;
    use mlx_rs::ops::indexing::TryIndexOp;
    let mut lcg = super::check_values::Lcg::new(0x2545_f491);
    // Keys / values as cache views (a prefix of a longer buffer); MLX's softmax gives 37 keys
    // one warp and 600 keys four.
    for (d, keys) in [(256, 37), (512, 600)] {
        let mut draw = |shape: &[i32]| lcg.bf16(shape, -0.25, 0.5);
        let q = draw(&[1, 8, 1, d])?;
        let k = draw(&[1, 2, keys + 19, d])?.try_index((.., .., 0..keys, ..))?;
        let v = draw(&[1, 2, keys + 19, d])?.try_index((.., .., 0..keys, ..))?;
        let ours = attend(&q, &k, &v, 1.0)?.ok_or_else(|| {
            Error::Internal("attention probabilities: self-check shape rejected".into())
        })?;
        let theirs = scaled_dot_product_attention(&q, &k, &v, 1.0, None, None)?;
        if !ours.eq_values(&theirs)? {
            return Err(Error::Internal(format!(
                "attention probabilities: output differs from MLX's attention (head dim {d})"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::check_values::zeros;

    #[test]
    fn shapes_outside_the_kernel_take_mlx_op() {
        let bf = Dtype::Bfloat16;
        let q = zeros(&[1, 8, 1, 256], bf);
        let kv = zeros(&[1, 2, 10, 256], bf);
        let call = |q: &Array, k: &Array, v: &Array| attend(q, k, v, 1.0).unwrap().is_none();
        // f32 activations (MLX's softmax is not "precise" there) and two-position queries.
        let q32 = zeros(&[1, 8, 1, 256], Dtype::Float32);
        let kv32 = zeros(&[1, 2, 10, 256], Dtype::Float32);
        assert!(call(&q32, &kv32, &kv32));
        assert!(call(&zeros(&[1, 8, 2, 256], bf), &kv, &kv));
        // Head dim not a multiple of 128; more keys than MAX_KEYS; heads not a multiple.
        let q96 = zeros(&[1, 8, 1, 96], bf);
        let kv96 = zeros(&[1, 2, 10, 96], bf);
        assert!(call(&q96, &kv96, &kv96));
        let long = zeros(&[1, 2, MAX_KEYS + 1, 256], bf);
        assert!(call(&q, &long, &long));
        let kv3 = zeros(&[1, 3, 10, 256], bf);
        assert!(call(&q, &kv3, &kv3));
        // A transposed key view (MLX would copy it), evaluated: an unevaluated array reports
        // row-major strides.
        let kt = zeros(&[1, 2, 256, 10], bf)
            .transpose_axes(&[0, 1, 3, 2])
            .unwrap();
        kt.eval().unwrap();
        assert!(call(&q, &kt, &kv));
    }

    #[test]
    fn a_build_without_mlx_cuda_falls_back_to_mlx_op() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        assert!(!available());
    }

    #[test]
    fn a_head_splits_over_more_blocks_only_while_the_gpu_has_room() {
        // One row, 8 heads (e4b): 528 keys -> 9 blocks of <= 64 keys; a short row stays whole.
        assert_eq!(chunks(1, 8, 528), 9);
        assert_eq!(chunks(1, 8, 37), 1);
        // Long rows stop at MAX_CHUNKS; wide calls stop at TARGET_BLOCKS.
        assert_eq!(chunks(1, 8, 8192), MAX_CHUNKS);
        assert_eq!(chunks(8, 8, 528), TARGET_BLOCKS / 64);
        assert_eq!(chunks(8, 64, 8192), 1);
        // More heads than a counter array holds: one block per head.
        assert_eq!(chunks(1, MAX_HEADS + 1, 8192), 1);
    }

    #[test]
    fn each_row_count_gets_the_same_body_after_its_row_switch() {
        let one = source(1);
        let eight = source(8);
        let body = body();
        assert!(one.ends_with(&body) && eight.ends_with(&body));
        assert!(eight.contains("case 7: kr = k7; pr = p7;"));
        assert!(!one.contains("case 1:"));
        // Only comment lines left out: the code is all there.
        assert!(!body.contains("// "));
        assert!(body.contains("cg::reduce(warp, normalizer, plus_op)"));
    }
}
