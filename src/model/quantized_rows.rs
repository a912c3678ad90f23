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
//! Used by [`super::linear`] for one-position inputs of two or more rows when
//! [`super::ForwardCtx::product_kernel`] is on (the batched decoder and speculative
//! verification turn it on where [`available`] says the kernel runs and matches MLX here):
//! also below 8 rows, where MLX's `qmv` would give the same bits but reads the weights once
//! per row. Only 4-bit affine weights with groups of 32 / 64 / 128 (MLX's 8-bit one-row
//! product rounds otherwise); anything else keeps MLX's product in row chunks.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::linear::QuantizedMatrix;
use super::precompiled::Kernel;
use super::row_kernel::without_comment_lines;
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, TemplateArg};

const SOURCE: &str = include_str!("kernels/quantized_rows.cu");

/// What the kernel needs beyond MLX's default header (which has `cooperative_groups.h`):
/// `cg::reduce`, MLX's own warp reduction, and the paired-accumulator helpers.
const HEADER: &str = include_str!("kernels/quantized_rows_header.cuh");

/// Input rows one block row of the kernel takes (its `ROWS`); output columns per block (its
/// `COLS_PER_BLOCK`, one warp each).
const ROWS_PER_BLOCK: i32 = 8;
const COLS_PER_BLOCK: i32 = 8;

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

fn kernel() -> Result<Rc<Kernel>> {
    kernel_in(&KERNEL, || product_kernel("memexec_quantized_rows", SOURCE))
}

/// A 4-bit product kernel named `name` with body `source`: this one and the one-row kernel
/// ([`super::quantized_row`]) take the same inputs and share [`HEADER`], whose helpers keep
/// their bits equal.
pub(super) fn product_kernel(name: &str, source: &str) -> Result<Kernel> {
    Kernel::new(
        name,
        &["x", "w", "scales", "biases"],
        &["out"],
        &without_comment_lines(source),
        &(without_comment_lines(HEADER) + "\n"),
        true,
    )
}

/// Whether `x` (`[..., k]`) times `matrix` is a product the kernel computes as MLX's one-row
/// kernel would (also [`super::quantized_row`]'s test: the same weights and inputs).
pub(super) fn fits(x: &Array, matrix: &QuantizedMatrix) -> bool {
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
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("fits: x has a last axis") = n;
    let out = kernel()?.apply(
        &[x, &matrix.weight, &matrix.scales, &matrix.biases],
        &[(&shape, x.dtype())],
        [
            (n + COLS_PER_BLOCK - 1) / COLS_PER_BLOCK * 32,
            (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK * ROWS_PER_BLOCK,
            1,
        ],
        [32, COLS_PER_BLOCK, 1],
        &[
            ("T", TemplateArg::Dtype(x.dtype())),
            ("GROUP", TemplateArg::Int(matrix.params.group_size)),
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

/// Runs the kernel once on a small case against MLX's product of each row alone: fails where
/// it cannot compile or run (not an MLX CUDA build) or where any element's bits differ (an
/// MLX whose one-row kernel changed).
pub fn self_check() -> Result<()> {
    use mlx_rs::ops::concatenate;
    use mlx_rs::ops::indexing::TryIndexOp;
    // Deterministic values in [-0.5, 0.5) from a 32-bit LCG (no MLX random state touched).
    // 9 rows: two block rows, one of a single row; 704 inputs: a full pass of the 512 a warp
    // takes at once plus a remainder; 24 outputs: three blocks. bf16 and groups of 64 are the
    // e4b's, so the kernel compiled here is the one decoding uses.
    let mut lcg = super::check_values::Lcg::new(0x9e37_79b9);
    let mut draw = |shape: &[i32]| lcg.bf16(shape, -0.5, 1.0);
    let (rows, n, k) = (9, 24, 704);
    let x = draw(&[rows, 1, k])?;
    let matrix = QuantizedMatrix::quantize(&draw(&[n, k])?, 64, 4)?;
    let ours = product(&x, &matrix)?
        .ok_or_else(|| Error::Internal("quantized rows: self-check shape rejected".into()))?;
    let alone = (0..rows)
        .map(|r| matrix.product(&x.try_index(r..r + 1)?))
        .collect::<Result<Vec<_>>>()?;
    let theirs = concatenate(&alone, 0)?;
    if ours.eq_values(&theirs)? {
        Ok(())
    } else {
        Err(Error::Internal(
            "quantized rows: kernel differs from MLX's one-row product".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::check_values::zeros;

    fn matrix(n: i32, k: i32, group: i32, bits: i32, dtype: Dtype) -> QuantizedMatrix {
        let w = mlx_rs::ops::zeros_dtype(&[n, k], dtype).unwrap();
        QuantizedMatrix::quantize(&w, group, bits).unwrap()
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
