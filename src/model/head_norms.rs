//! A decoder layer's query / key / value head norms, and the queries' and keys' RoPE, as one
//! node on MLX CUDA, with the bits of MLX's `RMSNorm` and `RoPE`.
//!
//! Why: a serial decode step is bound by MLX's host work per graph node. A Gemma-4 layer with its
//! own keys and values norms the heads of its fused q/k/v product three times (`q_norm`,
//! `k_norm`, the weightless `v_norm`), each after a reshape into heads, and rotates the queries
//! and keys: five kernel nodes and three views in each of the e4b's 24 such layers, two kernel
//! nodes and a view in each of its 18 layers that only have queries. `kernels/head_norms.cu`
//! does a layer's in one node. Each norm is MLX 0.32.2's `rms_norm_small` arithmetic (the
//! arithmetic [`super::residual_norm`]'s kernel mirrors, bit-exact on the H200 in session 10);
//! the rotation is MLX's `rope` kernel's, whose f32 products MLX's nvcc build may contract into
//! fmas differently from NVRTC, so the kernel has four ways to write them and [`rope_variant`]
//! takes the first whose bits equal MLX's at load (none: the rotation stays MLX's op).
//! [`self_check`] compares the norms bit for bit; the numbers stay MLX's (mlx-lm's).
//!
//! Off unless `MEMEXEC_HEAD_NORM_KERNEL=1` ([`asked`]): it saves up to 114 kernel nodes per
//! one-row e4b step, worth having only where a custom-kernel call costs the host what an MLX op
//! does (called precompiled, [`super::precompiled`]), which a device has yet to measure
//! (`scripts/gpu/kernel_calls_ab.sh`).
//!
//! [`norm_rotate_heads`] is the one entry point: the kernel where the model resolved it at load
//! ([`available`]) and the shapes are the kernel's (one position per row), MLX's ops otherwise.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use super::attention::{split_heads, RowOffsets};
use super::norm::RmsNorm;
use super::precompiled::Kernel;
use super::residual_norm::{mlx_launch, weight_fits};
use super::rope::{Rope, RopeFreqs};
use crate::error::{Error, Result};
use crate::mlx_ffi::{kernel_in, TemplateArg};

const SOURCE: &str = include_str!("kernels/head_norms.cu");

/// Beyond MLX's default header (which has `cooperative_groups.h`): `cg::reduce`, and the type
/// test of the generic rounding helpers.
const HEADER: &str = "#include <cooperative_groups/reduce.h>\n#include <cuda/std/type_traits>\n";

/// The ways [`kernels/head_norms.cu`] can write the rotation's products (its `VARIANT`), in the
/// order [`rope_variant`] tries them: as MLX's source writes them, then each contraction.
pub const ROPE_VARIANTS: [i32; 4] = [0, 1, 2, 3];

thread_local! {
    /// The norms-only kernel (queries, keys, values), made on first use (see [`kernel_in`]).
    static NORMS: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// Norms and rotation, queries, keys and values.
    static ROTATE: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// Norm and rotation of queries alone (layers that share another layer's keys).
    static ROTATE_Q: RefCell<Option<Rc<Kernel>>> = const { RefCell::new(None) };
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
    /// [`rope_variant`]'s answer on this thread, once asked.
    static ROPE_VARIANT: Cell<Option<Option<i32>>> = const { Cell::new(None) };
    /// The f32 scalar passed as `freqs` where the rotation has a base instead.
    static NO_FREQS: RefCell<Option<Array>> = const { RefCell::new(None) };
}

/// The source of a variant of the kernel: `nullptr` declarations of what it lacks, then the
/// body without its comment lines.
pub fn source(rope: bool, kv: bool) -> String {
    let mut s = String::new();
    if !rope {
        s.push_str("const int32_t* offsets = nullptr;\nconst float* freqs = nullptr;\n");
    }
    if !kv {
        s.push_str("T* kn = nullptr;\nT* vn = nullptr;\n");
    }
    s + &super::row_kernel::without_comment_lines(SOURCE)
}

