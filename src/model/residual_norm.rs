//! A decoder layer's residual update — `h + norm(y)`, times the layer scalar, and the next
//! norm of the result — as one node on MLX CUDA, with the bits of MLX's own ops.
//!
//! Why: a serial decode step is bound by MLX's host work per graph node, and a Gemma-4 layer
//! updates its residual three times, each an `RMSNorm` and an `Add` (the last also a `Multiply`
//! by the layer scalar), each followed by the `RMSNorm` the next block starts with: 9 nodes per
//! layer, ~250 of a one-row e4b step's ~1500. `kernels/residual_norm.cu` computes each update and
//! the following norm in one node, every element as MLX 0.32.2's `rms_norm_small` kernel and its
//! binary ops compute it (same thread layout, f32 sum order, block reduction and roundings), so
//! the numbers stay MLX's (mlx-lm's): [`self_check`] compares them bit for bit at load and
//! `scripts/gpu/residual_norm.py` over every e4b shape.
//!
//! Off unless `MEMEXEC_NORM_KERNEL=1` ([`asked`]). Why: session 10 (H200,
//! `benchmarks/2026-12-01-h200-session10/`) measured it bit-exact but no faster through MLX's
//! JIT calls: 126 custom-kernel calls per step cost the host more than the ~250 nodes they
//! replaced. Called precompiled ([`super::precompiled`]) a call should cost what an MLX op does;
//! whether the step then gets faster is for the device to say (`scripts/gpu/kernel_calls_ab.sh`).
//!
//! [`add_normed`] is the one entry point: it runs the kernel when the model resolved it at load
//! ([`available`]) and the shapes are the kernel's, and MLX's ops otherwise (CPU, Metal).
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::norm::RmsNorm;
use super::precompiled::Kernel;
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, TemplateArg};

const SOURCE: &str = include_str!("kernels/residual_norm.cu");

/// What the kernel needs beyond MLX's default header (which has `cooperative_groups.h`):
/// `cg::reduce`, MLX's own block reduction.
const HEADER: &str = "#include <cooperative_groups/reduce.h>\n#include <cuda/std/type_traits>\n";

