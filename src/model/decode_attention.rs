//! One-kernel attention for decode steps on MLX CUDA.
//!
//! Why: on MLX CUDA (0.32.2) `scaled_dot_product_attention` has no fused kernel for Gemma-4's
//! head dims (256 / 512); it falls back to a decomposition of 12 graph nodes per call (scale,
//! two matmuls, a softmax and their reshapes / broadcasts). A decode step is bound by MLX's
//! host work per node, and a batched step attends once per row (MLX CUDA's batched matmuls are
//! not batch-invariant), so that fallback is ~500 nodes of a one-row e4b step and ~500 more
//! per extra row. `kernels/decode_attention.cu` does one query position of every row of a step
//! (up to [`ROWS_PER_CALL`]) in ONE node, rounding where the fallback stores arrays (scaled
//! query, scores, probabilities in the activation dtype, f32 sums, MLX's softmax); only the
//! order of its f32 sums differs, so it matches MLX's result bit for bit in nearly every
//! element (`scripts/gpu/attention_kernel.py` measures it) — and each block reads one row's
//! arrays only, so a row gets the same bits in any batch.
//!
//! Used for queries of one position with no mask (every decode step: see
//! [`super::cache`]'s masks) when the model loaded with [`DecodeAttention::Kernel`] (opt-in,
//! see [`DecodeAttention::from_env`]); other shapes (prefill, more than [`MAX_KEYS`] keys, head
//! dims that are not a multiple of 256, f32 activations) take MLX's op. The choice is made
//! once per model, so serial and batched steps share it.
use std::cell::RefCell;
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::precompiled::Kernel;
use crate::error::{Error, Result};
use crate::mlx_ffi::kernel_in;

const SOURCE: &str = include_str!("kernels/decode_attention.cu");

/// Most keys one call attends over (the kernel keeps the probabilities in shared memory).
pub const MAX_KEYS: i32 = 8192;

/// Threads per block: 8 warps (the kernel's `WARPS`).
const THREADS: i32 = 256;

/// How a model's decode steps attend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecodeAttention {
    /// MLX's `scaled_dot_product_attention` (mlx-lm's op).
    Mlx,
    /// MLX's op in fewer graph nodes, with its bits: memexec's kernel for the scores and the
    /// softmax of every row ([`super::attention_probs`]), then for the values product where it
    /// has cuBLAS's order ([`super::values_product`]), else MLX's matmul (MLX CUDA builds
    /// only). Where it passes its self-check, the model takes it for [`Self::Mlx`].
    Probs,
    /// memexec's one-node CUDA kernel (MLX CUDA builds only).
    Kernel,
}

impl DecodeAttention {
    /// `MEMEXEC_DECODE_ATTENTION=kernel` asks for the kernel; anything else (or nothing) is
    /// MLX's op, mlx-lm's numeric path. (The engine's configuration `decode_attention`, when
    /// given, wins over the variable.)
    ///
    /// Why the kernel is opt-in: on the H200 it makes decode steps cheaper (a one-row e4b step
    /// 1920 -> 1458 graph nodes, 8 rows 7056 -> 2982) and keeps batched rows identical to
    /// serial ones, but its f32 sums run in another order than MLX's matmuls, so at near-ties
    /// its greedy ids part from mlx-lm's (random-weight e4b: after 8, 5 and 0 of 32 tokens;
    /// `benchmarks/2026-11-30-h200-session7/`). mlx-lm's tokens are memexec's reference.
    pub fn from_env() -> DecodeAttention {
        DecodeAttention::parse(std::env::var("MEMEXEC_DECODE_ATTENTION").ok().as_deref())
    }

    /// The setting a `MEMEXEC_DECODE_ATTENTION` value asks for (`kernel`, any case).
    pub fn parse(value: Option<&str>) -> DecodeAttention {
        match value.map(str::trim) {
            Some(v) if v.eq_ignore_ascii_case("kernel") => DecodeAttention::Kernel,
            _ => DecodeAttention::Mlx,
        }
    }

    /// The attention a model loaded with this setting uses: [`DecodeAttention::Kernel`] when
    /// asked for and it passes [`self_check`] here (else logged); otherwise MLX's numbers, as
    /// [`DecodeAttention::Probs`] on a GPU whose MLX passes that kernel's self-check
    /// ([`super::attention_probs::available`]), else [`DecodeAttention::Mlx`].
    pub fn checked(self, on_cpu: bool) -> DecodeAttention {
        if self == DecodeAttention::Kernel {
            match self_check() {
                Ok(()) => return self,
                Err(e) => {
                    tracing::warn!("decode attention: kernel unavailable ({e}); using MLX's op");
                }
            }
        }
        if !on_cpu && super::attention_probs::available() {
            DecodeAttention::Probs
        } else {
            DecodeAttention::Mlx
        }
    }
}

