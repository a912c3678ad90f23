//! A decoder layer's query / key / value head norms as one node on MLX CUDA, with the bits of
//! MLX's `RMSNorm`.
//!
//! Why: a serial decode step is bound by MLX's host work per graph node. A Gemma-4 layer with its
//! own keys and values norms the heads of its fused q/k/v product three times (`q_norm`,
//! `k_norm`, the weightless `v_norm`), each after a reshape into heads: six nodes, 144 of a
//! one-row e4b step's (24 such layers). `kernels/head_norms.cu` norms every head of the three in
//! one node, each element as MLX 0.32.2's `rms_norm_small` computes it (the arithmetic that
//! [`super::residual_norm`]'s kernel mirrors, bit-exact on the H200 in session 10), so the
//! numbers stay MLX's (mlx-lm's): [`self_check`] compares them bit for bit at load.
//!
//! Off unless `MEMEXEC_HEAD_NORM_KERNEL=1` ([`asked`]): it saves 48 kernel nodes per one-row
//! step, worth having only where a custom-kernel call costs the host what an MLX op does (called
//! precompiled, [`super::precompiled`]), which a device has yet to measure
//! (`scripts/gpu/kernel_calls_ab.sh`).
//!
//! [`norm_heads`] is the one entry point: the kernel where the model resolved it at load
//! ([`available`]) and the shapes are the kernel's (one position per row), MLX's ops otherwise.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::attention::split_heads;
use super::norm::RmsNorm;
use super::precompiled::Kernel;
use super::residual_norm::mlx_launch;
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, TemplateArg};

const SOURCE: &str = include_str!("kernels/head_norms.cu");

/// Beyond MLX's default header (which has `cooperative_groups.h`): `cg::reduce`, and the type
/// test of the generic rounding helpers.
const HEADER: &str = "#include <cooperative_groups/reduce.h>\n#include <cuda/std/type_traits>\n";

thread_local! {
    /// The kernel, made on first use (see [`kernel_in`]).
    static KERNEL: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

fn kernel() -> Result<Rc<Kernel>> {
    kernel_in(&KERNEL, || {
        Kernel::new(
            "memexec_head_norms",
            &["q", "k", "v", "qw", "kw"],
            &["qn", "kn", "vn"],
            &super::row_kernel::without_comment_lines(SOURCE),
            HEADER,
            false,
        )
    })
}

/// Whether `MEMEXEC_HEAD_NORM_KERNEL` asks for the kernel (`1` / `on`, any case): off by default,
/// see the module doc.
pub fn asked() -> bool {
    super::residual_norm::parse_switch(std::env::var("MEMEXEC_HEAD_NORM_KERNEL").ok().as_deref())
}

/// The norms of one layer's heads.
pub struct HeadNorms<'a> {
    /// Query heads.
    pub heads: i32,
    /// Key / value heads.
    pub kv_heads: i32,
    /// Elements per head.
    pub head_dim: i32,
    /// `q_norm`.
    pub q: &'a RmsNorm,
    /// `k_norm`.
    pub k: &'a RmsNorm,
    /// `v_norm` (weightless in Gemma-4; the kernel takes only that form).
    pub v: &'a RmsNorm,
}

/// `q`, `k`, `v` (`[B, L, heads * head_dim]`) split into heads and normed, `[B, heads, L,
/// head_dim]` each: one kernel node when `kernel` is set (the model resolved [`available`] at
/// load) and the shapes are the kernel's, [`split_heads`] with MLX's `RMSNorm` otherwise. The
/// bits are the same either way.
pub fn norm_heads(
    q: &Array,
    k: &Array,
    v: &Array,
    n: &HeadNorms<'_>,
    kernel: bool,
) -> Result<[Array; 3]> {
    if kernel {
        if let Some(done) = fused(q, k, v, n)? {
            return Ok(done);
        }
    }
    Ok([
        split_heads(q, n.heads, n.head_dim, |q| n.q.forward(q))?,
        split_heads(k, n.kv_heads, n.head_dim, |k| n.k.forward(k))?,
        split_heads(v, n.kv_heads, n.head_dim, |v| n.v.forward(v))?,
    ])
}

