//! Per-sequence key/value caches, mirroring mlx-lm's `KVCache` and `RotatingKVCache`
//! (`mlx_lm/models/cache.py`) step for step: the same buffer growth, ring layout and masks, so
//! attention sums over the same keys in the same order as the oracle.
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::batch_kv::Slot;
use crate::error::{Error, Result};
use crate::mlx_ffi::slice_update;

/// Buffers grow by this many positions at a time (mlx-lm's `step`); the shared batch KV's
/// full-layer slots follow them ([`super::batch_kv`]).
pub(super) const STEP: i32 = 256;

/// The attention mask of one forward call for one layer type.
pub enum Mask {
    /// Every key is visible (a single query over a cache that holds only its window).
    None,
    /// Causal, aligned to the last key (MLX's `"causal"` mode).
    Causal,
    /// An explicit boolean `[L, keys]` mask (true = attend).
    Array(Array),
}

/// mlx-lm's `create_causal_mask(N, offset, window_size)`: query `i` (absolute position
/// `offset + i`) sees key `j` iff `j <= offset + i` and `offset + i < j + window`.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Array {
    let total = offset + n;
    let mut data = Vec::with_capacity((n * total).max(0) as usize);
    for i in 0..n {
        let l = offset + i;
        for r in 0..total {
            data.push(l >= r && window.is_none_or(|w| l < r + w));
        }
    }
    Array::from_slice(&data, &[n, total])
}

fn shape4(a: &Array, what: &str) -> Result<[i32; 4]> {
    match a.shape() {
        &[b, h, l, d] => Ok([b, h, l, d]),
        s => Err(Error::InvalidArgument(format!(
            "{what} must be [B, heads, L, head_dim], got {s:?}"
        ))),
    }
}

/// `v[..., start..end, :]`.
fn seq(v: &Array, start: i32, end: i32) -> Result<Array> {
    Ok(v.try_index((.., .., start..end, ..))?)
}

/// `buf` with `buf[..., start..start + L, :] = new` (`new`: `[B, heads, L, head_dim]`), as one
/// `SliceUpdate` node (mlx-rs's `try_index_mut` adds two reshapes per write).
fn write_seq(buf: &Array, new: &Array, start: i32) -> Result<Array> {
    let [b, h, l, d] = shape4(new, "new keys / values")?;
    slice_update(buf, new, &[0, 0, start, 0], &[b, h, start + l, d])
}

/// A growing cache for full-attention layers (mlx-lm `KVCache`).
#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCache {
    /// Appends `keys` / `values` (`[1, kv_heads, L, head_dim]`) and returns all cached ones.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let [b, h, s, dk] = shape4(keys, "keys")?;
        let dv = shape4(values, "values")?[3];
        let prev = self.offset;
        let (mut ck, mut cv) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) if prev + s <= k.dim(2) => (k, v),
            (old_k, old_v) => {
                let n_steps = (STEP + s - 1) / STEP;
                let new_k = zeros_dtype(&[b, h, n_steps * STEP, dk], keys.dtype())?;
                let new_v = zeros_dtype(&[b, h, n_steps * STEP, dv], values.dtype())?;
                match (old_k, old_v) {
                    (Some(mut k), Some(mut v)) => {
                        if prev % STEP != 0 {
                            k = seq(&k, 0, prev)?;
                            v = seq(&v, 0, prev)?;
                        }
                        (concatenate(&[k, new_k], 2)?, concatenate(&[v, new_v], 2)?)
                    }
                    _ => (new_k, new_v),
                }
            }
        };
        self.offset += s;
        ck = write_seq(&ck, keys, prev)?;
        cv = write_seq(&cv, values, prev)?;
        let out = if self.offset < ck.dim(2) {
            (seq(&ck, 0, self.offset)?, seq(&cv, 0, self.offset)?)
        } else {
            (ck.clone(), cv.clone())
        };
        self.keys = Some(ck);
        self.values = Some(cv);
        Ok(out)
    }

    /// The mask for `n` new queries (mlx-lm: none for one token, else causal).
    pub fn make_mask(&self, n: i32) -> Mask {
        if n == 1 {
            Mask::None
        } else {
            Mask::Causal
        }
    }

    /// Positions seen so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// What a shared batch slot starts from: the cached positions in order (`None`: none yet).
    fn slot_plan(&self) -> Result<SlotPlan> {
        let data = match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => {
                Some((seq(k, 0, self.offset)?, seq(v, 0, self.offset)?))
            }
            _ => None,
        };
        Ok(SlotPlan {
            data,
            idx: 0,
            len: self.offset,
        })
    }

    /// The bookkeeping of one position written to a shared slot: (write position, keys
    /// visible after it), as [`Self::update_and_fetch`] would place and return them.
    fn advance_slot(&mut self) -> (i32, i32) {
        let at = self.offset;
        self.offset += 1;
        (at, self.offset)
    }

    fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }
}