/// Rows one kernel call takes. One kernel for every batch width (MLX compiles a custom
/// kernel per name and template constants, about a second each on first use in a process), so
/// a call with fewer rows fills the unused inputs with row 0's arrays (their blocks are not
/// launched) and a wider batch runs in calls of at most this many rows. Eight rows keep the
/// kernel's parameters (each row's shape and strides) well inside CUDA's 4 KiB.
pub const ROWS_PER_CALL: usize = 8;

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
}

/// The kernel's source for `rows` input rows: a prologue that picks the block's row (its
/// inputs are `k<r>` / `v<r>`) and defines what `kernels/decode_attention.cu` reads, then that
/// body, the same text at every row count.
pub fn source(rows: usize) -> String {
    let mut s = String::from(
        "const int heads = q_shape[1];\n\
         const int row = blockIdx.x / heads;\n\
         const int h = blockIdx.x % heads;\n\
         const T* kr;\nconst T* vr;\nint n_keys, kv_heads;\n\
         int64_t k_head, k_step, v_head, v_step;\n\
         switch (row) {\n",
    );
    for r in 0..rows {
        s.push_str(&format!(
            "  case {r}: kr = k{r}; vr = v{r}; n_keys = k{r}_shape[2]; kv_heads = k{r}_shape[1];\n\
             \x20   k_head = k{r}_strides[1]; k_step = k{r}_strides[2];\n\
             \x20   v_head = v{r}_strides[1]; v_step = v{r}_strides[2]; break;\n"
        ));
    }
    s.push_str(
        "  default: return;\n}\n\
         const T* qh = q + row * q_strides[0] + h * q_strides[1];\n\
         T* oh = out + (row * heads + h) * D;\n",
    );
    s.push_str(SOURCE);
    s
}

