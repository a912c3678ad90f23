//! Batched 4-bit products on MLX CUDA whose rows keep the bits of the one-row product.
//!
//! Why: a batched row must get the bits of its serial step, and MLX CUDA (0.32.2) computes
//! a quantized product with its row-wise `qmv` kernel (the serial path's) only below 8 rows;
//! from 8 rows on it takes a tiled kernel that sums in another order. So wider batches ran
//! their products in chunks of at most 7 rows (a split, a product per chunk and a
//! concatenation: ~4 graph nodes per product instead of 1, and a decode step pays MLX's host
//! work per node). `kernels/quantized_rows.cu` computes up to 8 rows per block row, each
//! exactly as `qmv` does (same lanes, accumulator type, rounding and reduction order; on the
//! H200 100% of elements bit-equal for every e4b product shape at 1-16 rows:
//! `scripts/gpu/quantized_rows.py`), in ONE node for any row count.
//!
//! Used by [`super::linear`] for one-position inputs of more rows than
//! [`super::ForwardCtx::product_rows`] when [`super::ForwardCtx::product_kernel`] is on (the
//! batched decoder turns it on where [`available`] says the kernel runs and matches MLX
//! here). Only 4-bit affine weights with groups of 32 / 64 / 128 (MLX's 8-bit one-row
//! product rounds otherwise); anything else keeps the chunks.
//!
//! It also takes every other one-position product where [`small_products`] says so (serial
//! decode steps and batched steps of at most 7 rows): the same bits as MLX's `qmv`, but a
//! lane loads the weights of up to 8 steps before summing them, where `qmv` waits a memory
//! latency per step — on the H200 the one-row products were ~47% of a decode step's GPU time,
//! streaming weights at < 1 TB/s (`scripts/gpu/cupti_trace.py`).
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::linear::QuantizedMatrix;
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, CudaKernel, TemplateArg};

const SOURCE: &str = include_str!("kernels/quantized_rows.cu");

/// What the kernel needs beyond MLX's default header (which has `cooperative_groups.h`):
/// `cg::reduce`, MLX's own warp reduction.
const HEADER: &str = "#include <cooperative_groups/reduce.h>\n";

/// Output columns per block (the kernel's `COLS_PER_BLOCK`, one warp each).
const COLS_PER_BLOCK: i32 = 8;

/// Input rows one block row of the kernel takes (its `ROWS`) for a product of `rows` rows:
/// the smallest of 1, 2, 4, 8 that holds them, so a one-row product keeps one row of
/// accumulators per lane (registers the weight prefetch uses).
fn rows_per_block(rows: i32) -> i32 {
    match rows {
        ..=1 => 1,
        2 => 2,
        3..=4 => 4,
        _ => 8,
    }
}

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<CudaKernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
    /// [`small_products`]'s answer on this thread, once asked.
    static SMALL: Cell<Option<bool>> = const { Cell::new(None) };
}

fn kernel() -> Result<Rc<CudaKernel>> {
    kernel_in(&KERNEL, || {
        CudaKernel::new(
            "memexec_quantized_rows",
            &["x", "w", "scales", "biases"],
            &["out"],
            SOURCE,
            HEADER,
            true,
        )
    })
}

/// Whether `x` (`[..., k]`) times `matrix` is a product the kernel computes as MLX's one-row
/// kernel would.
fn fits(x: &Array, matrix: &QuantizedMatrix) -> bool {
    let dtype = x.dtype();
    let (&[n, words], &[n_s, groups], &[n_b, groups_b]) = (
        matrix.weight.shape(),
        matrix.scales.shape(),
        matrix.biases.shape(),
    ) else {
        return false;
    };
    let group = matrix.params.group_size;
    matrix.params.bits == 4
        && matches!(group, 32 | 64 | 128)
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && matrix.weight.dtype() == Dtype::Uint32
        && matrix.scales.dtype() == dtype
        && matrix.biases.dtype() == dtype
        && n > 0
        && n == n_s
        && n == n_b
        && groups == groups_b
        && x.ndim() >= 1
        && x.shape().last() == Some(&(groups * group))
        && words * 8 == groups * group
}

/// `x W^T` over the last axis of `x` in one kernel node, every row with the bits of MLX's
/// one-row product; `None` when the product is not the kernel's (the caller keeps MLX's op).
pub(super) fn product(x: &Array, matrix: &QuantizedMatrix) -> Result<Option<Array>> {
    if !fits(x, matrix) {
        return Ok(None);
    }
    let n = matrix.weight.dim(0);
    let rows = x.shape()[..x.ndim() - 1].iter().product::<i32>().max(1);
    let per_block = rows_per_block(rows);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("fits: x has a last axis") = n;
    let out = kernel()?.apply(
        &[x, &matrix.weight, &matrix.scales, &matrix.biases],
        &[(&shape, x.dtype())],
        [
            (n + COLS_PER_BLOCK - 1) / COLS_PER_BLOCK * 32,
            (rows + per_block - 1) / per_block * COLS_PER_BLOCK,
            1,
        ],
        [32, COLS_PER_BLOCK, 1],
        &[
            ("T", TemplateArg::Dtype(x.dtype())),
            ("GROUP", TemplateArg::Int(matrix.params.group_size)),
            ("ROWS", TemplateArg::Int(per_block)),
        ],
    )?;
    out.into_iter()
        .next()
        .map(Some)
        .ok_or_else(|| Error::Internal("quantized rows: no output".into()))
}

