//! Pieces of attention shared by the architectures: row slicing, RoPE at per-row offsets and
//! per-row SDPA.
//!
//! A batch of B rows runs projections and RoPE on the stacked activations, but attention runs
//! per row over that row's own unpadded keys / values, so each row computes exactly what B = 1
//! does.
use std::sync::OnceLock;

use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::cache::Mask;
use super::rope::Rope;
use crate::error::{Error, Result};

/// Whether row-wise steps that MLX can do for all rows at once (RoPE at per-row offsets, the
/// greedy pick) run once per row instead: `MEMEXEC_ROW_OPS=per-row`. A diagnostic switch for
/// measuring and for a device whose batched kernels would not be row-exact; the start-up
/// self-check catches the latter either way.
pub fn per_row_ops() -> bool {
    static PER_ROW: OnceLock<bool> = OnceLock::new();
    *PER_ROW.get_or_init(|| {
        std::env::var("MEMEXEC_ROW_OPS").is_ok_and(|v| v.trim().eq_ignore_ascii_case("per-row"))
    })
}

/// The RoPE position offset of each row of a forward call (the positions its cache had seen).
pub struct RowOffsets {
    offsets: Vec<i32>,
    /// `offsets` as an int32 device array, made on first use.
    array: Option<Array>,
}

impl RowOffsets {
    /// Offsets of rows `0..offsets.len()`.
    pub fn new(offsets: Vec<i32>) -> RowOffsets {
        RowOffsets {
            offsets,
            array: None,
        }
    }

    /// Row `r`'s offset.
    pub fn of(&self, r: usize) -> i32 {
        self.offsets.get(r).copied().unwrap_or(0)
    }

    /// The offsets in `slot` when they equal `offsets` (consecutive layers of one forward
    /// usually share them: their device array is then made once), else new ones put there.
    pub fn reuse(slot: &mut Option<RowOffsets>, offsets: Vec<i32>) -> &mut RowOffsets {
        if slot.as_ref().is_some_and(|o| o.offsets == offsets) {
            if let Some(o) = slot {
                return o;
            }
        }
        slot.insert(RowOffsets::new(offsets))
    }

    /// `rope` over `x` `[B, heads, L, head_dim]`, row `r` at its own offset. One op for all
    /// rows: MLX's RoPE takes the offset as an array in every form (a scalar offset is a
    /// one-element array), so row `r` gets the bits of its one-row call.
    pub fn rotate(&mut self, rope: &Rope, x: &Array) -> Result<Array> {
        if self.offsets.len() <= 1 {
            return rope.forward(x, self.of(0));
        }
        if per_row_ops() {
            let rows = (0..self.offsets.len())
                .map(|r| rope.forward(&row(x, r)?, self.of(r)))
                .collect::<Result<Vec<_>>>()?;
            return stack_rows(rows);
        }
        let n = self.offsets.len() as i32;
        let offsets = self
            .array
            .get_or_insert_with(|| Array::from_slice(&self.offsets, &[n]));
        rope.forward_rows(x, offsets)
    }
}

/// Row `b` of a batch-major array, keeping the batch axis (`x[b:b+1]`).
pub fn row(x: &Array, b: usize) -> Result<Array> {
    if x.dim(0) == 1 {
        return Ok(x.clone());
    }
    let b = b as i32;
    Ok(x.try_index(b..b + 1)?)
}

/// Projected `x` `[B, L, heads * head_dim]` as `[B, heads, L, head_dim]`, with `norm` (a
/// per-head norm over the last axis, or the identity) applied before the transpose, where
/// Gemma-4 applies it.
///
/// For one position (L = 1, every decode step) both layouts are the same bytes, so a single
/// reshape gives the tensor: one graph node fewer per projection. That matters on a GPU,
/// where a decode step is bound by the host's cost per graph node, not by the device.
pub fn split_heads(
    x: &Array,
    heads: i32,
    head_dim: i32,
    norm: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Array> {
    let (b, l) = (x.dim(0), x.dim(1));
    if l == 1 {
        return norm(&x.reshape(&[b, heads, 1, head_dim])?);
    }
    Ok(norm(&x.reshape(&[b, l, heads, head_dim])?)?.transpose_axes(&[0, 2, 1, 3])?)
}

/// Attention output `[B, heads, L, head_dim]` as `[B, L, heads * head_dim]` (a reshape alone
/// for L = 1, as in [`split_heads`]).
pub fn merge_heads(o: &Array) -> Result<Array> {
    let (b, l) = (o.dim(0), o.dim(2));
    if l == 1 {
        return Ok(o.reshape(&[b, 1, -1])?);
    }
    Ok(o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
}

/// The `rows` rows of a batch-major array, keeping the batch axis: one split op for all rows
/// (the same views as [`row`] per row, in one graph node instead of `rows`).
pub fn split_rows(x: &Array, rows: usize) -> Result<Vec<Array>> {
    let n = x.dim(0);
    if n as usize != rows {
        return Err(Error::InvalidArgument(format!(
            "batch of {n} rows for {rows} caches"
        )));
    }
    if n == 1 {
        return Ok(vec![x.clone()]);
    }
    Ok(x.split_equal(n, 0)?)
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