/// How a layer's cache enters a shared batch slot: the keys / values to copy to the slot's
/// first positions (`[1, kv_heads, n, head_dim]`) and the ring state they leave.
pub struct SlotPlan {
    /// Keys and values to copy, in the serial buffer's order; `None` when nothing is cached.
    pub data: Option<(Array, Array)>,
    /// The next write index of a ring (0 for a full layer).
    idx: i32,
    /// The serial buffer's length after the plan (a ring's, before its next growth).
    len: i32,
}

/// A sliding-window ring buffer (mlx-lm `RotatingKVCache` with `keep = 0`).
///
/// Single-token updates write in place into a ring of `max_size`; multi-token updates put the
/// buffer back in temporal order and append, holding up to `max_size - 1 + L` entries so each
/// new query still sees a full window (the window mask enforces the rest).
#[derive(Clone)]
pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    max_size: i32,
    idx: i32,
    /// Length of the serial buffer while the keys live in a shared batch slot (which then
    /// holds its positions `0..slot_len` in the same ring order).
    slot_len: i32,
}

impl RotatingKvCache {
    /// An empty cache holding at most `max_size` positions between multi-token updates.
    pub fn new(max_size: i32) -> RotatingKvCache {
        RotatingKvCache {
            keys: None,
            values: None,
            offset: 0,
            max_size,
            idx: 0,
            slot_len: 0,
        }
    }

    fn temporal_order(&self, v: &Array) -> Result<Array> {
        let len = v.dim(2);
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.offset {
            Ok(concatenate(
                &[seq(v, self.idx, len)?, seq(v, 0, self.idx)?],
                2,
            )?)
        } else {
            seq(v, 0, self.idx)
        }
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(ck), Some(cv)) => {
                let ck = self.temporal_order(&ck)?;
                let cv = self.temporal_order(&cv)?;
                let len = ck.dim(2);
                let trim = len - self.max_size + 1;
                if trim > 0 {
                    (
                        concatenate(&[seq(&ck, trim, len)?, keys.clone()], 2)?,
                        concatenate(&[seq(&cv, trim, len)?, values.clone()], 2)?,
                    )
                } else {
                    (
                        concatenate(&[ck, keys.clone()], 2)?,
                        concatenate(&[cv, values.clone()], 2)?,
                    )
                }
            }
            _ => (keys.clone(), values.clone()),
        };
        self.offset += keys.dim(2);
        self.idx = k.dim(2);
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let [b, h, s, dk] = shape4(keys, "keys")?;
        let dv = shape4(values, "values")?[3];
        let prev = self.offset;
        let (mut ck, mut cv) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) if !(prev >= k.dim(2) && k.dim(2) < self.max_size) => (k, v),
            (old_k, old_v) => {
                let new_size = STEP.min(self.max_size - prev);
                let new_k = zeros_dtype(&[b, h, new_size, dk], keys.dtype())?;
                let new_v = zeros_dtype(&[b, h, new_size, dv], values.dtype())?;
                self.idx = prev;
                match (old_k, old_v) {
                    (Some(k), Some(v)) => {
                        (concatenate(&[k, new_k], 2)?, concatenate(&[v, new_v], 2)?)
                    }
                    _ => (new_k, new_v),
                }
            }
        };
        let len = ck.dim(2);
        let trim = len - self.max_size;
        if trim > 0 {
            ck = seq(&ck, trim, len)?;
            cv = seq(&cv, trim, len)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = 0;
        }
        ck = write_seq(&ck, keys, self.idx)?;
        cv = write_seq(&cv, values, self.idx)?;
        self.offset += s;
        self.idx += s;
        let out = if self.offset < ck.dim(2) {
            (seq(&ck, 0, self.offset)?, seq(&cv, 0, self.offset)?)
        } else {
            (ck.clone(), cv.clone())
        };
        self.keys = Some(ck);
        self.values = Some(cv);
        Ok(out)
    }

    /// What a shared batch slot starts from: the buffer as the next one-position update would
    /// find it after trimming a long multi-position update to the window (the same positions,
    /// so a slot read in ring order is the serial buffer), and the ring index that trim sets.
    fn slot_plan(&self) -> Result<SlotPlan> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(SlotPlan {
                data: None,
                idx: self.idx,
                len: 0,
            });
        };
        let len = k.dim(2);
        // `update_in_place` trims only a buffer longer than the window (never one it grows).
        if len > self.max_size {
            let trim = len - self.max_size;
            return Ok(SlotPlan {
                data: Some((seq(k, trim, len)?, seq(v, trim, len)?)),
                idx: self.max_size,
                len: self.max_size,
            });
        }
        Ok(SlotPlan {
            data: Some((k.clone(), v.clone())),
            idx: self.idx,
            len,
        })
    }

    /// The bookkeeping of [`Self::update_in_place`] for one position written to a shared slot
    /// (growth adds positions to `slot_len`; the slot holds the window already): (write
    /// position, keys visible after it).
    fn advance_slot(&mut self) -> (i32, i32) {
        let prev = self.offset;
        if prev >= self.slot_len && self.slot_len < self.max_size {
            self.idx = prev;
            self.slot_len += STEP.min(self.max_size - prev);
        }
        if self.idx == self.max_size {
            self.idx = 0;
        }
        let at = self.idx;
        self.offset += 1;
        self.idx += 1;
        (at, self.offset.min(self.slot_len))
    }

    /// Adds `keys` / `values` (`[1, kv_heads, L, head_dim]`) and returns what attention sees.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(2) == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// The mask for `n` new queries with a sliding `window` (mlx-lm `make_mask`).
    pub fn make_mask(&self, n: i32, window: i32) -> Mask {
        if n > 1 {
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window {
                Mask::Array(causal_mask(n, offset, Some(window)))
            } else {
                Mask::Causal
            }
        } else {
            // The ring never holds more than `max_size` = window entries after a one-token
            // update, so every cached key is inside the window.
            Mask::None
        }
    }

    /// Positions seen so far (not the number held).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.keys.iter().chain(self.values.iter())
    }
}