/// Whether the kernel runs here and gives MLX's one-row bits ([`self_check`]), asked once per
/// thread; `MEMEXEC_PRODUCT_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_PRODUCT_KERNEL",
        "batched products",
        "rows run in chunks",
        self_check,
    )
}

/// Whether one-position products of at most [`super::ForwardCtx::product_rows`] rows (and
/// every serial decode step's) run through the kernel too: where [`available`], unless
/// `MEMEXEC_SMALL_PRODUCT_KERNEL=0` (for measuring). Asked once per thread.
pub fn small_products() -> bool {
    super::check_values::passes_once(
        &SMALL,
        "MEMEXEC_SMALL_PRODUCT_KERNEL",
        "one-position products",
        "MLX's qmv runs them",
        || {
            if available() {
                Ok(())
            } else {
                Err(Error::Internal("the product kernel is unavailable".into()))
            }
        },
    )
}

/// Runs the kernel once on a small case against MLX's product of each row alone: fails where
/// it cannot compile or run (not an MLX CUDA build) or where any element's bits differ (an
/// MLX whose one-row kernel changed).
pub fn self_check() -> Result<()> {
    use mlx_rs::ops::indexing::TryIndexOp;
    use mlx_rs::ops::{concatenate, quantize};
    // Deterministic values in [-0.5, 0.5) from a 32-bit LCG (no MLX random state touched).
    // 9 rows: two block rows of 8 rows, one of a single row; then 1 and 3 rows (block rows of
    // 1 and 4). 4800 inputs: 9 full passes of the 512 a warp takes at once (more than one
    // prefetch of 8) plus a remainder; 24 outputs: three blocks. bf16 and groups of 64 are the
    // e4b's, so the kernel compiled here is the one decoding uses.
    let mut lcg = super::check_values::Lcg::new(0x9e37_79b9);
    let mut draw = |shape: &[i32]| lcg.bf16(shape, -0.5, 1.0);
    let (rows, n, k) = (9, 24, 4800);
    let x = draw(&[rows, 1, k])?;
    let (weight, scales, biases) = quantize(&draw(&[n, k])?, 64, 4)?;
    let matrix = QuantizedMatrix {
        weight,
        scales,
        biases,
        params: super::config::QuantParams {
            group_size: 64,
            bits: 4,
        },
    };
    let alone = (0..rows)
        .map(|r| matrix.product(&x.try_index(r..r + 1)?))
        .collect::<Result<Vec<_>>>()?;
    for take in [rows, 1, 3] {
        let ours = product(&x.try_index(..take)?, &matrix)?
            .ok_or_else(|| Error::Internal("quantized rows: self-check shape rejected".into()))?;
        let theirs = concatenate(&alone[..take as usize], 0)?;
        if !ours.eq_values(&theirs)? {
            return Err(Error::Internal(format!(
                "quantized rows: kernel differs from MLX's one-row product ({take} rows)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::check_values::zeros;
    use crate::model::config::QuantParams;

    fn matrix(n: i32, k: i32, group: i32, bits: i32, dtype: Dtype) -> QuantizedMatrix {
        let w = mlx_rs::ops::zeros_dtype(&[n, k], dtype).unwrap();
        let (weight, scales, biases) = mlx_rs::ops::quantize(&w, group, bits).unwrap();
        QuantizedMatrix {
            weight,
            scales,
            biases,
            params: QuantParams {
                group_size: group,
                bits,
            },
        }
    }

    #[test]
    fn products_outside_the_kernel_keep_mlx_op() {
        let bf = Dtype::Bfloat16;
        // 8-bit weights: MLX's one-row kernel rounds them otherwise.
        assert!(!fits(&zeros(&[8, 1, 256], bf), &matrix(16, 256, 64, 8, bf)));
        // Input width other than the matrix's.
        assert!(!fits(&zeros(&[8, 1, 128], bf), &matrix(16, 256, 64, 4, bf)));
        // Activations of another dtype than the scales.
        assert!(!fits(
            &zeros(&[8, 1, 256], Dtype::Float16),
            &matrix(16, 256, 64, 4, bf)
        ));
        // The kernel's own shapes.
        assert!(fits(&zeros(&[8, 1, 256], bf), &matrix(16, 256, 64, 4, bf)));
        assert!(fits(&zeros(&[3, 256], bf), &matrix(16, 256, 32, 4, bf)));
    }

    #[test]
    fn a_build_without_mlx_cuda_keeps_the_chunks() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        assert!(!available());
    }
}
