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
//! Used by [`super::linear`] for one-position inputs of ONE row that
//! [`super::ForwardCtx::row_kernel`] takes: off unless `MEMEXEC_ROW_KERNEL` asks (see
//! [`RowKernel`] for why), and only where [`available`] says the kernel runs and matches MLX
//! here. Only 4-bit affine weights with groups of 32 / 64 / 128, as the rows kernel; anything
//! else keeps MLX's product.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::Array;

use super::linear::QuantizedMatrix;
use super::precompiled::Kernel;
use super::quantized_rows::{fits, product_kernel};
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, TemplateArg};

const SOURCE: &str = include_str!("kernels/quantized_row.cu");

/// Warps per block.
const WARPS: i32 = 8;

/// Which one-row products run through the kernel (`MEMEXEC_ROW_KERNEL`).
///
/// Off by default. Why: on the H100s measured (session 39) the kernel takes about half of
/// `qmv`'s device time on the e4b's products (fused gate/up 38.1 -> 18.5 us, output head 372 ->
/// 188 us; a serial step's kernels 6.16 -> 4.91 ms with it on every product), but a serial
/// decode step there is bound by the host, and a call of this kernel costs ~5 us more than
/// MLX's product in a Python chain of calls, where a trivial custom kernel costs about what
/// MLX's op does (`scripts/gpu/kernel_host_cost.py`; not yet split between the ~6.5 KB of
/// kernel text MLX assembles per call, the inputs and their shape arguments). With the kernel
/// on every product the step was slower in 4 of 5 interleaved pairs
/// (`benchmarks/2026-12-07-h100-session39/`). It pays where the device, not the host, bounds
/// the step. Called precompiled (`MEMEXEC_KERNEL_CALLS=precompiled`, [`super::precompiled`]) it
/// carries no source text, shape arguments or template constants per call; whether that makes
/// it pay on a host-bound step is not yet measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKernel {
    /// MLX's `qmv` for every one-row product.
    #[default]
    Off,
    /// The kernel for products whose packed weights hold at least [`LARGE_BYTES`] (the e4b's
    /// fused gate/up and down projections, its full-attention q/k/v, the per-layer model
    /// projection and the output head: the products where the device saving per call is
    /// largest against the host's extra cost).
    Large,
    /// The kernel for every one-row product it fits.
    All,
}

/// Packed weight bytes from which [`RowKernel::Large`] takes a product.
pub const LARGE_BYTES: usize = 8 << 20;

impl RowKernel {
    /// The use `MEMEXEC_ROW_KERNEL` asks for (a configuration's `"row_kernel"` takes
    /// precedence: [`crate::config::Config::row_kernel`]).
    pub fn from_env() -> RowKernel {
        RowKernel::parse(std::env::var("MEMEXEC_ROW_KERNEL").ok().as_deref())
    }

    /// `all` / `1` / `on`, `large`, anything else (or nothing) off; any case.
    pub fn parse(value: Option<&str>) -> RowKernel {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("all" | "1" | "on") => RowKernel::All,
            Some("large") => RowKernel::Large,
            _ => RowKernel::Off,
        }
    }

    /// Whether a product whose packed weights hold `bytes()` runs through the kernel; `bytes`
    /// is asked only by [`RowKernel::Large`] (every product of every decode step asks
    /// `takes`, and the size is three calls into MLX).
    pub fn takes(self, bytes: impl FnOnce() -> usize) -> bool {
        match self {
            RowKernel::Off => false,
            RowKernel::Large => bytes() >= LARGE_BYTES,
            RowKernel::All => true,
        }
    }
}

/// Columns per warp and steps of loads in flight (the kernel's `COLS` and `UNROLL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tile {
    cols: i32,
    unroll: i32,
}

/// The tile for `n` output columns. From the device times of session 39 (H100,
/// `benchmarks/2026-12-07-h100-session39/`): four columns per warp and two steps in flight
/// on the wide products (fused gate/up 18.5 us, the output head 188 us, against 19.9 and 236
/// with one column and four steps), one column and four steps below 8192 columns,
/// where four columns per warp leave too few blocks for the card (2560 columns: 7.5 against
/// 10.4 us; 3072 and 6144 columns were not timed at 1x4).
fn tile(n: i32) -> Tile {
    if n >= 8192 {
        Tile { cols: 4, unroll: 2 }
    } else {
        Tile { cols: 1, unroll: 4 }
    }
}

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

fn kernel() -> Result<Rc<Kernel>> {
    kernel_in(&KERNEL, || product_kernel("memexec_quantized_row", SOURCE))
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
    product_with(x, matrix, tile(matrix.weight.dim(0))).map(Some)
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
/// thread. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_ROW_KERNEL_CHECK",
        "one-row products",
        "MLX's product",
        self_check,
    )
}

/// Runs the kernel (with both tiles) on small cases against MLX's product: fails
/// where it cannot compile or run (not an MLX CUDA build) or where any element's bits differ
/// (an MLX whose one-row kernel changed).
pub fn self_check() -> Result<()> {
    // 704 inputs: a full pass of the 512 a warp takes at once plus a partial step; 24 and 100
    // outputs: a block's last warp partly or wholly past the columns. bf16 and groups of 64
    // are the e4b's, so the kernel compiled here is the one decoding uses.
    let mut lcg = super::check_values::Lcg::new(0x85eb_ca6b);
    for ((n, k), tile) in [(24, 704), (100, 1024)]
        .into_iter()
        .flat_map(|s| [(s, tile(1)), (s, tile(8192))])
    {
        let x = lcg.bf16(&[1, 1, k], -0.5, 1.0)?;
        let matrix = QuantizedMatrix::quantize(&lcg.bf16(&[n, k], -0.5, 1.0)?, 64, 4)?;
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
    fn uses_parse_and_pick_products() {
        assert_eq!(RowKernel::parse(None), RowKernel::Off);
        assert_eq!(RowKernel::parse(Some("0")), RowKernel::Off);
        assert_eq!(RowKernel::parse(Some("bogus")), RowKernel::Off);
        assert_eq!(RowKernel::parse(Some(" ALL ")), RowKernel::All);
        assert_eq!(RowKernel::parse(Some("1")), RowKernel::All);
        assert_eq!(RowKernel::parse(Some("large")), RowKernel::Large);
        assert!(!RowKernel::Off.takes(|| usize::MAX));
        assert!(RowKernel::All.takes(|| 0));
        assert!(!RowKernel::Large.takes(|| LARGE_BYTES - 1));
        assert!(RowKernel::Large.takes(|| LARGE_BYTES));
    }

    #[test]
    fn wide_products_take_four_columns_per_warp() {
        assert_eq!(tile(2560), Tile { cols: 1, unroll: 4 });
        assert_eq!(tile(20480), Tile { cols: 4, unroll: 2 });
    }

    #[test]
    fn only_one_row_of_fitting_weights_reaches_the_kernel() {
        use crate::model::check_values::zeros;
        let bf = mlx_rs::Dtype::Bfloat16;
        let matrix = |bits| QuantizedMatrix::quantize(&zeros(&[16, 256], bf), 64, bits).unwrap();
        // Answered before any kernel is made, so on every build: MLX's product stays.
        assert!(product(&zeros(&[2, 1, 256], bf), &matrix(4))
            .unwrap()
            .is_none());
        assert!(product(&zeros(&[1, 1, 256], bf), &matrix(8))
            .unwrap()
            .is_none());
        assert!(product(&zeros(&[1, 1, 128], bf), &matrix(4))
            .unwrap()
            .is_none());
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
