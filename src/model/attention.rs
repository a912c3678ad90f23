//! Pieces of attention shared by the architectures: row slicing and per-row SDPA.
//!
//! A batch of B rows runs projections on the stacked activations, but attention runs per row
//! over that row's own unpadded keys / values, so each row computes exactly what B = 1 does.
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::cache::Mask;
use crate::error::Result;

/// Row `b` of a batch-major array, keeping the batch axis (`x[b:b+1]`).
pub fn row(x: &Array, b: usize) -> Result<Array> {
    if x.dim(0) == 1 {
        return Ok(x.clone());
    }
    let b = b as i32;
    Ok(x.try_index(b..b + 1)?)
}

/// Stacks per-row results back along the batch axis.
pub fn stack_rows(mut rows: Vec<Array>) -> Result<Array> {
    if rows.len() == 1 {
        if let Some(r) = rows.pop() {
            return Ok(r);
        }
    }
    Ok(concatenate(&rows, 0)?)
}

/// `fast::scaled_dot_product_attention` of one row (`[1, heads, L, head_dim]` queries).
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask) -> Result<Array> {
    Ok(match mask {
        Mask::None => scaled_dot_product_attention(q, k, v, scale, None, None)?,
        Mask::Causal => scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            ScaledDotProductAttentionMask::Causal,
            None,
        )?,
        Mask::Array(m) => scaled_dot_product_attention(q, k, v, scale, m, None)?,
    })
}
