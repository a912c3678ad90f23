//! The decode attention's values product `p . V` on MLX CUDA with cuBLAS's bits in one graph
//! node per layer.
//!
//! Why: after [`super::attention_probs`] the last step of MLX's decomposed attention is
//! `matmul(p, expand_dims(v, 2))`, which MLX 0.32.2 sends to cublasLt. Each such call costs
//! MLX ~26 us of host time (descriptors, an algorithm query, a pointer-array kernel, a graph
//! capture) where a kernel node costs ~5 us (`scripts/gpu/eval_cost.py`), and a batched step
//! makes one per row and layer: on the H200 that was ~1.1 ms of a one-row e4b step and ~8.6 ms
//! of an eight-row one. `kernels/values_product.cu` computes every row of a step in one node,
//! each element summed in the order of the kernel cuBLAS picks for that row's key count
//! ([`Order`], found with `scripts/gpu/values_order.py`: cublasLt's log for every key count, the
//! summation tree of each kernel it picks, then the kernel checked against cuBLAS on random
//! inputs), so a row's output keeps the decomposition's bits (mlx-lm's numbers).
//!
//! The orders are those of cuBLAS 13.1 on an H200: [`self_check`] compares the kernel with
//! MLX's matmul at start-up at every boundary of the table, so another GPU or cuBLAS that picks
//! other kernels falls back to the matmul (and key counts outside the table always do).
use std::cell::Cell;
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::precompiled::Kernel;
use super::row_kernel::ROWS_PER_CALL;
use crate::error::{Error, Result};
use crate::mlx_ffi::TemplateArg;

const SOURCE: &str = include_str!("kernels/values_product.cu");

/// What the kernel needs beyond MLX's default header: the tensor-core step and a compile-time
/// int for the partial count.
const HEADER: &str = "template <int N> struct MemexecInt { static constexpr int value = N; };\n\
#define MEMEXEC_MMA_K16(c, a0, a1, a2, a3, b0, b1) asm volatile(\
\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, \
{%0,%1,%2,%3};\" : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a0), \"r\"(a1), \
\"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1))\n";

/// Threads per block: 32 dims x 32 partial sums (the kernel's tiling assumes it).
const THREADS: i32 = 1024;

/// The summation order cuBLAS uses for one head dim: which key counts take which kernel.
/// Key counts that are multiples of 8 always take the tensor-core kernel (up to `strided_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    /// Head dim.
    pub d: i32,
    /// Key counts up to this take two contiguous halves (`gemvx<6>`); 0: none.
    pub halves_max: i32,
    /// Then up to this: 32 partials of 4-key runs (`gemvNSP`).
    pub nsp_max: i32,
    /// Then up to this: `strided_y` partials of runs of `min(strided_v, ceil(S / strided_y))`
    /// consecutive keys (`gemvx<9>`).
    pub strided_max: i32,
    /// Partials of the `gemvx<9>` range.
    pub strided_y: i32,
    /// Most consecutive keys per run of the `gemvx<9>` range.
    pub strided_v: i32,
}

/// cuBLAS 13.1's orders on an H200 for Gemma-4's head dims (cublasLt's log over key counts
/// 1..8192, `benchmarks/2026-12-01-h200-session11/`).
pub const ORDERS: [Order; 2] = [
    Order {
        d: 256,
        halves_max: 0,
        nsp_max: 425,
        strided_max: 2571,
        strided_y: 32,
        strided_v: 1,
    },
    Order {
        d: 512,
        halves_max: 46,
        nsp_max: 308,
        strided_max: 1190,
        strided_y: 8,
        strided_v: 64,
    },
];

impl Order {
    /// The order for head dim `d`, if known.
    pub fn for_dim(d: i32) -> Option<&'static Order> {
        ORDERS.iter().find(|o| o.d == d)
    }

    /// Whether the kernel gives cuBLAS's bits for `keys` keys.
    pub fn covers(&self, keys: i32) -> bool {
        (1..=self.strided_max).contains(&keys)
    }

    /// The kernel's template constants (`strided_max` stays on the host: [`product_rows`] only
    /// sends key counts the table covers).
    fn constants(&self) -> [(&'static str, TemplateArg); 6] {
        [
            ("T", TemplateArg::Dtype(Dtype::Bfloat16)),
            ("D", TemplateArg::Int(self.d)),
            ("HALVES_MAX", TemplateArg::Int(self.halves_max)),
            ("NSP_MAX", TemplateArg::Int(self.nsp_max)),
            ("STRIDED_Y", TemplateArg::Int(self.strided_y)),
            ("STRIDED_V", TemplateArg::Int(self.strided_v)),
        ]
    }
}

