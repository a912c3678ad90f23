//! Rotary position embeddings (non-traditional = rotate-half unless configured otherwise).
use mlx_rs::fast::{rope, rope_dynamic};
use mlx_rs::ops::{concatenate, full, power};
use mlx_rs::Array;

use super::config::RopeParams;
use crate::error::{Error, Result};

/// How a RoPE's per-pair frequencies are given (see [`Rope::rotate_half_form`]).
pub enum RopeFreqs<'a> {
    /// Pair `i` of `dims / 2` turns at `exp2(-(i / (dims / 2)) * log2_base)` per position.
    Log2Base(f32),
    /// Pair `i` turns at `1 / periods[i]` per position (f32 `[dims / 2]`).
    Periods(&'a Array),
}

/// RoPE over the first `dims` features of the last axis, at a position offset.
pub struct Rope {
    dims: i32,
    traditional: bool,
    /// `Some` for the plain base-frequency form; `None` when `freqs` are given.
    base: Option<f32>,
    scale: f32,
    /// Per-pair periods (MLX's `freqs`: the angle is `position / freq`); +inf = no rotation.
    freqs: Option<Array>,
}

impl Rope {
    /// Builds the RoPE that mlx-lm's `initialize_rope(dims=head_dim, ...)` builds for `p`.
    pub fn new(head_dim: i32, traditional: bool, p: &RopeParams) -> Result<Rope> {
        match p.rope_type.as_str() {
            "default" | "linear" => Ok(Rope {
                dims: head_dim,
                traditional,
                base: Some(p.theta),
                scale: if p.rope_type == "linear" {
                    1.0 / p.factor
                } else {
                    1.0
                },
                freqs: None,
            }),
            "proportional" => {
                // mlx-lm's ProportionalRoPE: exponents divide by ALL head_dim dims; the pairs
                // past the rotated part get an infinite period (left unrotated).
                let rotated = (head_dim as f32 * p.partial_rotary_factor) as i32;
                if rotated > head_dim || rotated < 0 {
                    return Err(Error::InvalidArgument(format!(
                        "partial_rotary_factor {} gives {rotated} rotated dims of {head_dim}",
                        p.partial_rotary_factor
                    )));
                }
                let n_rot = (rotated + 1) / 2;
                // Computed with MLX ops in f32 like mlx-lm: factor * base ** (arange(0, r, 2) / dims).
                let evens: Vec<f32> = (0..n_rot).map(|j| (2 * j) as f32).collect();
                let exponents =
                    Array::from_slice(&evens, &[n_rot]).divide(Array::from_f32(head_dim as f32))?;
                let rot = power(Array::from_f32(p.theta), &exponents)?
                    .multiply(Array::from_f32(p.factor))?;
                let rest =
                    full::<f32>(&[(head_dim - rotated) / 2], Array::from_f32(f32::INFINITY))?;
                let freqs = concatenate(&[rot, rest], 0)?;
                freqs.eval()?;
                Ok(Rope {
                    dims: head_dim,
                    traditional,
                    base: None,
                    scale: 1.0,
                    freqs: Some(freqs),
                })
            }
            other => Err(Error::InvalidArgument(format!(
                "unsupported rope_type {other:?}"
            ))),
        }
    }

    /// What a kernel needs to rotate as [`Rope::forward_rows`] does: `(dims, log2 of the base or
    /// the per-pair periods, scale)`, for the non-traditional (rotate-half) form only.
    pub fn rotate_half_form(&self) -> Option<(i32, RopeFreqs<'_>, f32)> {
        if self.traditional {
            return None;
        }
        let freqs = match (&self.freqs, self.base) {
            (Some(f), _) => RopeFreqs::Periods(f),
            // MLX passes its kernels `std::log2(base)`, in f32.
            (None, Some(base)) => RopeFreqs::Log2Base(base.log2()),
            (None, None) => return None,
        };
        Some((self.dims, freqs, self.scale))
    }

    /// Rotates `x` `[B, heads, L, head_dim]` for positions `offset..offset+L`.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(rope(
            x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )?)
    }

    /// Rotates `x` `[B, heads, L, head_dim]`, row `b` for positions `offsets[b]..+L`
    /// (`offsets`: int32 `[B]`, or a scalar for every row).
    pub fn forward_rows(&self, x: &Array, offsets: &Array) -> Result<Array> {
        Ok(rope_dynamic(
            x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offsets,
            self.freqs.as_ref(),
        )?)
    }
}