fn kernel(rope: bool, kv: bool) -> Result<Rc<Kernel>> {
    let (slot, name, inputs, outputs): (_, _, &[&str], &[&str]) = match (rope, kv) {
        (false, _) => (
            &NORMS,
            "memexec_head_norms",
            &["q", "k", "v", "qw", "kw"],
            &["qn", "kn", "vn"],
        ),
        (true, true) => (
            &ROTATE,
            "memexec_head_norms_rope",
            &["q", "k", "v", "qw", "kw", "offsets", "freqs"],
            &["qn", "kn", "vn"],
        ),
        (true, false) => (
            &ROTATE_Q,
            "memexec_head_norms_rope_q",
            &["q", "k", "v", "qw", "kw", "offsets", "freqs"],
            &["qn"],
        ),
    };
    kernel_in(slot, || {
        Kernel::new(name, inputs, outputs, &source(rope, kv), HEADER, false)
    })
}

/// Whether `MEMEXEC_HEAD_NORM_KERNEL` asks for the kernel (`1` / `on`, any case): off by default,
/// see the module doc.
pub fn asked() -> bool {
    super::residual_norm::parse_switch(std::env::var("MEMEXEC_HEAD_NORM_KERNEL").ok().as_deref())
}

/// One layer's heads and their norms.
pub struct HeadNorms<'a> {
    /// Query heads.
    pub heads: i32,
    /// Key / value heads.
    pub kv_heads: i32,
    /// Elements per head.
    pub head_dim: i32,
    /// `q_norm`.
    pub q: &'a RmsNorm,
    /// `k_norm` and `v_norm` (weightless in Gemma-4; the kernel takes only that form), for a
    /// layer with its own keys and values.
    pub kv: Option<(&'a RmsNorm, &'a RmsNorm)>,
}

/// The queries `q` `[B, L, heads * head_dim]` and, for a layer with its own keys and values, `kv`
/// (each `[B, L, kv_heads * head_dim]`) split into heads and normed, queries and keys rotated by
/// `rope` at each row's offset: `[B, heads, L, head_dim]` each. One kernel node when `kernel` is
/// set (the model resolved [`available`] at load) and the shapes are the kernel's (the rotation
/// too where [`rope_variant`] found one), [`split_heads`] with MLX's `RMSNorm` and `RoPE`
/// otherwise. The bits are the same either way.
pub fn norm_rotate_heads(
    q: &Array,
    kv: Option<(&Array, &Array)>,
    n: &HeadNorms<'_>,
    rope: &Rope,
    offsets: &mut RowOffsets,
    kernel: bool,
) -> Result<(Array, Option<(Array, Array)>)> {
    if kv.is_some() != n.kv.is_some() {
        return Err(Error::Internal(
            "head norms: keys / values without their norms, or norms without them".into(),
        ));
    }
    if kernel {
        if let Some(variant) = rope_variant() {
            if let Some(done) = fused(q, kv, n, Some((rope, &mut *offsets, variant)))? {
                return Ok(done);
            }
        }
        if kv.is_some() {
            if let Some((qn, kvn)) = fused(q, kv, n, None)? {
                let q = offsets.rotate(rope, &qn)?;
                let kv = match kvn {
                    Some((k, v)) => Some((offsets.rotate(rope, &k)?, v)),
                    None => None,
                };
                return Ok((q, kv));
            }
        }
    }
    let qn = split_heads(q, n.heads, n.head_dim, |q| n.q.forward(q))?;
    let q = offsets.rotate(rope, &qn)?;
    let kv = match (kv, n.kv) {
        (Some((k, v)), Some((k_norm, v_norm))) => {
            let k = split_heads(k, n.kv_heads, n.head_dim, |k| k_norm.forward(k))?;
            let v = split_heads(v, n.kv_heads, n.head_dim, |v| v_norm.forward(v))?;
            Some((offsets.rotate(rope, &k)?, v))
        }
        _ => None,
    };
    Ok((q, kv))
}

