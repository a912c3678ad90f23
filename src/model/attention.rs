//! Pieces of attention shared by the architectures: row slicing, RoPE at per-row offsets and
//! per-row SDPA.
//!
//! A batch of B rows runs projections and RoPE on the stacked activations, but attention runs
//! over each row's own unpadded keys / values, so each row computes exactly what B = 1 does.
//! Where the backend's attention is batch-invariant (the CPU), rows that hold the same number
//! of keys (every row past a sliding window holds exactly the window) attend in one op over
//! their stacked keys instead of one op per row (see [`attend_rows`]).
use std::sync::OnceLock;

use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::attention_probs;
use super::batch_kv::SlotRows;
use super::cache::{missing_layer, Mask, RowCache};
use super::decode_attention::{self, DecodeAttention};
use super::rope::Rope;
use super::slot_attention;
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
    /// `offsets` as an int32 device array (one row: a scalar), made on first use.
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

    /// The offsets as the int32 array MLX's RoPE takes for all rows at once, made on first use
    /// and kept for every layer that shares them; `None` where several rows rotate one by one
    /// ([`per_row_ops`]). One row: the scalar MLX would make from an integer offset. Why kept:
    /// on MLX's CUDA backend that is one host-written few-byte array per step instead of one per
    /// layer (they share a managed-memory pool with the step's small results).
    pub fn array(&mut self) -> Option<&Array> {
        if self.offsets.len() > 1 && per_row_ops() {
            return None;
        }
        if self.array.is_none() {
            self.array = Some(if self.offsets.len() <= 1 {
                Array::from_int(self.of(0))
            } else {
                Array::from_slice(&self.offsets, &[self.offsets.len() as i32])
            });
        }
        self.array.as_ref()
    }

    /// `rope` over `x` `[B, heads, L, head_dim]`, row `r` at its own offset. One op for all
    /// rows: MLX's RoPE takes the offset as an array in every form (a scalar offset is a
    /// one-element array), so row `r` gets the bits of its one-row call.
    pub fn rotate(&mut self, rope: &Rope, x: &Array) -> Result<Array> {
        if let Some(offsets) = self.array() {
            return rope.forward_rows(x, offsets);
        }
        let rows = (0..self.offsets.len())
            .map(|r| rope.forward(&row(x, r)?, self.of(r)))
            .collect::<Result<Vec<_>>>()?;
        stack_rows(rows)
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

/// The heads and head dim of `[rows, heads, 1, D]` queries whose rows `kv[r]`
/// (`[1, kv_heads, S_r, D]` keys, values of as many positions) suit memexec's decode-step
/// kernels ([`decode_attention`], [`attention_probs`]): bf16 / f16 activations (their 16-byte
/// loads; MLX's precise softmax), D a multiple of `dim_multiple`, 1 to `max_keys` keys,
/// grouped-query heads, rows stored with unit last strides; `None` otherwise (MLX's op then).
/// An unevaluated array reports row-major strides, so only evaluated views are told apart.
pub(super) fn decode_rows_fit(
    q: &Array,
    kv: &[(&Array, &Array)],
    dim_multiple: i32,
    max_keys: i32,
) -> Option<(i32, i32)> {
    let &[rows, heads, 1, d] = q.shape() else {
        return None;
    };
    let dtype = q.dtype();
    let row_fits = |(k, v): &(&Array, &Array)| {
        let (&[1, kv_heads, keys, dk], &[1, kv_v, keys_v, _]) = (k.shape(), v.shape()) else {
            return false;
        };
        dk == d
            && kv_heads == kv_v
            && kv_heads > 0
            && heads % kv_heads == 0
            && keys == keys_v
            && (1..=max_keys).contains(&keys)
            && k.dtype() == dtype
            && v.dtype() == dtype
            && k.strides().last() == Some(&1)
    };
    let fits = rows as usize == kv.len()
        && rows > 0
        && d % dim_multiple == 0
        && matches!(dtype, mlx_rs::Dtype::Bfloat16 | mlx_rs::Dtype::Float16)
        && q.strides().last() == Some(&1)
        && kv.iter().all(row_fits);
    fits.then_some((heads, d))
}

/// The template constants both decode-step kernels take: the element type `T`, the head dim
/// `D`, the f32 scale's bits `SCALE_BITS` and `MAX_KEYS` (the scores they keep in shared memory).
pub(super) fn kernel_constants(
    dtype: mlx_rs::Dtype,
    d: i32,
    scale: f32,
    max_keys: i32,
) -> [(&'static str, crate::mlx_ffi::TemplateArg); 4] {
    use crate::mlx_ffi::TemplateArg;
    [
        ("T", TemplateArg::Dtype(dtype)),
        ("D", TemplateArg::Int(d)),
        ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
        ("MAX_KEYS", TemplateArg::Int(max_keys)),
    ]
}

/// Each row's keys and values, in row order, as the decode-step kernels take them.
pub(super) type KvRows<'a> = [(&'a Array, &'a Array)];

/// `q`'s rows and `kv` in calls of at most `per_call` rows each (one call when they fit):
/// what a decode-step kernel taking at most that many rows runs, in order.
pub(super) fn row_calls<'a>(
    q: &Array,
    kv: &'a KvRows<'a>,
    per_call: usize,
) -> Result<Vec<(Array, &'a KvRows<'a>)>> {
    if kv.len() <= per_call {
        return Ok(vec![(q.clone(), kv)]);
    }
    kv.chunks(per_call)
        .enumerate()
        .map(|(c, chunk)| {
            let start = (c * per_call) as i32;
            Ok((q.try_index(start..start + chunk.len() as i32)?, chunk))
        })
        .collect()
}

/// The attention of one-position, maskless rows by the decode kernel `decode` names, `None`
/// for MLX's op or where the rows' shapes are not the kernel's.
fn decode_kernel(
    decode: DecodeAttention,
    q: &Array,
    rows: &[(&Array, &Array)],
    scale: f32,
) -> Result<Option<Array>> {
    match decode {
        DecodeAttention::Kernel => decode_attention::attend_rows(q, rows, scale),
        DecodeAttention::Probs => attention_probs::attend_rows(q, rows, scale),
        DecodeAttention::Mlx => Ok(None),
    }
}

/// How [`attend_rows`] runs the attention of a forward's rows.
#[derive(Debug, Clone, Copy)]
pub struct AttentionForm {
    /// Stack rows that hold the same number of keys (see [`attend_rows`]).
    pub stack: bool,
    /// How a one-position row without a mask attends (the model's choice, made at load).
    pub decode: DecodeAttention,
}

/// One row's attention: the decode kernel (or the probabilities kernel) where `decode` asks
/// for it and the row is a maskless one-position query of the kernel's shapes, else MLX's op.
fn attend_one(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: &Mask,
    decode: DecodeAttention,
) -> Result<Array> {
    if matches!(mask, Mask::None) {
        if let Some(o) = decode_kernel(decode, q, &[(k, v)], scale)? {
            return Ok(o);
        }
    }
    sdpa(q, k, v, scale, mask)
}

/// The keys / values each row of a forward attended over (`[1, kv_heads, S_r, head_dim]`),
/// plus the stacks [`attend_rows`] built from them, kept for the layers that share these keys
/// (Gemma-4's KV-shared layers): they attend over the same stacks without rebuilding them.
/// Rows over a shared batch KV keep its buffers and slots ([`SlotRows`]) and make the per-row
/// views only when something asks for them: a kernel that reads by slot needs none.
pub struct RowKv {
    rows: Vec<(Array, Array)>,
    slots: Option<SlotRows>,
    stacks: Vec<(Vec<usize>, Array, Array)>,
}

impl RowKv {
    /// Each row's keys and values, in row order.
    pub fn new(rows: Vec<(Array, Array)>) -> RowKv {
        RowKv {
            rows,
            slots: None,
            stacks: Vec::new(),
        }
    }

    /// The rows of a step over a shared batch KV.
    pub fn from_slots(slots: SlotRows) -> RowKv {
        RowKv {
            rows: Vec::new(),
            slots: Some(slots),
            stacks: Vec::new(),
        }
    }

    /// Writes row `r`'s new keys / values (`[B, kv_heads, L, head_dim]` `k`, `v`) into its
    /// cache slot `layer` and keeps what each row then attends over.
    pub fn update(
        caches: &mut [&mut RowCache],
        layer: usize,
        k: &Array,
        v: &Array,
    ) -> Result<RowKv> {
        if caches.first().is_some_and(|c| c.slot().is_some()) {
            return Ok(RowKv::from_slots(super::batch_kv::update_rows(
                caches, layer, k, v,
            )?));
        }
        let rows = split_rows(k, caches.len())?
            .into_iter()
            .zip(split_rows(v, caches.len())?);
        let mut fetched = Vec::with_capacity(caches.len());
        for (cache, (kr, vr)) in caches.iter_mut().zip(rows) {
            let lc = cache.layer_mut(layer).ok_or_else(|| missing_layer(layer))?;
            fetched.push(lc.update_and_fetch(&kr, &vr)?);
        }
        Ok(RowKv::new(fetched))
    }

    /// Every row's keys and values (over a shared batch KV: its views, made on first ask).
    fn all_rows(&mut self) -> Result<&[(Array, Array)]> {
        if let Some(slots) = &self.slots {
            if self.rows.is_empty() && !slots.is_empty() {
                self.rows = slots.views()?;
            }
        }
        Ok(&self.rows)
    }

    /// Row `r`'s keys and values.
    pub fn row(&mut self, r: usize) -> Result<&(Array, Array)> {
        self.all_rows()?.get(r).ok_or_else(|| missing_row(r))
    }

    /// The shared batch KV's buffers and slots, when the rows are over one.
    pub fn slots(&self) -> Option<&SlotRows> {
        self.slots.as_ref()
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.slots.as_ref().map_or(self.rows.len(), SlotRows::len)
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys and values of `members` (ascending rows) stacked along the batch axis.
    fn stacked(&mut self, members: &[usize]) -> Result<(Array, Array)> {
        if let [r] = members {
            return self.row(*r).cloned();
        }
        if let Some((_, k, v)) = self.stacks.iter().find(|(m, _, _)| m == members) {
            return Ok((k.clone(), v.clone()));
        }
        let rows = self.all_rows()?;
        let mut keys = Vec::with_capacity(members.len());
        let mut values = Vec::with_capacity(members.len());
        for &r in members {
            let (k, v) = rows.get(r).ok_or_else(|| missing_row(r))?;
            keys.push(k.clone());
            values.push(v.clone());
        }
        let (k, v) = (concatenate(&keys, 0)?, concatenate(&values, 0)?);
        self.stacks.push((members.to_vec(), k.clone(), v.clone()));
        Ok((k, v))
    }
}

fn missing_row(r: usize) -> Error {
    Error::Internal(format!("attention: no keys for row {r}"))
}

/// Attention of every row of a forward: `q` `[B, heads, L, head_dim]`, row `r` over
/// `kv`'s row `r` with `masks[r]`; returns `[B, heads, L, head_dim]`.
///
/// With `form.stack` (and MLX's op for decode rows), rows with one query and no mask that hold
/// the same number of keys run as ONE attention op over their stacked queries / keys / values;
/// that gives each row the bits of its one-row op only where the backend's attention is
/// batch-invariant (see [`super::ForwardCtx::stacked_attention`]). With the decode kernel
/// (`form.decode`, [`decode_attention`]) one-position rows without masks attend in one kernel
/// node for the whole batch, each row computed alone; with the probabilities kernel
/// ([`attention_probs`]) their scores and softmax do, then each row's values product. Other
/// rows attend alone.
pub fn attend_rows(
    q: &Array,
    kv: &mut RowKv,
    masks: &[&Mask],
    scale: f32,
    form: AttentionForm,
) -> Result<Array> {
    let b = kv.len();
    if q.dim(0) as usize != b || masks.len() != b || b == 0 {
        return Err(Error::InvalidArgument(format!(
            "attention: {} query rows, {b} key rows, {} masks",
            q.dim(0),
            masks.len()
        )));
    }
    if form.decode != DecodeAttention::Mlx
        && q.dim(2) == 1
        && masks.iter().all(|m| matches!(m, Mask::None))
    {
        // Over a shared batch KV, kernels that read each row's slot of the buffers (their
        // self-check runs at the first such step, not on steps that cannot use them).
        if let Some(slots) = kv.slots() {
            if form.decode == DecodeAttention::Probs && slot_attention::available() {
                if let Some(o) = slot_attention::attend(q, slots, scale)? {
                    return Ok(o);
                }
            }
        }
        // Every row in one kernel node when all suit it; else row by row below (a row that
        // suits the kernel still gets it there: the same bits either way).
        let rows: Vec<(&Array, &Array)> = kv.all_rows()?.iter().map(|(k, v)| (k, v)).collect();
        if let Some(o) = decode_kernel(form.decode, q, &rows, scale)? {
            return Ok(o);
        }
    }
    let stackable = form.stack && form.decode == DecodeAttention::Mlx && q.dim(2) == 1 && b > 1;
    // Groups of rows in order of their first row; stackable rows grouped by key count.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_keys: Vec<(i32, usize)> = Vec::new();
    for (r, mask) in masks.iter().enumerate() {
        let keys = kv.row(r)?.0.dim(2);
        match by_keys.iter().find(|(n, _)| *n == keys) {
            Some(&(_, g)) if stackable && matches!(mask, Mask::None) => groups[g].push(r),
            _ => {
                if stackable && matches!(mask, Mask::None) {
                    by_keys.push((keys, groups.len()));
                }
                groups.push(vec![r]);
            }
        }
    }
    if let [all] = groups.as_slice() {
        // One group holding every row, in order (or B = 1): the whole batch in one op.
        let (k, v) = kv.stacked(all)?;
        return attend_one(q, &k, &v, scale, masks[0], form.decode);
    }
    let q_rows = split_rows(q, b)?;
    let mut outs: Vec<Option<Array>> = vec![None; b];
    for group in &groups {
        let (k, v) = kv.stacked(group)?;
        if let [r] = group.as_slice() {
            outs[*r] = Some(attend_one(
                &q_rows[*r],
                &k,
                &v,
                scale,
                masks[*r],
                form.decode,
            )?);
            continue;
        }
        let qg: Vec<Array> = group.iter().map(|&r| q_rows[r].clone()).collect();
        let o = sdpa(&concatenate(&qg, 0)?, &k, &v, scale, &Mask::None)?;
        for (o, &r) in split_rows(&o, group.len())?.into_iter().zip(group) {
            outs[r] = Some(o);
        }
    }
    let outs: Option<Vec<Array>> = outs.into_iter().collect();
    stack_rows(outs.ok_or_else(|| Error::Internal("attention: a row got no output".into()))?)
}
