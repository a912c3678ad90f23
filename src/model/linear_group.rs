//! Linear layers that read the same input (a layer's `q_proj` / `k_proj` / `v_proj`, its
//! `gate_proj` / `up_proj`), run as ONE quantized product when they can be.
//!
//! Why: a GPU decode step is bound by kernel launches and host work, not arithmetic. One
//! `quantized_matmul` over the parts' weights concatenated along the output axis replaces N
//! launches by one; each part's output is a view (a split of the last axis) of the product.
//!
//! Exactness: MLX's affine-quantized kernels compute every output element from its own weight
//! row, scales and biases, summing over the input axis in an order that does not depend on how
//! many output rows the matrix has. So the slices of the fused product are bit-identical to
//! the separate products (tests/model_fused.rs checks the kernel over shapes, and whole models
//! against unfused loads). That argument holds only for packed matrices of one layout, so a
//! group fuses only when every part is affine-quantized with the same bits, group size,
//! scale / bias dtypes and input width. Dense matrices never fuse: the BLAS picks kernels by
//! matrix size, so a row's rounding could depend on the output width.
//!
//! LoRA: adapters still apply per module path, on each part's own slice, through the same
//! function a lone [`Linear`] uses, so adapted outputs are unchanged too. Every part keeps its
//! path and shape for adapter validation ([`LinearGroup::visit`]).
use std::sync::OnceLock;

use mlx_rs::Array;

use super::config::QuantConfig;
use super::linear::{with_adapters, Linear, LinearShape, QuantizedMatrix};
use super::weights::Weights;
use super::ForwardCtx;
use crate::error::{Error, Result};

/// Whether loads fuse projections unless told otherwise: yes, except with
/// `MEMEXEC_FUSE_PROJECTIONS=0` (also `false` / `off` / `no`). Read once per process; a switch
/// for measuring the unfused graph. [`crate::model::LoadOptions`] overrides it per load.
pub fn fuse_projections_default() -> bool {
    static FUSE: OnceLock<bool> = OnceLock::new();
    *FUSE.get_or_init(|| fuse_from_env(std::env::var("MEMEXEC_FUSE_PROJECTIONS").ok().as_deref()))
}

/// [`fuse_projections_default`] for a value of the variable (`None`: unset).
fn fuse_from_env(value: Option<&str>) -> bool {
    value.is_none_or(|v| {
        let v = v.trim();
        !["0", "false", "off", "no"]
            .iter()
            .any(|off| v.eq_ignore_ascii_case(off))
    })
}

/// One module of a fused group: what it is called and its shape.
struct Part {
    path: String,
    in_dim: i32,
    out_dim: i32,
}

enum Form<const N: usize> {
    /// One product; part `i`'s outputs are the columns between `split_at[i - 1]` and
    /// `split_at[i]` (the parts in order, back to back).
    Fused {
        matrix: QuantizedMatrix,
        parts: [Part; N],
        split_at: Vec<i32>,
    },
    /// Each part on its own: fusion is off, or the parts cannot share one kernel.
    Separate([Linear; N]),
}

/// `N` linear layers over the same input, fused into one quantized product where possible.
pub struct LinearGroup<const N: usize> {
    form: Form<N>,
}

impl<const N: usize> LinearGroup<N> {
    /// Takes the `N` modules `parts` (path, output features), each reading `in_dim` inputs,
    /// out of `w`, and fuses them when `fuse` is set and they are fusable (see the module
    /// docs). A fused matrix is built and evaluated here, and the parts' tensors are released,
    /// so the load never holds both copies of more than one group.
    pub fn load(
        w: &mut Weights,
        quant: &QuantConfig,
        parts: [(&str, i32); N],
        in_dim: i32,
        fuse: bool,
    ) -> Result<LinearGroup<N>> {
        let mut layers = Vec::with_capacity(N);
        for (path, out_dim) in parts {
            layers.push(Linear::load(w, quant, path, in_dim, out_dim)?);
        }
        let layers: [Linear; N] = layers
            .try_into()
            .map_err(|_| Error::Internal("linear group: wrong number of parts".into()))?;
        let form = if fuse && N > 1 && fusable(&layers) {
            fused(w, layers)?
        } else {
            Form::Separate(layers)
        };
        Ok(LinearGroup { form })
    }

    /// Whether the parts run as one product.
    pub fn is_fused(&self) -> bool {
        matches!(self.form, Form::Fused { .. })
    }