/// The template constants of a rotation: `ROPE`, `FREQS`, `LOG2_BASE_BITS`, `SCALE_BITS`,
/// `OFFSET_STRIDE`, `VARIANT`, and the `offsets` / `freqs` inputs; `None` where the rotation is
/// not the kernel's (traditional, partial, offsets not one per row).
fn rotation_args(
    rope: &Rope,
    offsets: &mut RowOffsets,
    variant: i32,
    rows: i32,
    head_dim: i32,
) -> Result<Option<([i32; 6], Array, Array)>> {
    let Some((dims, freqs, scale)) = rope.rotate_half_form() else {
        return Ok(None);
    };
    let Some(offsets) = offsets.array() else {
        return Ok(None);
    };
    let stride = match offsets.size() as i32 {
        1 => 0,
        n if n == rows && offsets.ndim() == 1 => 1,
        _ => return Ok(None),
    };
    if dims != head_dim || offsets.dtype() != Dtype::Int32 {
        return Ok(None);
    }
    let (has_freqs, log2_base, freqs) = match freqs {
        RopeFreqs::Periods(f) => {
            let fits = f.shape() == [head_dim / 2] && f.dtype() == Dtype::Float32;
            if !fits || f.strides() != [1] {
                return Ok(None);
            }
            (1, 0, f.clone())
        }
        RopeFreqs::Log2Base(lb) => (0, lb.to_bits() as i32, no_freqs()?),
    };
    let consts = [
        1,
        has_freqs,
        log2_base,
        scale.to_bits() as i32,
        stride,
        variant,
    ];
    Ok(Some((consts, offsets.clone(), freqs)))
}

/// The f32 scalar passed as `freqs` where the rotation has a base instead (one per thread).
fn no_freqs() -> Result<Array> {
    NO_FREQS.with(|slot| {
        if let Some(a) = slot.borrow().as_ref() {
            return Ok(a.clone());
        }
        let a = Array::from_f32(0.0);
        a.eval()?;
        *slot.borrow_mut() = Some(a.clone());
        Ok(a)
    })
}