/// The cache of one layer.
#[derive(Clone)]
pub enum LayerCache {
    /// Full attention.
    Full(KvCache),
    /// Sliding-window attention.
    Rotating(RotatingKvCache),
}

impl LayerCache {
    /// Positions seen so far.
    pub fn offset(&self) -> i32 {
        match self {
            LayerCache::Full(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
        }
    }

    /// Adds new keys / values and returns those attention sees.
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match self {
            LayerCache::Full(c) => c.update_and_fetch(keys, values),
            LayerCache::Rotating(c) => c.update_and_fetch(keys, values),
        }
    }

    /// The mask for `n` new queries (`window` applies to rotating caches only).
    pub fn make_mask(&self, n: i32, window: i32) -> Mask {
        match self {
            LayerCache::Full(c) => c.make_mask(n),
            LayerCache::Rotating(c) => c.make_mask(n, window),
        }
    }

    /// Positions a shared batch slot of this layer needs: a ring's window, else 0 (a full
    /// layer's slot grows with its rows).
    pub fn slot_window(&self) -> i32 {
        match self {
            LayerCache::Full(_) => 0,
            LayerCache::Rotating(c) => c.max_size,
        }
    }

    /// What a shared batch slot of this layer starts from.
    pub fn slot_plan(&self) -> Result<SlotPlan> {
        match self {
            LayerCache::Full(c) => c.slot_plan(),
            LayerCache::Rotating(c) => c.slot_plan(),
        }
    }

    /// Moves this layer's keys into a shared slot: drops its own buffers and keeps the
    /// bookkeeping `plan` leaves.
    fn enter_slot(&mut self, plan: &SlotPlan) {
        match self {
            LayerCache::Full(c) => {
                c.keys = None;
                c.values = None;
            }
            LayerCache::Rotating(c) => {
                c.keys = None;
                c.values = None;
                c.idx = plan.idx;
                c.slot_len = plan.len;
            }
        }
    }

    /// One position of a slotted layer: (write position in the slot, keys visible after it).
    pub fn advance_slot(&mut self) -> (i32, i32) {
        match self {
            LayerCache::Full(c) => c.advance_slot(),
            LayerCache::Rotating(c) => c.advance_slot(),
        }
    }

    fn arrays(&self) -> Box<dyn Iterator<Item = &Array> + '_> {
        match self {
            LayerCache::Full(c) => Box::new(c.arrays()),
            LayerCache::Rotating(c) => Box::new(c.arrays()),
        }
    }
}

/// The error for a row cache without an entry for `layer` (made by another model).
pub fn missing_layer(layer: usize) -> Error {
    Error::InvalidArgument(format!(
        "row cache has no entry for layer {layer}: was it made by this model?"
    ))
}

/// All layers' caches of ONE sequence. Memory grows with the positions actually cached
/// (in 256-position steps), and sliding layers never hold more than their window (+ the
/// length of the last multi-token update).
///
/// In a batch with a shared KV ([`super::batch_kv`]) the keys / values live in the row's
/// slot of the batch's buffers and the row keeps only the bookkeeping.
pub struct RowCache {
    layers: Vec<LayerCache>,
    slot: Option<Slot>,
    /// For a draft row of a verification step: the slot of the sequence it drafts for.
    draft_of: Option<i32>,
}

impl RowCache {
    /// A cache made of the given per-layer caches (one per layer that owns keys / values).
    pub fn new(layers: Vec<LayerCache>) -> RowCache {
        RowCache {
            layers,
            slot: None,
            draft_of: None,
        }
    }