/// [`norm_heads`]' kernel call, `None` when the shapes, dtypes or norms are not the kernel's.
fn fused(q: &Array, k: &Array, v: &Array, n: &HeadNorms<'_>) -> Result<Option<[Array; 3]>> {
    let dtype = q.dtype();
    let d = n.head_dim;
    let Some((threads, chunks)) = mlx_launch(d, dtype) else {
        return Ok(None);
    };
    let (Some(qw), Some(kw), None) = (n.q.weight(), n.k.weight(), n.v.weight()) else {
        return Ok(None);
    };
    let eps = n.q.eps();
    let b = q.dim(0);
    // One position per row, each row contiguous (the fused product's views are), the norms'
    // epsilon shared, the weights `[head_dim]` of the activations' dtype.
    let row_fits = |a: &Array, heads: i32| {
        a.shape() == [b, 1, heads * d] && a.dtype() == dtype && a.strides()[2] == 1
    };
    let weight_fits = |w: &Array| w.shape() == [d] && w.dtype() == dtype && w.strides() == [1];
    let fits = b > 0
        && row_fits(q, n.heads)
        && row_fits(k, n.kv_heads)
        && row_fits(v, n.kv_heads)
        && weight_fits(qw)
        && weight_fits(kw)
        && n.k.eps() == eps
        && n.v.eps() == eps;
    if !fits {
        return Ok(None);
    }
    let blocks = b * (n.heads + 2 * n.kv_heads);
    let q_shape = [b, n.heads, 1, d];
    let kv_shape = [b, n.kv_heads, 1, d];
    let out = kernel()?.apply(
        &[q, k, v, qw, kw],
        &[(&q_shape, dtype), (&kv_shape, dtype), (&kv_shape, dtype)],
        [blocks * threads, 1, 1],
        [threads, 1, 1],
        &[
            ("T", TemplateArg::Dtype(dtype)),
            ("D", TemplateArg::Int(d)),
            ("BLOCK", TemplateArg::Int(threads)),
            ("CHUNKS", TemplateArg::Int(chunks)),
            ("EPS_BITS", TemplateArg::Int(eps.to_bits() as i32)),
            ("HQ", TemplateArg::Int(n.heads)),
            ("HK", TemplateArg::Int(n.kv_heads)),
        ],
    )?;
    let [qn, kn, vn]: [Array; 3] = out
        .try_into()
        .map_err(|_| Error::Internal("head norms: not three outputs".into()))?;
    Ok(Some([qn, kn, vn]))
}

/// Whether the kernel runs here and gives MLX's bits ([`self_check`]), asked once per thread;
/// `MEMEXEC_HEAD_NORM_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_HEAD_NORM_KERNEL",
        "head norms",
        "MLX's ops",
        self_check,
    )
}