thread_local! {
    /// The kernel without the next norm's output, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// The kernel with it.
    static KERNEL_NEXT: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// `kernels/residual_norm.cu` without its comment lines (MLX copies a JIT kernel's whole
/// source into every call's graph node), after the prologue the variant needs: the kernel
/// without a next norm has no `xn` output, and the body names it.
pub fn source(next: bool) -> String {
    let body = super::row_kernel::without_comment_lines(SOURCE);
    if next {
        body
    } else {
        format!("T* xn = nullptr;\n{body}")
    }
}

fn kernel(next: bool) -> Result<Rc<Kernel>> {
    let (slot, name, outputs): (_, _, &[&str]) = if next {
        (&KERNEL_NEXT, "memexec_residual_norm_next", &["out", "xn"])
    } else {
        (&KERNEL, "memexec_residual_norm", &["out"])
    };
    kernel_in(slot, || {
        Kernel::new(
            name,
            &["h", "y", "w", "s", "wn"],
            outputs,
            &source(next),
            HEADER,
            false,
        )
    })
}

/// The launch MLX 0.32.2's `RMSNorm` takes for an axis of `d` elements of `dtype` on CUDA:
/// `(threads, chunks)` of its `rms_norm_small` kernel (`dispatch_num_chunks` in
/// `mlx/backend/cuda/rms_norm.cu`), or `None` where MLX takes its other kernel (axes over 1024
/// vectors of 16 bytes), which the fused kernel does not mirror.
pub fn mlx_launch(d: i32, dtype: Dtype) -> Option<(i32, i32)> {
    let item = match dtype {
        Dtype::Bfloat16 | Dtype::Float16 => 2,
        Dtype::Float32 => 4,
        _ => return None,
    };
    let n_reads = 16 / item;
    if d < 1 || d > n_reads * 128 * 8 {
        return None;
    }
    let vectors = (d + n_reads - 1) / n_reads;
    Some(if d <= n_reads * 64 {
        (64, 1)
    } else if vectors % 128 == 0 && vectors / 128 <= 8 {
        (128, vectors / 128)
    } else if vectors % 64 == 0 && vectors / 64 <= 8 {
        (64, vectors / 64)
    } else {
        (128, (vectors + 127) / 128)
    })
}

/// A learned `[d]` norm weight of `dtype` the kernel reads element by element.
pub(super) fn weight_fits(w: &Array, d: i32, dtype: Dtype) -> bool {
    w.shape() == [d] && w.dtype() == dtype && w.strides() == [1]
}

/// `h + norm(y)`, times `scale` (a value broadcast over the axis: the layer scalar) when given,
/// and `next` of that when given: `(new residual, its next norm)`. One kernel node when
/// `kernel` is set (the model resolved [`available`] at load) and the shapes are the kernel's;
/// MLX's `RMSNorm` / `Add` / `Multiply` / `RMSNorm` otherwise. The bits are the same either way.
pub fn add_normed(
    h: &Array,
    y: &Array,
    norm: &RmsNorm,
    scale: Option<&Array>,
    next: Option<&RmsNorm>,
    kernel: bool,
) -> Result<(Array, Option<Array>)> {
    if kernel {
        if let Some(done) = fused(h, y, norm, scale, next)? {
            return Ok(done);
        }
    }
    let mut out = h.add(norm.forward(y)?)?;
    if let Some(s) = scale {
        out = out.multiply(s)?;
    }
    let normed = next.map(|n| n.forward(&out)).transpose()?;
    Ok((out, normed))
}

/// [`add_normed`]'s kernel call, `None` when the shapes or dtypes are not the kernel's.
fn fused(
    h: &Array,
    y: &Array,
    norm: &RmsNorm,
    scale: Option<&Array>,
    next: Option<&RmsNorm>,
) -> Result<Option<(Array, Option<Array>)>> {
    let dtype = h.dtype();
    let Some(&d) = h.shape().last() else {
        return Ok(None);
    };
    let Some((threads, chunks)) = mlx_launch(d, dtype) else {
        return Ok(None);
    };
    let Some(w) = norm.weight() else {
        return Ok(None);
    };
    let next_w = match next {
        Some(n) => match n.weight() {
            Some(nw) if n.eps() == norm.eps() && weight_fits(nw, d, dtype) => Some(nw),
            _ => return Ok(None),
        },
        None => None,
    };
    // The scale is read once per row: it must be one value broadcast (the layer scalar's
    // evaluated view), of the activations' dtype (else MLX would promote the product).
    let scale_fits =
        |s: &Array| s.dtype() == dtype && (s.size() == 1 || s.strides().iter().all(|&st| st == 0));
    let rows = h.size() as i32 / d;
    let fits = y.shape() == h.shape()
        && y.dtype() == dtype
        && weight_fits(w, d, dtype)
        && scale.is_none_or(scale_fits)
        && rows > 0;
    if !fits {
        return Ok(None);
    }
    let kernel = kernel(next_w.is_some())?;
    let inputs = [h, y, w, scale.unwrap_or(w), next_w.unwrap_or(w)];
    let shape = h.shape().to_vec();
    let outputs: Vec<(&[i32], Dtype)> = if next_w.is_some() {
        vec![(&shape, dtype), (&shape, dtype)]
    } else {
        vec![(&shape, dtype)]
    };
    let mut out = kernel.apply(
        &inputs,
        &outputs,
        [rows * threads, 1, 1],
        [threads, 1, 1],
        &[
            ("T", TemplateArg::Dtype(dtype)),
            ("D", TemplateArg::Int(d)),
            ("BLOCK", TemplateArg::Int(threads)),
            ("CHUNKS", TemplateArg::Int(chunks)),
            ("EPS_BITS", TemplateArg::Int(norm.eps().to_bits() as i32)),
            ("HAS_SCALE", TemplateArg::Int(scale.is_some() as i32)),
            ("HAS_NEXT", TemplateArg::Int(next_w.is_some() as i32)),
        ],
    )?;
    let normed = if next_w.is_some() { out.pop() } else { None };
    let residual = out
        .pop()
        .ok_or_else(|| Error::Internal("residual norm: no output".into()))?;
    Ok(Some((residual, normed)))
}

/// Whether `MEMEXEC_NORM_KERNEL` asks for the kernel (`1` / `on`, any case): off by default,
/// see the module doc.
pub fn asked() -> bool {
    parse_switch(std::env::var("MEMEXEC_NORM_KERNEL").ok().as_deref())
}

/// How an opt-in kernel's variable reads: `1` / `on` (any case, spaces around) turn it on,
/// anything else, or nothing, leaves it off.
pub(super) fn parse_switch(value: Option<&str>) -> bool {
    matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "on")
    )
}