    /// The shared batch slot holding this row's keys, if it joined one.
    pub fn slot(&self) -> Option<&Slot> {
        self.slot.as_ref()
    }

    /// A draft row of a verification step over this slotted sequence: the cache of the
    /// sequence's position `ahead` positions past its next one, its sliding layers in
    /// `scratch` (see [`super::batch_kv::update_rows`]), its full layers in the sequence's slot.
    /// It holds no keys of its own; dropping it frees `scratch`.
    pub fn draft_row(&self, ahead: usize, scratch: Slot) -> Result<RowCache> {
        let Some(base) = self.slot.as_ref().map(Slot::index) else {
            return Err(Error::InvalidArgument(
                "draft rows need a sequence in a shared KV slot".into(),
            ));
        };
        if self.draft_of.is_some() {
            return Err(Error::InvalidArgument(
                "a draft row cannot draft for another".into(),
            ));
        }
        let mut row = RowCache {
            layers: self.layers.clone(),
            slot: Some(scratch),
            draft_of: Some(base),
        };
        row.advance_slots(ahead);
        Ok(row)
    }

    /// The bookkeeping of `n` more positions in every layer of a slotted row (see
    /// [`LayerCache::advance_slot`]), their write positions discarded.
    pub fn advance_slots(&mut self, n: usize) {
        for layer in &mut self.layers {
            for _ in 0..n {
                layer.advance_slot();
            }
        }
    }

    /// The slot of the sequence this row drafts for (`None`: not a draft row).
    pub fn draft_of(&self) -> Option<i32> {
        self.draft_of
    }

    /// Every layer's slot plan, in layer order.
    pub fn slot_plans(&self) -> Result<Vec<SlotPlan>> {
        self.layers.iter().map(LayerCache::slot_plan).collect()
    }

    /// Moves the keys into `slot` (whose buffers already hold `plans`' data).
    pub fn enter_slot(&mut self, slot: Slot, plans: &[SlotPlan]) {
        for (layer, plan) in self.layers.iter_mut().zip(plans) {
            layer.enter_slot(plan);
        }
        self.slot = Some(slot);
    }

    /// Positions processed so far (the offset of the next token).
    pub fn offset(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |c| c.offset().max(0) as usize)
    }

    /// Number of per-layer caches.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when the model owns no cache (never for the supported models).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The cache of cache slot `i`.
    pub fn layer(&self, i: usize) -> Option<&LayerCache> {
        self.layers.get(i)
    }

    /// The cache of cache slot `i`, mutably.
    pub fn layer_mut(&mut self, i: usize) -> Option<&mut LayerCache> {
        self.layers.get_mut(i)
    }

    /// Bytes of key / value buffers currently allocated.
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.arrays())
            .map(Array::nbytes)
            .sum()
    }

    /// The key / value buffers (to evaluate them together with other outputs).
    pub fn arrays(&self) -> Vec<&Array> {
        self.layers.iter().flat_map(|l| l.arrays()).collect()
    }

    /// Evaluates the cached arrays (so the lazy graph that produced them can be freed).
    pub fn eval(&self) -> Result<()> {
        mlx_rs::transforms::eval(self.arrays())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx_ffi::graph_census;

    /// One new position: the write is one `SliceUpdate` per buffer (no reshapes around it),
    /// the fetch one `Slice` per buffer, in both cache kinds.
    #[test]
    fn a_one_position_update_is_one_write_and_one_slice_per_buffer() {
        let kv = |pos: i32| {
            let a = Array::from_slice(&[pos as f32; 2 * 4], &[1, 2, 1, 4]);
            a.eval().unwrap();
            a
        };
        let mut full = LayerCache::Full(KvCache::default());
        let mut ring = LayerCache::Rotating(RotatingKvCache::new(8));
        for cache in [&mut full, &mut ring] {
            for pos in 0..3 {
                let (k, v) = cache.update_and_fetch(&kv(pos), &kv(pos)).unwrap();
                mlx_rs::transforms::eval([&k, &v]).unwrap();
            }
            let (k, v) = cache.update_and_fetch(&kv(3), &kv(3)).unwrap();
            let census = graph_census(&[&k, &v]).unwrap();
            assert_eq!(census.count("SliceUpdate"), 2, "{census:?}");
            assert_eq!(census.count("Slice"), 2, "{census:?}");
            assert_eq!(census.nodes, 4, "{census:?}");
            let want = Array::from_slice(
                &[
                    0f32, 0., 0., 0., 1., 1., 1., 1., 2., 2., 2., 2., 3., 3., 3., 3.,
                ]
                .repeat(2),
                &[1, 2, 4, 4],
            );
            assert!(k.eq_values(&want).unwrap());
        }
    }
}