/// Runs the kernel against MLX's ops — bf16 heads of Gemma-4 e4b's sliding (256) and full (512)
/// layers, one row and three rows (the three taken as views of one fused product, as the model
/// passes them), and f32 heads of 64 (the f32 fixtures' kind) — and fails where it cannot compile
/// or run (not an MLX CUDA build) or where any element's bits differ.
pub fn self_check() -> Result<()> {
    let mut lcg = super::check_values::Lcg::new(0x51ed_270b);
    for (d, dtype, rows) in [
        (256, Dtype::Bfloat16, 1),
        (512, Dtype::Bfloat16, 3),
        (64, Dtype::Float32, 2),
    ] {
        let (heads, kv_heads) = (8, 2);
        let mut draw = |shape: &[i32], lo: f32, span: f32| -> Result<Array> {
            Ok(lcg.bf16(shape, lo, span)?.as_dtype(dtype)?)
        };
        let product = draw(&[rows, 1, (heads + 2 * kv_heads) * d], -30.0, 60.0)?;
        let parts =
            mlx_rs::ops::split_at_indices(&product, &[heads * d, (heads + kv_heads) * d], -1)?;
        let [q, k, v] = [&parts[0], &parts[1], &parts[2]];
        let qn = RmsNorm::from_weight(draw(&[d], 0.0, 2.0)?, 1e-6);
        let kn = RmsNorm::from_weight(draw(&[d], 0.0, 2.0)?, 1e-6);
        let vn = RmsNorm::without_weight(1e-6);
        let norms = HeadNorms {
            heads,
            kv_heads,
            head_dim: d,
            q: &qn,
            k: &kn,
            v: &vn,
        };
        let ours = fused(q, k, v, &norms)?.ok_or_else(|| {
            Error::Internal(format!("head norms: self-check shape rejected (d {d})"))
        })?;
        let theirs = norm_heads(q, k, v, &norms, false)?;
        for (a, b) in ours.iter().zip(&theirs) {
            if a.shape() != b.shape() || !a.eq_values(b)? {
                return Err(Error::Internal(format!(
                    "head norms: output differs from MLX's ops ({dtype:?}, head dim {d})"
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

    fn norms<'a>(q: &'a RmsNorm, k: &'a RmsNorm, v: &'a RmsNorm) -> HeadNorms<'a> {
        HeadNorms {
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            q,
            k,
            v,
        }
    }

    #[test]
    fn shapes_outside_the_kernel_take_mlx_ops() {
        let f = Dtype::Float32;
        let w = RmsNorm::from_weight(zeros(&[64], f), 1e-6);
        let plain = RmsNorm::without_weight(1e-6);
        let (q, kv) = (zeros(&[1, 1, 512], f), zeros(&[1, 1, 128], f));
        let n = norms(&w, &w, &plain);
        // The kernel's shapes are taken (on a CPU build the call then fails: no CUDA).
        assert!(fused(&q, &kv, &kv, &n).is_err() || fused(&q, &kv, &kv, &n).unwrap().is_some());
        // Several positions (a prefill); a weighted value norm; a weightless query norm; another
        // epsilon; a weight of another dtype.
        let q2 = zeros(&[1, 2, 512], f);
        let kv2 = zeros(&[1, 2, 128], f);
        assert!(fused(&q2, &kv2, &kv2, &n).unwrap().is_none());
        assert!(fused(&q, &kv, &kv, &norms(&w, &w, &w)).unwrap().is_none());
        assert!(fused(&q, &kv, &kv, &norms(&plain, &w, &plain))
            .unwrap()
            .is_none());
        let eps = RmsNorm::from_weight(zeros(&[64], f), 1e-5);
        assert!(fused(&q, &kv, &kv, &norms(&w, &eps, &plain))
            .unwrap()
            .is_none());
        let w16 = RmsNorm::from_weight(zeros(&[64], Dtype::Bfloat16), 1e-6);
        assert!(fused(&q, &kv, &kv, &norms(&w16, &w, &plain))
            .unwrap()
            .is_none());
    }

    #[test]
    fn without_the_kernel_the_heads_are_split_and_normed() {
        // Two heads of 2: [3, 4 | 0, 2] → head norms w * x / rms(x).
        let q = Array::from_slice(&[3.0f32, 4.0, 0.0, 2.0], &[1, 1, 4]);
        let w = RmsNorm::from_weight(Array::from_slice(&[1.0f32, 2.0], &[2]), 0.0);
        let plain = RmsNorm::without_weight(0.0);
        let n = HeadNorms {
            heads: 2,
            kv_heads: 2,
            head_dim: 2,
            q: &w,
            k: &w,
            v: &plain,
        };
        let [qn, _, vn] = norm_heads(&q, &q, &q, &n, false).unwrap();
        assert_eq!(qn.shape(), [1, 2, 1, 2]);
        let r0 = (12.5f32).sqrt();
        let r1 = (2.0f32).sqrt();
        let want_q = [3.0 / r0, 2.0 * 4.0 / r0, 0.0, 2.0 * 2.0 / r1];
        let want_v = [3.0 / r0, 4.0 / r0, 0.0, 2.0 / r1];
        for (got, want) in [(qn, want_q), (vn, want_v)] {
            let got: Vec<f32> = got.as_slice().to_vec();
            for (g, e) in got.iter().zip(want) {
                assert!((g - e).abs() < 1e-5, "{got:?} vs {want:?}");
            }
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
    fn the_source_goes_without_comment_lines() {
        let s = crate::model::row_kernel::without_comment_lines(SOURCE);
        assert!(!s.contains("// "));
        assert!(s.contains("const float normalizer"));
    }
}
