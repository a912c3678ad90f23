//! RMS normalizations. The naming carries the convention: Gemma-4 multiplies by the stored
//! weight ([`RmsNorm`]), Gemma-2/3 by `1 + weight` ([`GemmaRmsNorm`]).
use mlx_rs::fast::rms_norm;
use mlx_rs::Array;

use super::weights::Weights;
use crate::error::Result;

/// `x * rsqrt(mean(x^2) + eps) * weight` over the last axis; no weight = `v_norm`'s plain form.
pub struct RmsNorm {
    weight: Option<Array>,
    eps: f32,
}

impl RmsNorm {
    /// Takes `{path}.weight` (`[dim]`) out of `w`.
    pub fn load(w: &mut Weights, path: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Some(w.take_float(&format!("{path}.weight"), &[dim])?),
            eps,
        })
    }

    /// A norm without a learned scale.
    pub fn without_weight(eps: f32) -> RmsNorm {
        RmsNorm { weight: None, eps }
    }

    /// A norm with this `[dim]` weight (for the kernels' self-checks and tests).
    pub fn from_weight(weight: Array, eps: f32) -> RmsNorm {
        RmsNorm {
            weight: Some(weight),
            eps,
        }
    }

    /// The learned scale, if any.
    pub fn weight(&self) -> Option<&Array> {
        self.weight.as_ref()
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// Normalizes over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(rms_norm(x, self.weight.as_ref(), self.eps)?)
    }
}

/// Gemma-3's RMSNorm: the checkpoint stores `w`, the scale applied is `1 + w`.
pub struct GemmaRmsNorm {
    /// `1 + w`, precomputed at load in the weight's dtype (as mlx-lm computes it per call).
    scale: Array,
    eps: f32,
}

impl GemmaRmsNorm {
    /// Takes `{path}.weight` (`[dim]`) out of `w`.
    pub fn load(w: &mut Weights, path: &str, dim: i32, eps: f32) -> Result<GemmaRmsNorm> {
        let weight = w.take_float(&format!("{path}.weight"), &[dim])?;
        let one = Array::from_f32(1.0).as_dtype(weight.dtype())?;
        let scale = one.add(&weight)?;
        scale.eval()?;
        Ok(GemmaRmsNorm { scale, eps })
    }

    /// Normalizes over the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(rms_norm(x, Some(&self.scale), self.eps)?)
    }
}