    /// Each part's `x W^T` over the last axis of `x`, in load order, with the LoRA deltas of
    /// `ctx` added per part exactly as [`Linear::forward`] adds them.
    pub fn forward(&self, x: &Array, ctx: &ForwardCtx) -> Result<[Array; N]> {
        let outs = match &self.form {
            Form::Separate(layers) => layers
                .iter()
                .map(|l| l.forward(x, ctx))
                .collect::<Result<Vec<_>>>()?,
            Form::Fused {
                matrix,
                parts,
                split_at,
            } => {
                // One Split node: N views of the product, no copies.
                let y = matrix.matmul(x, ctx)?.split_at_indices(split_at, -1)?;
                parts
                    .iter()
                    .zip(y)
                    .map(|(p, y)| with_adapters(&p.path, x, y, ctx))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        outs.try_into()
            .map_err(|_| Error::Internal("linear group: wrong number of outputs".into()))
    }

    /// Calls `f` on every part, in load order, fused or not.
    pub fn visit(&self, f: &mut dyn FnMut(LinearShape<'_>)) {
        match &self.form {
            Form::Separate(layers) => layers.iter().for_each(|l| f(l.shape())),
            Form::Fused { parts, .. } => parts.iter().for_each(|p| {
                f(LinearShape {
                    path: &p.path,
                    in_dim: p.in_dim,
                    out_dim: p.out_dim,
                })
            }),
        }
    }
}

/// Whether `layers` can run as one quantized product with bit-identical slices: all packed,
/// with one set of quantization parameters, scale and bias dtypes and input width.
fn fusable(layers: &[Linear]) -> bool {
    let Some(head) = layers.first() else {
        return false;
    };
    let Some(first) = head.quantized() else {
        return false;
    };
    layers.iter().all(|l| {
        l.quantized().is_some_and(|q| {
            q.params == first.params
                && q.scales.dtype() == first.scales.dtype()
                && q.biases.dtype() == first.biases.dtype()
                && q.weight.dtype() == first.weight.dtype()
                && q.weight.dim(1) == first.weight.dim(1)
                && l.in_dim() == head.in_dim()
        })
    })
}

/// Concatenates the packed tensors of `layers` (all [`fusable`]) along the output axis,
/// evaluates the result and releases the parts from `w`.
fn fused<const N: usize>(w: &mut Weights, layers: [Linear; N]) -> Result<Form<N>> {
    let mut weights = Vec::with_capacity(N);
    let mut scales = Vec::with_capacity(N);
    let mut biases = Vec::with_capacity(N);
    let mut split_at = Vec::with_capacity(N.saturating_sub(1));
    let mut params = None;
    let mut end = 0;
    for l in &layers {
        let q = l
            .quantized()
            .ok_or_else(|| Error::Internal(format!("{}: fusing a dense matrix", l.path())))?;
        weights.push(q.weight.clone());
        scales.push(q.scales.clone());
        biases.push(q.biases.clone());
        params = Some(q.params);
        end += l.out_dim();
        split_at.push(end);
    }
    // The last boundary is the end of the product, not a split.
    split_at.pop();
    let params = params.ok_or_else(|| Error::Internal("linear group: no parts".into()))?;
    let concat = |parts: &[Array]| mlx_rs::ops::concatenate(parts, 0);
    let matrix = QuantizedMatrix {
        weight: concat(&weights)?,
        scales: concat(&scales)?,
        biases: concat(&biases)?,
        params,
    };
    // Read the parts and build the fused copy now, then forget the parts: `w` would otherwise
    // keep them alive until `finish`, doubling these matrices' memory during the load.
    mlx_rs::transforms::eval([&matrix.weight, &matrix.scales, &matrix.biases])?;
    for l in &layers {
        for name in l.tensor_names() {
            w.release(&name);
        }
    }
    let parts = layers.map(|l| Part {
        path: l.path().to_string(),
        in_dim: l.in_dim(),
        out_dim: l.out_dim(),
    });
    Ok(Form::Fused {
        matrix,
        parts,
        split_at,
    })
}

#[cfg(test)]
mod tests {
    use super::fuse_from_env;

    #[test]
    fn the_env_switch_only_turns_fusion_off() {
        assert!(fuse_from_env(None));
        assert!(fuse_from_env(Some("1")));
        assert!(fuse_from_env(Some("")));
        for off in ["0", " 0 ", "false", "OFF", "no"] {
            assert!(!fuse_from_env(Some(off)), "{off:?}");
        }
    }
}