thread_local! {
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// `kernels/values_product.cu` without its comment lines.
fn body() -> String {
    super::row_kernel::without_comment_lines(SOURCE)
}

/// The kernel's source for `rows` rows: a prologue that picks the block's row (inputs `p<r>`,
/// `v<r>`) and defines what the body reads, then the body.
pub fn source(rows: usize) -> String {
    let mut s = String::from(
        "const int kv_heads = v0_shape[1];\n\
         const int groups = p0_shape[2];\n\
         const int row = blockIdx.x / (kv_heads * (D / 32));\n\
         const T* pr;\nconst T* vr;\nint n_keys;\nint64_t v_head, v_step;\n\
         switch (row) {\n",
    );
    for r in 0..rows {
        s.push_str(&format!(
            "  case {r}: pr = p{r}; vr = v{r}; n_keys = v{r}_shape[2]; v_head = v{r}_strides[1];\n\
             \x20   v_step = v{r}_strides[2]; break;\n"
        ));
    }
    s.push_str("  default: return;\n}\n");
    s.push_str(&body());
    s
}

/// The source of the kernel that reads values by slot ([`super::slot_attention`]) for `rows`
/// rows: inputs `p<r>`, ONE value buffer `vb` `[slots, kv_heads, capacity, D]` and `row_slots`
/// (int32, each row's slot); row `r`'s key count is `p<r>`'s last dim. `vr` points at the
/// row's slot with the buffer's strides: where, and how, the row's view reads it.
pub fn source_slots(rows: usize) -> String {
    let mut s = String::from(
        "const int kv_heads = vb_shape[1];\n\
         const int groups = p0_shape[2];\n\
         const int row = blockIdx.x / (kv_heads * (D / 32));\n\
         const int64_t v_head = vb_strides[1];\n\
         const int64_t v_step = vb_strides[2];\n\
         const T* pr;\nint n_keys;\n\
         switch (row) {\n",
    );
    for r in 0..rows {
        s.push_str(&format!(
            "  case {r}: pr = p{r}; n_keys = p{r}_shape[4]; break;\n"
        ));
    }
    s.push_str(
        "  default: return;\n}\n\
         const T* vr = vb + static_cast<int64_t>(row_slots[row]) * vb_strides[0];\n",
    );
    s.push_str(&body());
    s
}

fn slots_kernel(rows: usize) -> Result<(usize, Rc<Kernel>)> {
    super::row_kernel::bucket_kernel("memexec_values_product_slots", rows, |name, n| {
        let inputs: Vec<String> = (0..n)
            .map(|r| format!("p{r}"))
            .chain(["vb".to_string(), "row_slots".to_string()])
            .collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Kernel::new(name, &inputs, &["o"], &source_slots(n), HEADER, false)
    })
}

fn kernel(rows: usize) -> Result<(usize, Rc<Kernel>)> {
    super::row_kernel::bucket_kernel("memexec_values_product", rows, |name, n| {
        let inputs: Vec<String> = (0..n)
            .map(|r| format!("p{r}"))
            .chain((0..n).map(|r| format!("v{r}")))
            .collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Kernel::new(name, &inputs, &["o"], &source(n), HEADER, false)
    })
}

/// Row `r`'s probabilities `ps[r]` (`[1, kv_heads, groups, 1, S_r]`, row contiguous) times its
/// values `vs[r]` (`[1, kv_heads, S_r, D]`, unit last stride): `[rows, kv_heads, groups, 1, D]`
/// with the bits of MLX's `matmul(p, expand_dims(v, 2))` of each row, in calls of at most
/// [`ROWS_PER_CALL`] rows. `None` where a row is not the kernel's (the caller uses the matmul).
pub fn product_rows(ps: &[Array], vs: &[&Array]) -> Result<Option<Array>> {
    let Some(first) = vs.first() else {
        return Ok(None);
    };
    let d = first.dim(-1);
    let Some(order) = Order::for_dim(d) else {
        return Ok(None);
    };
    let fits = |(p, v): (&Array, &&Array)| {
        let (&[1, kv, groups, 1, keys], &[1, kv_v, keys_v, dv]) = (p.shape(), v.shape()) else {
            return false;
        };
        kv == kv_v
            && keys == keys_v
            && dv == d
            && (1..=8).contains(&groups)
            && order.covers(keys)
            && p.dtype() == Dtype::Bfloat16
            && v.dtype() == Dtype::Bfloat16
            && v.strides().last() == Some(&1)
    };
    if ps.len() != vs.len() || !ps.iter().zip(vs).all(fits) {
        return Ok(None);
    }
    let (kv, groups) = (first.dim(1), ps[0].dim(2));
    if ps.iter().any(|p| p.dim(1) != kv || p.dim(2) != groups) {
        return Ok(None);
    }
    let mut outs = Vec::new();
    for (pc, vc) in ps.chunks(ROWS_PER_CALL).zip(vs.chunks(ROWS_PER_CALL)) {
        let (slots, kernel) = kernel(pc.len())?;
        let mut inputs: Vec<&Array> = Vec::with_capacity(2 * slots);
        inputs.extend((0..slots).map(|r| pc.get(r).unwrap_or(&pc[0])));
        inputs.extend((0..slots).map(|r| *vc.get(r).unwrap_or(&vc[0])));
        outs.push(launch(&kernel, &inputs, pc, order)?);
    }
    Ok(Some(super::attention::stack_rows(outs)?))
}

/// [`product_rows`] for at most [`ROWS_PER_CALL`] rows whose values are slots of one buffer
/// `values` (`[slots, kv_heads, capacity, D]`, bf16): row `r` multiplies `ps[r]` by the first
/// `S_r` positions of slot `row_slots[r]` (an int32 `[rows]` array). The caller checks what
/// [`product_rows`] checks (`order` is D's, it covers each `S_r`, 1 to 8 groups, bf16).
pub(super) fn product_slots(
    ps: &[Array],
    values: &Array,
    row_slots: &Array,
    order: &Order,
) -> Result<Array> {
    let Some(first) = ps.first() else {
        return Err(Error::Internal("values product: no rows".into()));
    };
    let (slots, kernel) = slots_kernel(ps.len())?;
    let mut inputs: Vec<&Array> = (0..slots).map(|r| ps.get(r).unwrap_or(first)).collect();
    inputs.extend([values, row_slots]);
    launch(&kernel, &inputs, ps, order)
}

/// Runs a values-product kernel for the rows `ps` (their probabilities) on `inputs`.
fn launch(kernel: &Kernel, inputs: &[&Array], ps: &[Array], order: &Order) -> Result<Array> {
    let p0 = ps
        .first()
        .ok_or_else(|| Error::Internal("values product: no rows".into()))?;
    let (kv, groups) = (p0.dim(1), p0.dim(2));
    let (rows, d) = (ps.len() as i32, order.d);
    let shape = [rows, kv, groups, 1, d];
    let mut out = kernel.apply(
        inputs,
        &[(&shape[..], Dtype::Bfloat16)],
        [rows * kv * (d / 32) * THREADS, 1, 1],
        [THREADS, 1, 1],
        &order.constants(),
    )?;
    out.pop()
        .ok_or_else(|| Error::Internal("values product: the kernel made no output".into()))
}

/// Whether the kernel runs here and gives cuBLAS's bits ([`self_check`]), asked once per
/// thread; `MEMEXEC_VALUES_KERNEL=0` says no without asking.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_VALUES_KERNEL",
        "attention values product",
        "MLX's matmul",
        self_check,
    )
}

