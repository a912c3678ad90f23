//! Decode attention that reads each row's keys / values from its slot of the shared batch KV
//! ([`super::batch_kv`]) on MLX CUDA: the same kernels as [`super::attention_probs`] and
//! [`super::values_product`], given the layer's two buffers and the step's slot array instead
//! of one view per row.
//!
//! Why: a view is a graph node, and a decode step is bound by MLX's host work per node. Over a
//! shared KV each row's keys and values were two `Slice` views per layer (384 of an eight-row
//! e4b step's 1964 nodes, H200 session 17). Here the kernels take the buffers
//! `[slots, kv_heads, capacity, D]` and an int32 array of the rows' slots (the one the step's
//! `Scatter` already wrote with) plus one of their key counts, and each block points at its
//! row's slot: the address the row's view starts at, read with the view's strides, over the
//! same number of keys. So a row sums the same numbers in the same order and gets
//! the bits of the per-row kernels, which are MLX's ([`self_check`] compares with MLX's op).
//!
//! Used on decode steps over a shared KV when the model's decode attention is
//! [`super::DecodeAttention::Probs`] and the values kernel covers every row's key count;
//! otherwise the rows' views are made and attention runs as before.
use std::cell::Cell;

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use super::attention::stack_rows;
use super::attention_probs::{self, MAX_KEYS};
use super::batch_kv::SlotRows;
use super::row_kernel::ROWS_PER_CALL;
use super::values_product::{self, Order};
use crate::error::{Error, Result};