/// Whether the kernel runs here and gives MLX's bits ([`self_check`]), asked once per thread;
/// `MEMEXEC_NORM_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_NORM_KERNEL",
        "residual norms",
        "MLX's ops",
        self_check,
    )
}

/// Runs the kernel against MLX's ops on three small cases — bf16 over Gemma-4 e4b's hidden
/// size (2560: 64 threads x 5 chunks) with the layer scalar and the next norm, bf16 over 256
/// (a partly idle block), f32 over 320 (the f32 fixtures' kind) — and fails where it cannot
/// compile or run (not an MLX CUDA build) or where any element's bits differ (an MLX whose
/// kernels changed).
pub fn self_check() -> Result<()> {
    let mut lcg = super::check_values::Lcg::new(0x9e37_79b9);
    for (d, dtype, with_scale, with_next) in [
        (2560, Dtype::Bfloat16, true, true),
        (256, Dtype::Bfloat16, false, false),
        (320, Dtype::Float32, false, true),
    ] {
        let mut draw = |shape: &[i32], lo: f32, span: f32| -> Result<Array> {
            Ok(lcg.bf16(shape, lo, span)?.as_dtype(dtype)?)
        };
        let h = draw(&[3, 1, d], -4.0, 8.0)?;
        let y = draw(&[3, 1, d], -30.0, 60.0)?;
        let norm = RmsNorm::from_weight(draw(&[d], 0.0, 2.0)?, 1e-6);
        let next = RmsNorm::from_weight(draw(&[d], 0.0, 2.0)?, 1e-6);
        let scale = mlx_rs::ops::broadcast_to(&draw(&[1], 0.25, 1.0)?, &[1, 1, d])?;
        scale.eval()?;
        let scale = with_scale.then_some(&scale);
        let next = with_next.then_some(&next);
        let (ours, ours_next) = fused(&h, &y, &norm, scale, next)?.ok_or_else(|| {
            Error::Internal(format!("residual norm: self-check shape rejected (d {d})"))
        })?;
        let (theirs, theirs_next) = add_normed(&h, &y, &norm, scale, next, false)?;
        let same_next = match (ours_next, theirs_next) {
            (Some(a), Some(b)) => a.eq_values(&b)?,
            (None, None) => true,
            _ => false,
        };
        if !ours.eq_values(&theirs)? || !same_next {
            return Err(Error::Internal(format!(
                "residual norm: output differs from MLX's ops ({dtype:?}, axis {d})"
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
    fn launches_follow_mlx_dispatch() {
        let bf = Dtype::Bfloat16;
        // Gemma-4 e4b: hidden 2560 (320 vectors: 64 x 5), head / per-layer dims 256 and 512
        // (one chunk of 64 threads); 5376 (672 vectors, no multiple of 64: 128 x 6, the last
        // chunk partly idle).
        assert_eq!(mlx_launch(2560, bf), Some((64, 5)));
        assert_eq!(mlx_launch(256, bf), Some((64, 1)));
        assert_eq!(mlx_launch(512, bf), Some((64, 1)));
        assert_eq!(mlx_launch(2048, bf), Some((128, 2)));
        assert_eq!(mlx_launch(5376, bf), Some((128, 6)));
        assert_eq!(mlx_launch(320, Dtype::Float32), Some((128, 1)));
        // Past 1024 vectors MLX runs its other kernel; integers are not normalized.
        assert_eq!(mlx_launch(8192, bf), Some((128, 8)));
        assert_eq!(mlx_launch(8200, bf), None);
        assert_eq!(mlx_launch(256, Dtype::Int32), None);
    }

    #[test]
    fn shapes_outside_the_kernel_take_mlx_ops() {
        let bf = Dtype::Bfloat16;
        let h = zeros(&[1, 1, 256], bf);
        let norm = RmsNorm::from_weight(zeros(&[256], bf), 1e-6);
        let call = |h: &Array, y: &Array, norm: &RmsNorm, s: Option<&Array>| {
            fused(h, y, norm, s, None).unwrap().is_none()
        };
        // Another shape for y; a weightless norm; a weight of another dtype; a scale that is
        // not one value.
        assert!(call(&h, &zeros(&[2, 1, 256], bf), &norm, None));
        assert!(call(&h, &h, &RmsNorm::without_weight(1e-6), None));
        let w32 = RmsNorm::from_weight(zeros(&[256], Dtype::Float32), 1e-6);
        assert!(call(&h, &h, &w32, None));
        let varying = Array::from_slice(&[1.0f32; 256], &[256])
            .as_dtype(bf)
            .unwrap();
        assert!(call(&h, &h, &norm, Some(&varying)));
        // A next norm with another eps.
        let other_eps = RmsNorm::from_weight(zeros(&[256], bf), 1e-5);
        assert!(fused(&h, &h, &norm, None, Some(&other_eps))
            .unwrap()
            .is_none());
    }

    #[test]
    fn without_the_kernel_the_ops_are_mlx_own() {
        // The fallback is the unfused sequence: norm, add, scale, next norm.
        let f = Dtype::Float32;
        let h = Array::from_slice(&[1.0f32, -2.0, 3.0, 0.5], &[1, 1, 4]);
        let y = Array::from_slice(&[4.0f32, 0.0, -4.0, 2.0], &[1, 1, 4]);
        let w = Array::from_slice(&[1.0f32, 2.0, 0.5, 1.0], &[4]);
        let norm = RmsNorm::from_weight(w.clone(), 1e-6);
        let next = RmsNorm::from_weight(w, 1e-6);
        let s = Array::from_f32(0.5).as_dtype(f).unwrap();
        let (out, normed) = add_normed(&h, &y, &norm, Some(&s), Some(&next), false).unwrap();
        let want = h
            .add(norm.forward(&y).unwrap())
            .unwrap()
            .multiply(&s)
            .unwrap();
        assert!(out.eq_values(&want).unwrap());
        assert!(normed
            .unwrap()
            .eq_values(next.forward(&want).unwrap())
            .unwrap());
        // y = [4, 0, -4, 2]: rms = sqrt(9) = 3, so norm(y) = w * y / 3.
        let got: Vec<f32> = out.as_slice().to_vec();
        let expect = [
            (1.0 + 4.0 / 3.0) * 0.5,
            -2.0 * 0.5,
            (3.0 - 0.5 * 4.0 / 3.0) * 0.5,
            (0.5 + 2.0 / 3.0) * 0.5,
        ];
        for (g, e) in got.iter().zip(expect) {
            assert!((g - e).abs() < 1e-5, "{got:?} vs {expect:?}");
        }
    }

    #[test]
    fn a_build_without_mlx_cuda_falls_back_to_mlx_ops() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        assert!(!available());
    }

    #[test]
    fn only_one_and_on_ask_for_the_kernel() {
        assert!(parse_switch(Some("1")) && parse_switch(Some(" ON ")));
        assert!(!parse_switch(None) && !parse_switch(Some("0")) && !parse_switch(Some("all")));
    }

    #[test]
    fn only_the_variant_without_next_declares_its_output() {
        assert!(source(false).starts_with("T* xn = nullptr;\n"));
        assert!(!source(true).contains("T* xn = nullptr;"));
        assert!(!source(true).contains("// "));
        assert!(source(true).contains("sum = block_sum(sum, s_sum);"));
    }
}