/// The kernel call of [`norm_rotate_heads`], with the rotation when `rotation` is given; `None`
/// when the shapes, dtypes, norms or rotation are not the kernel's.
#[allow(clippy::type_complexity)]
fn fused(
    q: &Array,
    kv: Option<(&Array, &Array)>,
    n: &HeadNorms<'_>,
    rotation: Option<(&Rope, &mut RowOffsets, i32)>,
) -> Result<Option<(Array, Option<(Array, Array)>)>> {
    let dtype = q.dtype();
    let d = n.head_dim;
    let Some((threads, chunks)) = mlx_launch(d, dtype) else {
        return Ok(None);
    };
    let Some(qw) = n.q.weight() else {
        return Ok(None);
    };
    let eps = n.q.eps();
    let b = q.dim(0);
    // One position per row, each row contiguous (the fused product's views are), the norms'
    // epsilon shared, the weights `[head_dim]` of the activations' dtype.
    let row_fits = |a: &Array, heads: i32| {
        a.shape() == [b, 1, heads * d] && a.dtype() == dtype && a.strides()[2] == 1
    };
    if b < 1 || !row_fits(q, n.heads) || !weight_fits(qw, d, dtype) {
        return Ok(None);
    }
    // Layers without keys pass the queries (and their weight) where the kernel names keys and
    // values: it never reads them (HK 0).
    let (k, v, kw, kv_heads) = match (kv, n.kv) {
        (Some((k, v)), Some((k_norm, v_norm))) => {
            let Some(kw) = k_norm.weight() else {
                return Ok(None);
            };
            let fits = row_fits(k, n.kv_heads)
                && row_fits(v, n.kv_heads)
                && weight_fits(kw, d, dtype)
                && v_norm.weight().is_none()
                && k_norm.eps() == eps
                && v_norm.eps() == eps;
            if !fits {
                return Ok(None);
            }
            (k, v, kw, n.kv_heads)
        }
        (None, None) => (q, q, qw, 0),
        _ => return Ok(None),
    };
    let rotated = match rotation {
        Some((rope, offsets, variant)) => match rotation_args(rope, offsets, variant, b, d)? {
            Some(args) => Some(args),
            None => return Ok(None),
        },
        None if kv_heads == 0 => return Ok(None), // nothing to save
        None => None,
    };
    let consts = rotated.as_ref().map_or([0; 6], |(c, _, _)| *c);
    let mut inputs = vec![q, k, v, qw, kw];
    if let Some((_, offsets, freqs)) = &rotated {
        inputs.extend([offsets, freqs]);
    }
    let blocks = b * (n.heads + 2 * kv_heads);
    let q_shape = [b, n.heads, 1, d];
    let kv_shape = [b, kv_heads, 1, d];
    let outputs: Vec<(&[i32], Dtype)> = if kv_heads > 0 {
        vec![(&q_shape, dtype), (&kv_shape, dtype), (&kv_shape, dtype)]
    } else {
        vec![(&q_shape, dtype)]
    };
    let names = [
        "ROPE",
        "FREQS",
        "LOG2_BASE_BITS",
        "SCALE_BITS",
        "OFFSET_STRIDE",
        "VARIANT",
    ];
    let mut template = vec![
        ("T", TemplateArg::Dtype(dtype)),
        ("D", TemplateArg::Int(d)),
        ("BLOCK", TemplateArg::Int(threads)),
        ("CHUNKS", TemplateArg::Int(chunks)),
        ("EPS_BITS", TemplateArg::Int(eps.to_bits() as i32)),
        ("HQ", TemplateArg::Int(n.heads)),
        ("HK", TemplateArg::Int(kv_heads)),
    ];
    template.extend(names.into_iter().zip(consts.map(TemplateArg::Int)));
    let mut out = kernel(rotated.is_some(), kv_heads > 0)?.apply(
        &inputs,
        &outputs,
        [blocks * threads, 1, 1],
        [threads, 1, 1],
        &template,
    )?;
    let missing = || Error::Internal("head norms: missing outputs".into());
    let kv_out = if kv_heads > 0 {
        let vn = out.pop().ok_or_else(missing)?;
        let kn = out.pop().ok_or_else(missing)?;
        Some((kn, vn))
    } else {
        None
    };
    let qn = out.pop().ok_or_else(missing)?;
    Ok(Some((qn, kv_out)))
}

/// Whether the kernel's norms run here and give MLX's bits ([`self_check`]), asked once per
/// thread; `MEMEXEC_HEAD_NORM_KERNEL=0` says no without asking. Logged once when it does not.
pub fn available() -> bool {
    super::check_values::passes_once(
        &AVAILABLE,
        "MEMEXEC_HEAD_NORM_KERNEL",
        "head norms",
        "MLX's ops",
        self_check,
    )
}

/// The first of [`ROPE_VARIANTS`] whose rotation gives MLX's bits ([`rope_check`]), asked once
/// per thread where [`available`]; `None` (logged once) where none does: the kernel then norms
/// and MLX's `RoPE` rotates.
pub fn rope_variant() -> Option<i32> {
    ROPE_VARIANT.with(|known| {
        if let Some(answer) = known.get() {
            return answer;
        }
        let answer = if available() {
            let found = ROPE_VARIANTS.into_iter().find(|&v| rope_check(v).is_ok());
            match found {
                Some(v) => tracing::info!(variant = v, "head norms: the kernel rotates too"),
                None => tracing::info!(
                    "head norms: no rotation variant gives MLX's bits; MLX's RoPE rotates"
                ),
            }
            found
        } else {
            None
        };
        known.set(Some(answer));
        answer
    })
}