thread_local! {
    /// [`available`]'s answer on this thread, once asked.
    static AVAILABLE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Whether these kernels run here with MLX's bits: both per-row kernels are available and
/// [`self_check`] passes (asked once per thread); `MEMEXEC_SLOT_ATTENTION=0` says no without
/// asking (the rows then attend through their views).
pub fn available() -> bool {
    attention_probs::available()
        && values_product::available()
        && super::check_values::passes_once(
            &AVAILABLE,
            "MEMEXEC_SLOT_ATTENTION",
            "slot attention",
            "views of the shared KV",
            self_check,
        )
}

/// Whether decode steps over a shared batch KV (`shared_kv`) with `decode_attention` read the
/// buffers by slot. What `memexec bench` and `memexec graph` report.
pub fn used_with(decode_attention: super::DecodeAttention, shared_kv: bool) -> bool {
    shared_kv && decode_attention == super::DecodeAttention::Probs && available()
}

/// The heads, head dim and values order of `q` `[rows, heads, 1, D]` over `rows` when the
/// kernels take them: bf16 (the values kernel's type), D in the values table, grouped-query
/// heads of at most 8 groups, buffers stored row by row, every row's slot inside the buffers
/// and its key count from 1 to the most both kernels take.
fn fit(q: &Array, rows: &SlotRows) -> Option<(i32, i32, &'static Order)> {
    let &[n, heads, 1, d] = q.shape() else {
        return None;
    };
    let (k, v) = (&rows.keys, &rows.values);
    let &[slots, kv_heads, capacity, dk] = k.shape() else {
        return None;
    };
    let order = Order::for_dim(d)?;
    let stored = |a: &Array| {
        a.shape() == k.shape()
            && a.dtype() == Dtype::Bfloat16
            && a.strides().get(2..) == Some(&[d as usize, 1][..])
    };
    let fits = n as usize == rows.len()
        && n > 0
        && rows.slot_ids.len() == rows.len()
        && [&rows.slots, &rows.visible_array]
            .iter()
            .all(|a| a.shape() == [n] && a.dtype() == Dtype::Int32)
        && q.dtype() == Dtype::Bfloat16
        && q.strides().last() == Some(&1)
        && dk == d
        && kv_heads > 0
        && heads % kv_heads == 0
        && (1..=8).contains(&(heads / kv_heads))
        && stored(k)
        && stored(v)
        && rows.slot_ids.iter().all(|&s| (0..slots).contains(&s))
        && rows
            .visible
            .iter()
            .all(|&s| s <= capacity && s <= MAX_KEYS && order.covers(s));
    fits.then_some((heads, d, order))
}

/// `[rows, heads, 1, D]` queries, row `r` over the first `visible[r]` positions of its slot,
/// no mask: the attention output `[rows, heads, 1, D]`, in kernel calls of at most
/// [`ROWS_PER_CALL`] rows. `None` when the rows are not the kernels' (the caller attends
/// through the views).
pub fn attend(q: &Array, rows: &SlotRows, scale: f32) -> Result<Option<Array>> {
    let Some((heads, d, order)) = fit(q, rows) else {
        return Ok(None);
    };
    let n = rows.len();
    let mut outs = Vec::with_capacity(n.div_ceil(ROWS_PER_CALL));
    for start in (0..n).step_by(ROWS_PER_CALL) {
        let end = (start + ROWS_PER_CALL).min(n);
        let [qc, sc, kc] = if n <= ROWS_PER_CALL {
            [q, &rows.slots, &rows.visible_array].map(Array::clone)
        } else {
            let span = start as i32..end as i32;
            [
                q.try_index(span.clone())?,
                rows.slots.try_index(span.clone())?,
                rows.visible_array.try_index(span)?,
            ]
        };
        let visible = &rows.visible[start..end];
        let ps = attention_probs::probabilities_slots(&qc, &rows.keys, &sc, &kc, visible, scale)?;
        outs.push(values_product::product_slots(
            &ps,
            &rows.values,
            &sc,
            order,
        )?);
    }
    Ok(Some(stack_rows(outs)?.reshape(&[n as i32, heads, 1, d])?))
}

/// Runs [`attend`] against MLX's `scaled_dot_product_attention` of each row's view, for both
/// of Gemma-4's head dims: nine rows at head dim 256 (two calls: the 8- and 1-row kernels,
/// slots out of order, one slot unused) and three at 512 (a row of 600 keys). Fails where the
/// kernels cannot run (not an MLX CUDA build) or any element's bits differ.
pub fn self_check() -> Result<()> {
    use mlx_rs::fast::scaled_dot_product_attention;
    let mut lcg = super::check_values::Lcg::new(0x51_07_a7);
    let cases: [(i32, i32, &[i32], &[i32]); 2] = [
        (
            256,
            64,
            &[4, 0, 9, 2, 7, 1, 8, 3, 6],
            &[37, 1, 64, 16, 5, 63, 2, 40, 33],
        ),
        (512, 640, &[2, 0, 1], &[600, 3, 64]),
    ];
    for (d, capacity, slot_ids, visible) in cases {
        let slots = slot_ids.iter().max().map_or(1, |m| m + 2);
        let n = slot_ids.len() as i32;
        let rows = SlotRows {
            keys: lcg.bf16(&[slots, 2, capacity, d], -0.25, 0.5)?,
            values: lcg.bf16(&[slots, 2, capacity, d], -1.0, 2.0)?,
            slots: Array::from_slice(slot_ids, &[n]),
            slot_ids: slot_ids.to_vec(),
            visible: visible.to_vec(),
            visible_array: Array::from_slice(visible, &[n]),
        };
        let q = lcg.bf16(&[n, 8, 1, d], -0.25, 0.5)?;
        let ours = attend(&q, &rows, 1.0)?
            .ok_or_else(|| Error::Internal("slot attention: self-check rows rejected".into()))?;
        for (r, (k, v)) in rows.views()?.iter().enumerate() {
            let at = r as i32..r as i32 + 1;
            let theirs =
                scaled_dot_product_attention(&q.try_index(at.clone())?, k, v, 1.0, None, None)?;
            if !ours.try_index(at)?.eq_values(&theirs)? {
                return Err(Error::Internal(format!(
                    "slot attention: row {r} differs from MLX's attention (head dim {d}, {} keys)",
                    visible[r]
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

    fn rows(slots: i32, capacity: i32, d: i32, visible: &[i32]) -> SlotRows {
        let n = visible.len() as i32;
        let ids: Vec<i32> = (0..n).collect();
        SlotRows {
            keys: zeros(&[slots, 2, capacity, d], Dtype::Bfloat16),
            values: zeros(&[slots, 2, capacity, d], Dtype::Bfloat16),
            slots: Array::from_slice(&ids, &[n]),
            slot_ids: ids,
            visible: visible.to_vec(),
            visible_array: Array::from_slice(visible, &[n]),
        }
    }

    #[test]
    fn rows_the_kernels_take_and_rows_they_do_not() {
        let q = zeros(&[2, 8, 1, 256], Dtype::Bfloat16);
        assert!(fit(&q, &rows(2, 64, 256, &[5, 64])).is_some());
        // More keys than the slot holds; a key count outside the values table; no keys.
        assert!(fit(&q, &rows(2, 64, 256, &[5, 65])).is_none());
        assert!(fit(&q, &rows(2, 4096, 256, &[5, 2572])).is_none());
        assert!(fit(&q, &rows(2, 64, 256, &[0, 5])).is_none());
        // A head dim the table does not know; f32; a row count that is not the queries'.
        let q128 = zeros(&[2, 8, 1, 128], Dtype::Bfloat16);
        assert!(fit(&q128, &rows(2, 64, 128, &[5, 6])).is_none());
        let q32 = zeros(&[2, 8, 1, 256], Dtype::Float32);
        assert!(fit(&q32, &rows(2, 64, 256, &[5, 6])).is_none());
        assert!(fit(&q, &rows(3, 64, 256, &[5, 6, 7])).is_none());
        // A slot outside the buffers.
        let mut out = rows(2, 64, 256, &[5, 6]);
        out.slot_ids[1] = 2;
        assert!(fit(&q, &out).is_none());
        // Query heads not a multiple of the KV heads (2).
        let q3 = zeros(&[2, 3, 1, 256], Dtype::Bfloat16);
        assert!(fit(&q3, &rows(2, 64, 256, &[5, 6])).is_none());
    }

    #[test]
    fn a_build_without_mlx_cuda_attends_through_the_views() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: the kernels may well run here
        }
        assert!(self_check().is_err());
        assert!(!available());
        assert!(!used_with(super::super::DecodeAttention::Probs, true));
    }

    #[test]
    fn each_row_count_reads_its_slot_then_runs_the_per_row_body() {
        let probs = attention_probs::source_slots(8);
        assert!(probs.contains("case 7: pr = p7; break;"));
        assert!(probs.contains("n_keys = row_keys[row];"));
        // MLX passes shapes for inputs only: the outputs' would not compile.
        assert!(!probs.contains("p7_shape"));
        assert!(probs.contains("kb + static_cast<int64_t>(row_slots[row]) * kb_strides[0]"));
        let values = values_product::source_slots(2);
        assert!(values.contains("case 1: pr = p1; n_keys = p1_shape[4];"));
        assert!(!values.contains("case 2:"));
        assert!(values.contains("vb + static_cast<int64_t>(row_slots[row]) * vb_strides[0]"));
        // The bodies are the per-row kernels' own: the same text after the prologue.
        let after = |s: &str, from: &str| s[s.find(from).unwrap()..].to_string();
        assert_eq!(
            after(&probs, "const T* qh"),
            after(&attention_probs::source(8), "const T* qh")
        );
        let body = |s: &str| after(s, "static_assert");
        assert_eq!(body(&values), body(&values_product::source(2)));
    }
}