/// Whether `decode_attention`'s decode steps run this kernel (where their key counts are in the
/// table): the probabilities kernel feeds it, and [`available`] says yes. What `memexec bench`
/// and `memexec graph` report.
pub fn used_with(decode_attention: super::DecodeAttention) -> bool {
    decode_attention == super::DecodeAttention::Probs && available()
}

/// The key counts [`self_check`] tries for `order`: both ends of every range of the table
/// (where another GPU's heuristic would most likely pick differently), a few small counts and
/// a multiple of 8.
fn check_keys(order: &Order) -> Vec<i32> {
    let mut keys = vec![1, 2, 3, 16];
    // The last range's runs stop growing at strided_v keys.
    let capped = order.strided_v * order.strided_y;
    for end in [order.halves_max, order.nsp_max, capped, order.strided_max] {
        keys.extend([end - 1, end, end + 1]);
    }
    keys.retain(|&k| order.covers(k));
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Runs the kernel against MLX's matmul for both head dims at `check_keys`, the key counts as
/// the rows of calls of up to [`ROWS_PER_CALL`] (so the row switch is checked too): fails where
/// it cannot compile or run (not an MLX CUDA build) or where any element's bits differ.
pub fn self_check() -> Result<()> {
    use mlx_rs::ops::expand_dims;
    use mlx_rs::ops::indexing::TryIndexOp;
    let mut lcg = super::check_values::Lcg::new(0x5eed_0b1e);
    for order in &ORDERS {
        let d = order.d;
        let keys = check_keys(order);
        let mut ps = Vec::new();
        let mut vs = Vec::new();
        for &s in &keys {
            let raw = lcg.bf16(&[1, 2, 4, 1, s], 0.0, 1.0)?;
            // Probabilities-like values: positive, summing to about one.
            ps.push(
                raw.multiply(Array::from_f32(2.0 / s as f32))?
                    .as_dtype(Dtype::Bfloat16)?,
            );
            // Values as a cache view: a prefix of a longer buffer.
            vs.push(
                lcg.bf16(&[1, 2, s + 9, d], -1.0, 2.0)?
                    .try_index((.., .., 0..s, ..))?,
            );
        }
        let vrefs: Vec<&Array> = vs.iter().collect();
        let ours = product_rows(&ps, &vrefs)?
            .ok_or_else(|| Error::Internal("values product: self-check rows rejected".into()))?;
        for (r, (p, v)) in ps.iter().zip(&vs).enumerate() {
            let theirs = p.matmul(&expand_dims(v, 2)?)?;
            let row = ours.try_index(r as i32..r as i32 + 1)?;
            if !row.eq_values(&theirs)? {
                return Err(Error::Internal(format!(
                    "values product: differs from MLX's matmul (head dim {d}, {} keys)",
                    keys[r]
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::check_values::zeros;

    #[test]
    fn rows_outside_the_table_take_the_matmul() {
        let bf = Dtype::Bfloat16;
        let p = zeros(&[1, 2, 4, 1, 10], bf);
        let call = |p: &Array, v: &Array| {
            product_rows(std::slice::from_ref(p), &[v])
                .unwrap()
                .is_none()
        };
        // An unknown head dim; too many keys; f32; mismatched keys.
        assert!(call(&p, &zeros(&[1, 2, 10, 128], bf)));
        let long = 2572;
        assert!(call(
            &zeros(&[1, 2, 4, 1, long], bf),
            &zeros(&[1, 2, long, 256], bf)
        ));
        assert!(call(
            &zeros(&[1, 2, 4, 1, 10], Dtype::Float32),
            &zeros(&[1, 2, 10, 256], Dtype::Float32)
        ));
        assert!(call(&p, &zeros(&[1, 2, 11, 256], bf)));
    }

    #[test]
    fn rows_inside_the_table_take_the_kernel() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well run here
        }
        // Accepted, so the kernel is applied, which a CPU build cannot do.
        let bf = Dtype::Bfloat16;
        let ps = [zeros(&[1, 2, 4, 1, 10], bf), zeros(&[1, 2, 4, 1, 700], bf)];
        let (v1, v2) = (zeros(&[1, 2, 10, 512], bf), zeros(&[1, 2, 700, 512], bf));
        assert!(product_rows(&ps, &[&v1, &v2]).is_err());
    }

    #[test]
    fn the_table_covers_what_it_says() {
        let o256 = Order::for_dim(256).unwrap();
        assert!(o256.covers(1) && o256.covers(425) && o256.covers(2571));
        assert!(!o256.covers(0) && !o256.covers(2572));
        let o512 = Order::for_dim(512).unwrap();
        assert!(o512.covers(46) && o512.covers(309) && o512.covers(1190) && !o512.covers(1191));
        assert!(Order::for_dim(128).is_none());
        let keys = check_keys(o512);
        assert!(keys.contains(&46) && keys.contains(&47) && keys.contains(&1190));
        assert!(keys.contains(&309) && !keys.contains(&1191));
    }

    #[test]
    fn a_build_without_mlx_cuda_falls_back_to_the_matmul() {
        if !crate::model::check_values::linux_cpu_build() {
            return;
        }
        assert!(self_check().is_err());
        assert!(!available());
    }

    #[test]
    fn each_row_count_gets_the_same_body() {
        let body = body();
        assert!(source(1).ends_with(&body) && source(8).ends_with(&body));
        assert!(source(8).contains("case 7: pr = p7; vr = v7;"));
        assert!(!body.contains("// "));
    }
}