/// Deterministic q/k/v projections `[rows, 1, (heads + 2 * kv_heads) * d]` as the fused
/// product's three views, and norm weights.
fn check_inputs(
    lcg: &mut super::check_values::Lcg,
    rows: i32,
    d: i32,
    dtype: Dtype,
    heads: i32,
    kv_heads: i32,
) -> Result<(Vec<Array>, RmsNorm, RmsNorm)> {
    let product = lcg
        .bf16(&[rows, 1, (heads + 2 * kv_heads) * d], -30.0, 60.0)?
        .as_dtype(dtype)?;
    let parts = mlx_rs::ops::split_at_indices(&product, &[heads * d, (heads + kv_heads) * d], -1)?;
    let qn = RmsNorm::from_weight(lcg.bf16(&[d], 0.0, 2.0)?.as_dtype(dtype)?, 1e-6);
    let kn = RmsNorm::from_weight(lcg.bf16(&[d], 0.0, 2.0)?.as_dtype(dtype)?, 1e-6);
    Ok((parts, qn, kn))
}

/// Compares two outputs of [`norm_rotate_heads`] bit for bit.
fn same(
    ours: &(Array, Option<(Array, Array)>),
    theirs: &(Array, Option<(Array, Array)>),
) -> Result<bool> {
    let pairs = match (&ours.1, &theirs.1) {
        (Some((a, b)), Some((c, e))) => vec![(&ours.0, &theirs.0), (a, c), (b, e)],
        (None, None) => vec![(&ours.0, &theirs.0)],
        _ => return Ok(false),
    };
    for (a, b) in pairs {
        if a.shape() != b.shape() || !a.eq_values(b)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs the norms-only kernel against MLX's ops — bf16 heads of Gemma-4 e4b's sliding (256) and
/// full (512) layers, one row and three rows, as views of one fused product, and f32 heads of 64
/// (the f32 fixtures' kind) — and fails where it cannot compile or run (not an MLX CUDA build)
/// or where any element's bits differ.
pub fn self_check() -> Result<()> {
    let mut lcg = super::check_values::Lcg::new(0x51ed_270b);
    for (d, dtype, rows) in [
        (256, Dtype::Bfloat16, 1),
        (512, Dtype::Bfloat16, 3),
        (64, Dtype::Float32, 2),
    ] {
        let (parts, qn, kn) = check_inputs(&mut lcg, rows, d, dtype, 8, 2)?;
        let vn = RmsNorm::without_weight(1e-6);
        let n = HeadNorms {
            heads: 8,
            kv_heads: 2,
            head_dim: d,
            q: &qn,
            kv: Some((&kn, &vn)),
        };
        let kv = Some((&parts[1], &parts[2]));
        let ours = fused(&parts[0], kv, &n, None)?.ok_or_else(|| {
            Error::Internal(format!("head norms: self-check shape rejected (d {d})"))
        })?;
        let theirs = (
            split_heads(&parts[0], 8, d, |q| qn.forward(q))?,
            Some((
                split_heads(&parts[1], 2, d, |k| kn.forward(k))?,
                split_heads(&parts[2], 2, d, |v| vn.forward(v))?,
            )),
        );
        if !same(&ours, &theirs)? {
            return Err(Error::Internal(format!(
                "head norms: output differs from MLX's ops ({dtype:?}, head dim {d})"
            )));
        }
    }
    Ok(())
}

/// Runs the kernel with rotation `variant` against MLX's norms and `RoPE` — Gemma-4 e4b's
/// sliding heads (256, base 10000) at one offset, its full heads (512, proportional RoPE) over
/// three rows at offsets up to 30000, and a layer of queries alone — and fails where any
/// element's bits differ.
pub fn rope_check(variant: i32) -> Result<()> {
    let mut lcg = super::check_values::Lcg::new(0x0c0f_fee5);
    let params = |rope_type: &str, theta: f32| super::config::RopeParams {
        rope_type: rope_type.into(),
        theta,
        partial_rotary_factor: 0.25,
        factor: 1.0,
    };
    for (d, rows, offsets, rope_type, theta, with_kv) in [
        (256, 1, vec![4321], "default", 10_000.0, true),
        (
            512,
            3,
            vec![7, 1234, 30_000],
            "proportional",
            1_000_000.0,
            true,
        ),
        (256, 1, vec![77], "default", 10_000.0, false),
    ] {
        let (parts, qn, kn) = check_inputs(&mut lcg, rows, d, Dtype::Bfloat16, 8, 2)?;
        let vn = RmsNorm::without_weight(1e-6);
        let rope = Rope::new(d, false, &params(rope_type, theta))?;
        let n = HeadNorms {
            heads: 8,
            kv_heads: 2,
            head_dim: d,
            q: &qn,
            kv: with_kv.then_some((&kn, &vn)),
        };
        let kv = with_kv.then_some((&parts[1], &parts[2]));
        let mut ours_at = RowOffsets::new(offsets.clone());
        let ours = fused(&parts[0], kv, &n, Some((&rope, &mut ours_at, variant)))?
            .ok_or_else(|| Error::Internal("head norms: rotation check rejected".into()))?;
        let mut theirs_at = RowOffsets::new(offsets);
        let theirs = norm_rotate_heads(&parts[0], kv, &n, &rope, &mut theirs_at, false)?;
        if !same(&ours, &theirs)? {
            return Err(Error::Internal(format!(
                "head norms: rotation variant {variant} differs from MLX's RoPE (head dim {d})"
            )));
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
            kv: Some((k, v)),
        }
    }

    #[test]
    fn shapes_outside_the_kernel_take_mlx_ops() {
        let f = Dtype::Float32;
        let w = RmsNorm::from_weight(zeros(&[64], f), 1e-6);
        let plain = RmsNorm::without_weight(1e-6);
        let (q, kv) = (zeros(&[1, 1, 512], f), zeros(&[1, 1, 128], f));
        let n = norms(&w, &w, &plain);
        let call = |q: &Array, kv: &Array, n: &HeadNorms<'_>| {
            fused(q, Some((kv, kv)), n, None).unwrap().is_none()
        };
        // The kernel's shapes are taken (on a CPU build the call then fails: no CUDA).
        assert!(fused(&q, Some((&kv, &kv)), &n, None).is_err());
        // Several positions (a prefill); a weighted value norm; a weightless query norm; another
        // epsilon; a weight of another dtype.
        assert!(call(&zeros(&[1, 2, 512], f), &zeros(&[1, 2, 128], f), &n));
        assert!(call(&q, &kv, &norms(&w, &w, &w)));
        assert!(call(&q, &kv, &norms(&plain, &w, &plain)));
        let eps = RmsNorm::from_weight(zeros(&[64], f), 1e-5);
        assert!(call(&q, &kv, &norms(&w, &eps, &plain)));
        let w16 = RmsNorm::from_weight(zeros(&[64], Dtype::Bfloat16), 1e-6);
        assert!(call(&q, &kv, &norms(&w16, &w, &plain)));
        // Queries alone save nothing without the rotation.
        let q_only = HeadNorms { kv: None, ..n };
        assert!(fused(&q, None, &q_only, None).unwrap().is_none());
    }

    #[test]
    fn a_rotation_outside_the_kernel_takes_mlx_ops() {
        let f = Dtype::Float32;
        let w = RmsNorm::from_weight(zeros(&[64], f), 1e-6);
        let plain = RmsNorm::without_weight(1e-6);
        let n = norms(&w, &w, &plain);
        let (q, kv) = (zeros(&[2, 1, 512], f), zeros(&[2, 1, 128], f));
        let params = |t: &str| crate::model::config::RopeParams {
            rope_type: t.into(),
            theta: 10_000.0,
            partial_rotary_factor: 0.25,
            factor: 1.0,
        };
        let rejected = |rope: &Rope, offsets: Vec<i32>| {
            let mut at = RowOffsets::new(offsets);
            fused(&q, Some((&kv, &kv)), &n, Some((rope, &mut at, 0)))
                .unwrap()
                .is_none()
        };
        // Traditional (interleaved) pairs; fewer rotated dims than the head's; offsets that are
        // not one per row.
        assert!(rejected(
            &Rope::new(64, true, &params("default")).unwrap(),
            vec![1, 2]
        ));
        assert!(rejected(
            &Rope::new(32, false, &params("default")).unwrap(),
            vec![1, 2]
        ));
        let rope = Rope::new(64, false, &params("default")).unwrap();
        assert!(rejected(&rope, vec![1, 2, 3]));
        // The kernel's rotation is taken (and fails here: no CUDA).
        let mut at = RowOffsets::new(vec![1, 2]);
        assert!(fused(&q, Some((&kv, &kv)), &n, Some((&rope, &mut at, 0))).is_err());
    }

    #[test]
    fn without_the_kernel_heads_are_split_normed_and_rotated_by_mlx() {
        let q = Array::from_slice(&[3.0f32, 4.0, 0.0, 2.0, 1.0, -1.0, 2.0, 0.5], &[1, 1, 8]);
        let w = RmsNorm::from_weight(Array::from_slice(&[1.0f32, 2.0, 0.5, 1.0], &[4]), 1e-6);
        let plain = RmsNorm::without_weight(1e-6);
        let n = HeadNorms {
            heads: 2,
            kv_heads: 2,
            head_dim: 4,
            q: &w,
            kv: Some((&w, &plain)),
        };
        let params = crate::model::config::RopeParams {
            rope_type: "default".into(),
            theta: 10_000.0,
            partial_rotary_factor: 1.0,
            factor: 1.0,
        };
        let rope = Rope::new(4, false, &params).unwrap();
        let mut at = RowOffsets::new(vec![5]);
        let (qr, kv) = norm_rotate_heads(&q, Some((&q, &q)), &n, &rope, &mut at, false).unwrap();
        let (kr, vn) = kv.unwrap();
        let heads = split_heads(&q, 2, 4, |x| w.forward(x)).unwrap();
        let want = rope.forward(&heads, 5).unwrap();
        assert_eq!(qr.shape(), [1, 2, 1, 4]);
        assert!(qr.eq_values(&want).unwrap() && kr.eq_values(&want).unwrap());
        let want_v = split_heads(&q, 2, 4, |x| plain.forward(x)).unwrap();
        assert!(vn.eq_values(&want_v).unwrap());
        // Queries alone; keys without their norms is an error.
        let q_only = HeadNorms { kv: None, ..n };
        let (q2, none) = norm_rotate_heads(&q, None, &q_only, &rope, &mut at, false).unwrap();
        assert!(q2.eq_values(&want).unwrap() && none.is_none());
        assert!(norm_rotate_heads(&q, Some((&q, &q)), &q_only, &rope, &mut at, false).is_err());
    }

    #[test]
    fn a_build_without_mlx_cuda_falls_back_to_mlx_ops() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernel may well work here
        }
        assert!(self_check().is_err());
        assert!(rope_check(0).is_err());
        assert!(!available());
        assert_eq!(rope_variant(), None);
    }

    #[test]
    fn each_variant_declares_what_it_lacks() {
        assert!(source(false, true).starts_with("const int32_t* offsets = nullptr;"));
        assert!(!source(false, true).contains("T* kn = nullptr;"));
        assert!(source(true, false).starts_with("T* kn = nullptr;\nT* vn = nullptr;\n"));
        let full = source(true, true);
        assert!(!full.contains("nullptr;\n") || !full.starts_with("const int32_t* offsets"));
        assert!(!full.contains("// ") && full.contains("const float normalizer"));
    }
}
