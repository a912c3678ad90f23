//! One-row 4-bit products on MLX CUDA with the bits of MLX's own one-row kernel, faster.
//!
//! Why: a serial decode step's quantized products run through MLX CUDA's `qmv` (0.32.2), the
//! kernel mlx-lm's serial decode runs too, and they were half of the step's device time on an
//! H100 (session 38: 212 products, 3.24 of 6.16 ms; the fused gate/up product at ~0.9 TB/s of
//! the card's ~3.35). `qmv` has each warp compute one column with one load of weights in flight
//! at a time. `kernels/quantized_row.cu` computes each column exactly as `qmv` does (the same
//! lanes, accumulator type, rounding and reduction order: `scripts/gpu/quantized_row.py`
//! checks bit-equality on the device) but has a warp take several columns and issue the loads
//! of several steps before computing them. The bits being `qmv`'s, serial tokens stay
//! mlx-lm's and equal to the batched rows' (whose kernel, [`super::quantized_rows`], gives each
//! row `qmv`'s bits as well).
//!
//! Used by [`super::linear`] for one-position inputs of ONE row when
//! [`super::ForwardCtx::row_kernel`] is on (the model turns it on where [`available`] says
//! the kernel runs and matches MLX here). Only 4-bit affine weights with groups of 32 / 64 /
//! 128, as the rows kernel; anything else keeps MLX's product.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::Array;

use super::linear::QuantizedMatrix;
use super::quantized_rows::fits;
use super::row_kernel::without_comment_lines;
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, CudaKernel, TemplateArg};

const SOURCE: &str = include_str!("kernels/quantized_row.cu");

/// The rows kernel's header: `cg::reduce` and the paired accumulator / dequantization helpers
/// both kernels must share for their bits to agree.
const HEADER: &str = include_str!("kernels/quantized_rows_header.cuh");

/// Warps per block.
const WARPS: i32 = 8;

/// Columns per warp and steps of loads in flight (the kernel's `COLS` and `UNROLL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Output columns one warp computes.
    pub cols: i32,
    /// Steps (32 lanes x 16 inputs each for 2-byte types) whose loads are issued together.
    pub unroll: i32,
}

impl Tile {
    /// The tile decoding uses: `MEMEXEC_ROW_KERNEL_TILE` (`COLSxUNROLL`, e.g. `4x2`; a tuning
    /// knob for other GPUs, checked by the self-check like the default) or the default.
    pub fn from_env() -> Tile {
        Tile::parse(std::env::var("MEMEXEC_ROW_KERNEL_TILE").ok().as_deref())
            .unwrap_or(DEFAULT_TILE)
    }

    /// A `COLSxUNROLL` value, each 1 to 8; `None` when it is not one.
    pub fn parse(value: Option<&str>) -> Option<Tile> {
        let (c, u) = value?.trim().split_once(['x', 'X'])?;
        let (cols, unroll) = (c.trim().parse().ok()?, u.trim().parse().ok()?);
        ((1..=8).contains(&cols) && (1..=8).contains(&unroll)).then_some(Tile { cols, unroll })
    }
}

/// Four columns per warp, two steps in flight (H100, session 39: see the module docs of
/// `scripts/gpu/quantized_row.py` for the sweep).
pub const DEFAULT_TILE: Tile = Tile { cols: 4, unroll: 2 };

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<CudaKernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
    /// The tile, read once per thread.
    static TILE: Tile = Tile::from_env();
}

fn kernel() -> Result<Rc<CudaKernel>> {
    kernel_in(&KERNEL, || {
        CudaKernel::new(
            "memexec_quantized_row",
            &["x", "w", "scales", "biases"],
            &["out"],
            &without_comment_lines(SOURCE),
            &(without_comment_lines(HEADER) + "\n"),
            true,
        )
    })
}

/// `x W^T` for a one-row `x` (`[1, ..., 1, k]`) in one kernel node with the bits of MLX's
/// one-row product; `None` when the product is not the kernel's (more rows, other weights:
/// the caller keeps MLX's op).
pub(super) fn product(x: &Array, matrix: &QuantizedMatrix) -> Result<Option<Array>> {
    let rows = x.shape()[..x.ndim().saturating_sub(1)]
        .iter()
        .product::<i32>();
    if rows != 1 || !fits(x, matrix) {
        return Ok(None);
    }
    product_with(x, matrix, TILE.with(|t| *t)).map(Some)
}

fn product_with(x: &Array, matrix: &QuantizedMatrix, tile: Tile) -> Result<Array> {
    let n = matrix.weight.dim(0);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("fits: x has a last axis") = n;
    let per_block = WARPS * tile.cols;
    let out = kernel()?.apply(
        &[x, &matrix.weight, &matrix.scales, &matrix.biases],
        &[(&shape, x.dtype())],
        [(n + per_block - 1) / per_block * 32, WARPS, 1],
        [32, WARPS, 1],
        &[
            ("T", TemplateArg::Dtype(x.dtype())),
            ("GROUP", TemplateArg::Int(matrix.params.group_size)),
            ("COLS", TemplateArg::Int(tile.cols)),
            ("UNROLL", TemplateArg::Int(tile.unroll)),
        ],
    )?;
    out.into_iter()
        .next()
        .ok_or_else(|| Error::Internal("quantized row: no output".into()))
}

/// Whether the kernel runs here and gives MLX's one-row bits ([`self_check`]), asked once per
/// thread; `MEMEXEC_ROW_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_ROW_KERNEL",
        "one-row products",
        "MLX's product",
        self_check,
    )
}

/// Runs the kernel (with the tile decoding uses) on small cases against MLX's product: fails
/// where it cannot compile or run (not an MLX CUDA build) or where any element's bits differ
/// (an MLX whose one-row kernel changed).
pub fn self_check() -> Result<()> {
    use mlx_rs::ops::quantize;
    // 704 inputs: a full pass of the 512 a warp takes at once plus a partial step; 24 and 100
    // outputs: a block's last warp partly or wholly past the columns. bf16 and groups of 64
    // are the e4b's, so the kernel compiled here is the one decoding uses.
    let mut lcg = super::check_values::Lcg::new(0x85eb_ca6b);
    let tile = TILE.with(|t| *t);
    for (n, k) in [(24, 704), (100, 1024)] {
        let x = lcg.bf16(&[1, 1, k], -0.5, 1.0)?;
        let (weight, scales, biases) = quantize(&lcg.bf16(&[n, k], -0.5, 1.0)?, 64, 4)?;
        let matrix = QuantizedMatrix {
            weight,
            scales,
            biases,
            params: super::config::QuantParams {
                group_size: 64,
                bits: 4,
            },
        };
        let ours = product_with(&x, &matrix, tile)?;
        if !ours.eq_values(&matrix.product(&x)?)? {
            return Err(Error::Internal(format!(
                "quantized row: kernel ({}x{} tile) differs from MLX's one-row product at \
                 {n} x {k}",
                tile.cols, tile.unroll
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_parse_and_reject() {
        assert_eq!(Tile::parse(Some("4x2")), Some(Tile { cols: 4, unroll: 2 }));
        assert_eq!(
            Tile::parse(Some(" 1X8 ")),
            Some(Tile { cols: 1, unroll: 8 })
        );
        for bad in [
            None,
            Some(""),
            Some("4"),
            Some("0x2"),
            Some("4x9"),
            Some("ax2"),
        ] {
            assert_eq!(Tile::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_build_without_mlx_cuda_keeps_mlx_product() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        assert!(!available());
    }
}