fn kernel() -> Result<Rc<Kernel>> {
    kernel_in(&KERNEL, || {
        let mut inputs = vec!["q".to_string()];
        for r in 0..ROWS_PER_CALL {
            inputs.push(format!("k{r}"));
            inputs.push(format!("v{r}"));
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Kernel::new(
            "memexec_decode_attention",
            &inputs,
            &["out"],
            &source(ROWS_PER_CALL),
            "",
            false,
        )
    })
}

/// `[rows, heads, 1, D]` queries, row `r` over `kv[r]`'s `[1, kv_heads, S_r, D]` keys /
/// values, no mask: one kernel node per [`ROWS_PER_CALL`] rows. `None` when a shape is not the
/// kernel's (the caller uses MLX's op).
pub fn attend_rows(q: &Array, kv: &[(&Array, &Array)], scale: f32) -> Result<Option<Array>> {
    let Some((_, d)) = super::attention::decode_rows_fit(q, kv, 256, MAX_KEYS) else {
        return Ok(None);
    };
    // The kernel reads values as it reads keys.
    if !kv
        .iter()
        .all(|(_, v)| v.dim(3) == d && v.strides().last() == Some(&1))
    {
        return Ok(None);
    }
    let outs = super::attention::row_calls(q, kv, ROWS_PER_CALL)?
        .iter()
        .map(|(qc, kvs)| call(qc, kvs, scale))
        .collect::<Result<Vec<_>>>()?;
    super::attention::stack_rows(outs).map(Some)
}

/// One kernel call over at most [`ROWS_PER_CALL`] rows that suit it.
fn call(q: &Array, kv: &[(&Array, &Array)], scale: f32) -> Result<Array> {
    let (rows, heads, d, dtype) = (q.dim(0), q.dim(1), q.dim(3), q.dtype());
    let first = kv
        .first()
        .ok_or_else(|| Error::Internal("decode attention: no rows".into()))?;
    let mut inputs: Vec<&Array> = Vec::with_capacity(1 + 2 * ROWS_PER_CALL);
    inputs.push(q);
    for r in 0..ROWS_PER_CALL {
        let (k, v) = kv.get(r).unwrap_or(first);
        inputs.push(k);
        inputs.push(v);
    }
    let out = kernel()?.apply(
        &inputs,
        &[(q.shape(), dtype)],
        [rows * heads * THREADS, 1, 1],
        [THREADS, 1, 1],
        &super::attention::kernel_constants(dtype, d, scale, MAX_KEYS),
    )?;
    out.into_iter()
        .next()
        .ok_or_else(|| Error::Internal("decode attention: no output".into()))
}

/// [`attend_rows`] for one row: `[1, heads, 1, D]` queries over `[1, kv_heads, S, D]`.
pub fn attend(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Option<Array>> {
    attend_rows(q, &[(k, v)], scale)
}

/// Runs the kernel once on a small case against MLX's op: fails where it cannot compile or
/// run (not an MLX CUDA build) or disagrees beyond the rounding of bf16 scores.
pub fn self_check() -> Result<()> {
    use mlx_rs::fast::scaled_dot_product_attention;
    // Deterministic values in [-0.25, 0.25) from a 32-bit LCG (no MLX random state touched):
    // scores of a few tenths, a spread-out softmax. Scale 1 and head dim 256 are Gemma-4's
    // sliding layers', so the kernel compiled here is the one decoding uses first.
    let mut lcg = super::check_values::Lcg::new(0x2545_f491);
    let mut draw = |shape: &[i32]| lcg.bf16(shape, -0.25, 0.5);
    let q = draw(&[1, 4, 1, 256])?;
    let k = draw(&[1, 2, 37, 256])?;
    let v = draw(&[1, 2, 37, 256])?;
    let ours = attend(&q, &k, &v, 1.0)?
        .ok_or_else(|| Error::Internal("decode attention: self-check shape rejected".into()))?;
    let theirs = scaled_dot_product_attention(&q, &k, &v, 1.0, None, None)?;
    let close = ours.as_dtype(Dtype::Float32)?.all_close(
        &theirs.as_dtype(Dtype::Float32)?,
        2e-2,
        2e-2,
        None,
    )?;
    if close {
        Ok(())
    } else {
        Err(Error::Internal(
            "decode attention: kernel disagrees with MLX's attention".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::check_values::zeros;

    #[test]
    fn only_kernel_asks_for_the_kernel() {
        assert_eq!(
            DecodeAttention::parse(Some("kernel")),
            DecodeAttention::Kernel
        );
        assert_eq!(
            DecodeAttention::parse(Some(" KERNEL ")),
            DecodeAttention::Kernel
        );
        for v in [None, Some(""), Some("mlx"), Some("1"), Some("kernels")] {
            assert_eq!(DecodeAttention::parse(v), DecodeAttention::Mlx, "{v:?}");
        }
    }

    #[test]
    fn shapes_outside_the_kernel_take_mlx_op() {
        let bf = Dtype::Bfloat16;
        let kv = |keys: i32, d: i32| zeros(&[1, 2, keys, d], bf);
        let cases = [
            // Prefill: more than one query position.
            (zeros(&[1, 8, 3, 256], bf), kv(3, 256), kv(3, 256)),
            // Head dim not a multiple of 256 (the tiny fixtures' 64 / 128).
            (zeros(&[1, 8, 1, 128], bf), kv(5, 128), kv(5, 128)),
            // More keys than the kernel keeps.
            (
                zeros(&[1, 8, 1, 256], bf),
                kv(MAX_KEYS + 1, 256),
                kv(MAX_KEYS + 1, 256),
            ),
            // Keys of several rows in one array (each row's keys must be their own array).
            (
                zeros(&[2, 8, 1, 256], bf),
                zeros(&[2, 2, 5, 256], bf),
                zeros(&[2, 2, 5, 256], bf),
            ),
            // Query heads not a multiple of the key heads.
            (zeros(&[1, 3, 1, 256], bf), kv(5, 256), kv(5, 256)),
            // Mixed dtypes.
            (
                zeros(&[1, 8, 1, 256], Dtype::Float32),
                kv(5, 256),
                kv(5, 256),
            ),
            // f32 activations (the kernel loads 2-byte elements only).
            (
                zeros(&[1, 8, 1, 256], Dtype::Float32),
                zeros(&[1, 2, 5, 256], Dtype::Float32),
                zeros(&[1, 2, 5, 256], Dtype::Float32),
            ),
        ];
        for (i, (q, k, v)) in cases.iter().enumerate() {
            assert!(attend(q, k, v, 1.0).unwrap().is_none(), "case {i}");
        }
    }

    #[test]
    fn a_build_without_mlx_cuda_falls_back_to_mlx_op() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        for on_cpu in [true, false] {
            for asked in [
                DecodeAttention::Kernel,
                DecodeAttention::Probs,
                DecodeAttention::Mlx,
            ] {
                assert_eq!(asked.checked(on_cpu), DecodeAttention::Mlx, "{asked:?}");
            }
        }
    }

    #[test]
    fn each_row_count_gets_the_same_body_after_its_row_switch() {
        let one = source(1);
        let three = source(3);
        for s in [&one, &three] {
            assert!(s.ends_with(SOURCE));
        }
        assert!(three.contains("case 2: kr = k2; vr = v2;"));
        assert!(!one.contains("case 1:"));
        // The prologue differs only in its switch: the text after it is the same.
        let after = |s: &str| s[s.find("default: return;").unwrap()..].to_string();
        assert_eq!(after(&one), after(&three));
    }
}
