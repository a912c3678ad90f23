//! A key / value buffer per layer shared by every row of a decode batch (the batched decoder's
//! default on MLX CUDA, see [`crate::engine::Decoder::shared_kv`]).
//!
//! Why: with per-row caches a batched decode step writes each row's new keys and values with
//! one `SliceUpdate` per row, layer and tensor (384 nodes in an eight-row e4b step), and a
//! GPU step is bound by MLX's host work per node. Here each layer keeps ONE buffer per tensor,
//! `[slots, kv_heads, capacity, head_dim]`, and a step writes all its rows with one `Scatter`
//! per layer and tensor; row `r` attends over the view `[slot_r, :, 0..visible_r, :]`.
//!
//! Bits: a row's view holds the keys of its serial cache at the same positions, in the same
//! order (full layers store position `p` at `p`; sliding layers follow the serial ring,
//! see [`super::cache`]'s slot plans), so attention, which reads the views through their
//! strides, sums what the serial step sums in the same order.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::cache::{missing_layer, RowCache, STEP};
use crate::error::{Error, Result};
use crate::mlx_ffi::{scatter, slice_update};

/// The KV layout `MEMEXEC_BATCH_KV` asks batched decoding for: `Some(true)` for `shared`,
/// `Some(false)` for `per-row`, `None` (the decoder's default) for anything else or nothing.
pub fn shared_from_env() -> Option<bool> {
    parse_layout(std::env::var("MEMEXEC_BATCH_KV").ok().as_deref())
}

fn parse_layout(value: Option<&str>) -> Option<bool> {
    match value.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("shared") => Some(true),
        Some(v) if v.eq_ignore_ascii_case("per-row") => Some(false),
        _ => None,
    }
}

/// One layer's buffers, `[slots, kv_heads, capacity, head_dim]`.
struct LayerBuffers {
    keys: Array,
    values: Array,
}

/// The shared buffers of a batch and which slots rows hold.
#[derive(Default)]
pub struct SharedKv {
    layers: Vec<Option<LayerBuffers>>,
    /// Slots along the buffers' first axis, and whether a row holds each (shared with the
    /// row's [`Slot`], which clears it when dropped even while the buffers are locked).
    taken: Vec<Arc<AtomicBool>>,
    /// The slot / position index arrays of the current step, per distinct content: the layers
    /// of one type write the same places, so they share one pair of host-made arrays.
    places: Vec<(Vec<i32>, [Array; 4])>,
}

/// A row's hold on a slot of a [`SharedKv`]; dropping it frees the slot.
pub struct Slot {
    kv: Arc<Mutex<SharedKv>>,
    index: i32,
    held: Arc<AtomicBool>,
}

impl Slot {
    /// The slot's index along the buffers' first axis.
    pub fn index(&self) -> i32 {
        self.index
    }

    /// The buffers this slot belongs to.
    pub fn shared(&self) -> &Arc<Mutex<SharedKv>> {
        &self.kv
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The flag frees the slot without the lock: a row dropped while its thread holds the
        // buffers (or after a step panicked with them) still gives its slot back.
        self.held.store(false, Ordering::Release);
        if let Ok(mut kv) = self.kv.try_lock() {
            if kv.rows() == 0 {
                // The last row left: the buffers go with it (the next batch may be smaller).
                *kv = SharedKv::default();
            }
        }
    }
}

/// `buf` with `extra` more positions (zeros) along `axis`.
fn grow(buf: &Array, axis: i32, extra: i32) -> Result<Array> {
    let mut shape = buf.shape().to_vec();
    shape[axis as usize] = extra;
    Ok(concatenate(
        &[buf.clone(), zeros_dtype(&shape, buf.dtype())?],
        axis,
    )?)
}

impl SharedKv {
    /// Empty buffers, shared by the rows that [`join`] them.
    pub fn new() -> Arc<Mutex<SharedKv>> {
        Arc::new(Mutex::new(SharedKv::default()))
    }

    /// Rows holding a slot.
    pub fn rows(&self) -> usize {
        self.taken
            .iter()
            .filter(|t| t.load(Ordering::Acquire))
            .count()
    }

    /// Slots along the buffers' first axis, held or free: the buffers keep every slot they
    /// were grown to until the last row leaves.
    pub fn slots(&self) -> usize {
        self.taken.len()
    }

    /// Bytes of the buffers.
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|b| b.keys.nbytes() + b.values.nbytes())
            .sum()
    }

    /// Layer `layer`'s buffers, made or grown to hold `slots` slots and `positions`
    /// positions like `like` (`[1, kv_heads, n, head_dim]` keys / values).
    fn fitted(
        &self,
        layer: usize,
        like: (&Array, &Array),
        slots: i32,
        positions: i32,
    ) -> Result<(Array, Array)> {
        let make = |a: &Array, cap: i32| -> Result<Array> {
            let s = a.shape();
            Ok(zeros_dtype(&[slots, s[1], cap, s[3]], a.dtype())?)
        };
        let (keys, values) = match self.layers.get(layer).and_then(Option::as_ref) {
            Some(b) => (b.keys.clone(), b.values.clone()),
            None => {
                let cap = round_up(positions);
                return Ok((make(like.0, cap)?, make(like.1, cap)?));
            }
        };
        let fit = |mut buf: Array| -> Result<Array> {
            if buf.dim(0) < slots {
                buf = grow(&buf, 0, slots - buf.dim(0))?;
            }
            if buf.dim(2) < positions {
                buf = grow(&buf, 2, round_up(positions) - buf.dim(2))?;
            }
            Ok(buf)
        };
        Ok((fit(keys)?, fit(values)?))
    }

    /// Carries out `plan` in layer `layer` (new keys / values `[rows, kv_heads, 1, head_dim]`):
    /// the slot copies first, then the writes; returns what the rows attend over.
    fn write(
        &mut self,
        layer: usize,
        plan: WritePlan,
        keys: &Array,
        values: &Array,
    ) -> Result<SlotRows> {
        let rows = keys.dim(0);
        let positions = plan.at.iter().map(|&(_, p)| p + 1).max().unwrap_or(0);
        let slots = self.taken.len() as i32;
        let Some(Some(current)) = self.layers.get(layer) else {
            return Err(missing_layer(layer));
        };
        let (mut kb, mut vb) = if current.keys.dim(2) < positions {
            let (k, v) = (current.keys.clone(), current.values.clone());
            self.fitted(layer, (&k, &v), slots, positions)?
        } else {
            (current.keys.clone(), current.values.clone())
        };
        if !plan.copies.is_empty() {
            let n = plan.copies.len() as i32;
            let dst: Vec<i32> = plan.copies.iter().map(|&(d, _)| d).collect();
            let src: Vec<i32> = plan.copies.iter().map(|&(_, s)| s).collect();
            let (dst, src) = (Array::from_slice(&dst, &[n]), Array::from_slice(&src, &[n]));
            kb = copy_slots(&kb, &dst, &src)?;
            vb = copy_slots(&vb, &dst, &src)?;
        }
        let [slot_idx, pos_idx, read_idx, seen_idx] = self.places(&plan);
        let as_update = |a: &Array| -> Result<Array> {
            let a = match &plan.from_rows {
                Some(from) => a.take_axis(from, 0)?,
                None => a.clone(),
            };
            let s = a.shape();
            Ok(a.reshape(&[s[0], 1, s[1], 1, s[3]])?)
        };
        let kb = scatter(&kb, &[&slot_idx, &pos_idx], &as_update(keys)?, &[0, 2])?;
        let vb = scatter(&vb, &[&slot_idx, &pos_idx], &as_update(values)?, &[0, 2])?;
        self.layers[layer] = Some(LayerBuffers {
            keys: kb.clone(),
            values: vb.clone(),
        });
        debug_assert_eq!(plan.read.len() as i32, rows);
        Ok(SlotRows {
            keys: kb,
            values: vb,
            slots: read_idx,
            slot_ids: plan.read,
            visible: plan.visible,
            visible_array: seen_idx,
        })
    }

    /// Copies slot `src` of every layer in `layers` to slot `dst` (lazily, like a write).
    fn copy_slot(&mut self, layers: &[usize], dst: i32, src: i32) -> Result<()> {
        let (d, s) = (
            Array::from_slice(&[dst], &[1]),
            Array::from_slice(&[src], &[1]),
        );
        for &layer in layers {
            let Some(Some(b)) = self.layers.get_mut(layer) else {
                return Err(missing_layer(layer));
            };
            for buf in [&mut b.keys, &mut b.values] {
                *buf = copy_slots(buf, &d, &s)?;
            }
        }
        Ok(())
    }

    /// The index arrays of a step's writes and reads: the slot and position of each write,
    /// the slot each row reads and the positions it then attends over, shared by the layers
    /// that write the same places in a step (made once on the host for all of them).
    fn places(&mut self, plan: &WritePlan) -> [Array; 4] {
        let key: Vec<i32> = plan
            .at
            .iter()
            .flat_map(|&(s, p)| [s, p])
            .chain([-1])
            .chain(
                plan.read
                    .iter()
                    .zip(&plan.visible)
                    .flat_map(|(&s, &v)| [s, v]),
            )
            .collect();
        if let Some((_, arrays)) = self.places.iter().find(|(k, _)| *k == key) {
            return arrays.clone();
        }
        let (n, rows) = (plan.at.len() as i32, plan.read.len() as i32);
        let slots: Vec<i32> = plan.at.iter().map(|&(s, _)| s).collect();
        let positions: Vec<i32> = plan.at.iter().map(|&(_, p)| p).collect();
        let arrays = [
            Array::from_slice(&slots, &[n]),
            Array::from_slice(&positions, &[n]),
            Array::from_slice(&plan.read, &[rows]),
            Array::from_slice(&plan.visible, &[rows]),
        ];
        // A step writes at most two kinds of places (full and sliding layers); older ones
        // belong to earlier steps.
        if self.places.len() >= 2 {
            self.places.remove(0);
        }
        self.places.push((key, arrays.clone()));
        arrays
    }
}

/// `buf` (`[slots, ...]`) with slot `dst[i]` replaced by slot `src[i]` (int32 `[n]` arrays):
/// one take and one scatter, lazily.
fn copy_slots(buf: &Array, dst: &Array, src: &Array) -> Result<Array> {
    let mut shape = buf.shape().to_vec();
    shape[0] = 1;
    shape.insert(0, src.dim(0));
    let slots = buf.take_axis(src, 0)?.reshape(&shape)?;
    scatter(buf, &[dst], &slots, &[0])
}

/// What one layer's step does to the shared buffers.
struct WritePlan {
    /// `(slot, position)` of each write.
    at: Vec<(i32, i32)>,
    /// The row whose new keys each write takes (`None`: write `i` takes row `i`).
    from_rows: Option<Array>,
    /// `(destination, source)` slots copied before the writes.
    copies: Vec<(i32, i32)>,
    /// The slot each row reads.
    read: Vec<i32>,
    /// The positions each row attends over.
    visible: Vec<i32>,
}

/// The buffers, for this thread's step (the lock is never contended: every row of a batch
/// lives on the engine thread; it only makes a row's cache `Send`).
fn lock(kv: &Mutex<SharedKv>) -> Result<MutexGuard<'_, SharedKv>> {
    kv.lock()
        .map_err(|_| Error::Internal("shared KV: a step panicked while writing it".into()))
}

fn round_up(positions: i32) -> i32 {
    (positions.max(1) + STEP - 1) / STEP * STEP
}

/// Moves `cache`'s keys into a free slot of `kv` (growing the buffers as needed). On error
/// neither changes.
pub fn join(kv: &Arc<Mutex<SharedKv>>, cache: &mut RowCache) -> Result<()> {
    if cache.slot().is_some() {
        return Err(Error::Internal(
            "row cache already holds a shared slot".into(),
        ));
    }
    let plans = cache.slot_plans()?;
    if plans.iter().any(|p| p.data.is_none()) {
        return Err(Error::InvalidArgument(
            "a row joins a shared KV only after its prefill".into(),
        ));
    }
    let mut shared = lock(kv)?;
    if shared.rows() == 0 && !shared.taken.is_empty() {
        // The last row left while the buffers were locked: drop them now (see `Slot::drop`).
        *shared = SharedKv::default();
    }
    let index = shared.free_slot();
    let slots = (shared.taken.len() as i32).max(index + 1);
    let mut buffers = Vec::with_capacity(plans.len());
    for (layer, plan) in plans.iter().enumerate() {
        let lc = cache.layer(layer).ok_or_else(|| missing_layer(layer))?;
        let window = lc.slot_window();
        let Some((k, v)) = &plan.data else {
            return Err(Error::Internal("shared KV: a plan lost its data".into()));
        };
        let held = k.dim(2);
        // A full layer's next write goes at its offset; a ring's slot holds its window.
        let positions = if window > 0 { window } else { lc.offset() + 1 };
        let (kb, vb) = shared.fitted(layer, (k, v), slots, positions.max(held))?;
        let write = |buf: &Array, new: &Array| -> Result<Array> {
            let s = new.shape();
            slice_update(buf, new, &[index, 0, 0, 0], &[index + 1, s[1], s[2], s[3]])
        };
        buffers.push(Some(LayerBuffers {
            keys: write(&kb, k)?,
            values: write(&vb, v)?,
        }));
    }
    if shared.layers.len() < buffers.len() {
        shared.layers.resize_with(buffers.len(), || None);
    }
    for (layer, b) in buffers.into_iter().enumerate() {
        shared.layers[layer] = b;
    }
    let held = shared.hold(index, slots)?;
    drop(shared);
    cache.enter_slot(
        Slot {
            kv: kv.clone(),
            index,
            held,
        },
        &plans,
    );
    Ok(())
}

/// A free slot of `kv` for a draft row (see [`RowCache::draft_row`]): no keys are copied;
/// the verification step fills what the row reads.
pub fn reserve(kv: &Arc<Mutex<SharedKv>>) -> Result<Slot> {
    let mut shared = lock(kv)?;
    if shared.rows() == 0 {
        return Err(Error::InvalidArgument(
            "a draft slot belongs to a shared KV that holds its sequence".into(),
        ));
    }
    let index = shared.free_slot();
    let slots = (shared.taken.len() as i32).max(index + 1);
    let held = shared.hold(index, slots)?;
    Ok(Slot {
        kv: kv.clone(),
        index,
        held,
    })
}

impl SharedKv {
    /// The first slot no row holds (one past the last when all are held).
    fn free_slot(&self) -> i32 {
        let free = self.taken.iter().position(|t| !t.load(Ordering::Acquire));
        free.unwrap_or(self.taken.len()) as i32
    }

    /// Marks slot `index` held, after growing every layer's buffers to `slots` slots.
    fn hold(&mut self, index: i32, slots: i32) -> Result<Arc<AtomicBool>> {
        // Slots added for a row in one layer are added in every layer (all share `slots`).
        for layer in self.layers.iter_mut().flatten() {
            for buf in [&mut layer.keys, &mut layer.values] {
                if buf.dim(0) < slots {
                    *buf = grow(buf, 0, slots - buf.dim(0))?;
                }
            }
        }
        if self.taken.len() < slots as usize {
            self.taken
                .resize_with(slots as usize, || Arc::new(AtomicBool::new(false)));
        }
        let held = self.taken[index as usize].clone();
        held.store(true, Ordering::Release);
        Ok(held)
    }
}

/// Evaluates the buffers (so the graph that built them, e.g. rows' joins, can be freed).
pub fn eval(kv: &Mutex<SharedKv>) -> Result<()> {
    let shared = lock(kv)?;
    let arrays: Vec<&Array> = shared
        .layers
        .iter()
        .flatten()
        .flat_map(|b| [&b.keys, &b.values])
        .collect();
    mlx_rs::transforms::eval(arrays)?;
    Ok(())
}

/// One layer's keys / values of a step over a [`SharedKv`]: the buffers after the step's
/// writes and, per row, its slot and how many positions it attends over. Row `r` attends over
/// `[slot_r, :, 0..visible_r, :]` of each buffer: [`SlotRows::views`] as arrays, or the buffers
/// themselves with the slot array where a kernel reads them by slot
/// ([`super::slot_attention`]), which saves a view node per row, layer and tensor.
#[derive(Clone)]
pub struct SlotRows {
    /// Keys, `[slots, kv_heads, capacity, head_dim]`.
    pub keys: Array,
    /// Values, shaped like the keys.
    pub values: Array,
    /// Each row's slot, an int32 `[rows]` array (the one the step's writes used).
    pub slots: Array,
    /// Each row's slot, on the host.
    pub slot_ids: Vec<i32>,
    /// Positions each row attends over.
    pub visible: Vec<i32>,
    /// `visible` as an int32 `[rows]` array (a kernel's output carries no shape to read it
    /// from).
    pub visible_array: Array,
}

impl SlotRows {
    /// Rows of the step.
    pub fn len(&self) -> usize {
        self.visible.len()
    }

    /// True when the step has no rows.
    pub fn is_empty(&self) -> bool {
        self.visible.is_empty()
    }

    /// Each row's `[1, kv_heads, visible, head_dim]` keys / values: views of its slot.
    pub fn views(&self) -> Result<Vec<(Array, Array)>> {
        self.slot_ids
            .iter()
            .zip(&self.visible)
            .map(|(&slot, &seen)| {
                Ok((
                    self.keys.try_index((slot..slot + 1, .., 0..seen, ..))?,
                    self.values.try_index((slot..slot + 1, .., 0..seen, ..))?,
                ))
            })
            .collect()
    }
}

/// Writes one new position of each row (`keys` / `values` `[rows, kv_heads, 1, head_dim]`,
/// row `r` of `caches[r]`, which all hold slots of one [`SharedKv`]) into layer `layer` and
/// returns what each row attends over.
///
/// Draft rows ([`RowCache::draft_row`]) follow their sequence's row in the batch, in order,
/// and see what the serial cache would hold at their position: in a full layer they write to
/// and read the sequence's slot (position `p + i` at `p + i`); in a sliding layer, whose ring
/// serial overwrites in place, each reads its own scratch slot, made a copy of the sequence's
/// ring and then given the new keys of its group's rows up to itself.
pub fn update_rows(
    caches: &mut [&mut RowCache],
    layer: usize,
    keys: &Array,
    values: &Array,
) -> Result<SlotRows> {
    let kv = match caches.first().and_then(|c| c.slot()) {
        Some(slot) => slot.shared().clone(),
        None => return Err(Error::Internal("shared KV update of unslotted rows".into())),
    };
    if keys.dim(2) != 1 || keys.dim(0) as usize != caches.len() {
        return Err(Error::InvalidArgument(format!(
            "a shared KV takes one position per row per step, got keys {:?} for {} rows",
            keys.shape(),
            caches.len()
        )));
    }
    let mut rows = Vec::with_capacity(caches.len());
    for cache in caches.iter_mut() {
        let slot = match cache.slot() {
            Some(s) if Arc::ptr_eq(s.shared(), &kv) => s.index(),
            _ => {
                return Err(Error::Internal(
                    "a batch mixes rows with and without the shared KV".into(),
                ))
            }
        };
        let base = cache.draft_of().unwrap_or(slot);
        let lc = cache.layer_mut(layer).ok_or_else(|| missing_layer(layer))?;
        let sliding = lc.slot_window() > 0;
        let (pos, seen) = lc.advance_slot();
        rows.push(RowPlace {
            slot,
            base,
            pos,
            seen,
            sliding,
        });
    }
    let plan = plan_writes(&rows)?;
    let rows = lock(&kv)?.write(layer, plan, keys, values)?;
    Ok(rows)
}

/// Where one row of a step writes in one layer, from its own bookkeeping.
struct RowPlace {
    /// The row's own slot.
    slot: i32,
    /// The slot of its sequence (its own unless it is a draft row).
    base: i32,
    /// The position it writes (a ring index in a sliding layer).
    pos: i32,
    /// The positions it then attends over.
    seen: i32,
    /// Whether the layer is a sliding one (a ring serial overwrites in place).
    sliding: bool,
}

impl RowPlace {
    fn leads(&self) -> bool {
        self.slot == self.base
    }
}

/// The writes, copies and reads of one layer's step (see [`update_rows`]).
fn plan_writes(rows: &[RowPlace]) -> Result<WritePlan> {
    let visible = rows.iter().map(|r| r.seen).collect();
    if rows.iter().all(RowPlace::leads) {
        return Ok(WritePlan {
            at: rows.iter().map(|r| (r.slot, r.pos)).collect(),
            from_rows: None,
            copies: Vec::new(),
            read: rows.iter().map(|r| r.slot).collect(),
            visible,
        });
    }
    let mut at = Vec::new();
    let mut from = Vec::new();
    let mut copies = Vec::new();
    let mut read = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        if row.leads() {
            at.push((row.slot, row.pos));
            from.push(r as i32);
            read.push(row.slot);
            continue;
        }
        // The rows before this one in its group: the sequence's row, then earlier drafts.
        let lead = rows[..r]
            .iter()
            .rposition(|l| l.leads() && l.slot == row.base)
            .ok_or_else(|| Error::Internal("a draft row comes before its sequence's row".into()))?;
        if rows[lead + 1..r].iter().any(|m| m.base != row.base) {
            return Err(Error::Internal(
                "a draft row is not next to its sequence's rows".into(),
            ));
        }
        if !row.sliding {
            at.push((row.base, row.pos));
            from.push(r as i32);
            read.push(row.base);
            continue;
        }
        copies.push((row.slot, row.base));
        for (m, earlier) in rows.iter().enumerate().take(r).skip(lead) {
            at.push((row.slot, earlier.pos));
            from.push(m as i32);
        }
        at.push((row.slot, row.pos));
        from.push(r as i32);
        read.push(row.slot);
    }
    let n = from.len() as i32;
    Ok(WritePlan {
        at,
        from_rows: Some(Array::from_slice(&from, &[n])),
        copies,
        read,
        visible,
    })
}

/// Ends a verification step of `seq` (the sequence's row) and its draft rows `drafts` (in
/// order), of which the first `accepted` matched the sequence's greedy tokens: the sequence
/// moves past them, its sliding layers take the ring of the last accepted draft row (full
/// layers already hold those positions; positions past them are written again later).
pub fn accept(seq: &mut RowCache, drafts: &[&RowCache], accepted: usize) -> Result<()> {
    if accepted == 0 {
        return Ok(());
    }
    let (Some(slot), Some(last)) = (seq.slot(), drafts.get(accepted - 1)) else {
        return Err(Error::InvalidArgument(format!(
            "accepting {accepted} of {} draft rows of an unslotted sequence or beyond them",
            drafts.len()
        )));
    };
    let (base, kv) = (slot.index(), slot.shared().clone());
    let Some(src) = last.slot().map(Slot::index) else {
        return Err(Error::Internal("a draft row lost its slot".into()));
    };
    if last.draft_of() != Some(base) {
        return Err(Error::InvalidArgument(
            "the draft rows belong to another sequence".into(),
        ));
    }
    seq.advance_slots(accepted);
    let sliding: Vec<usize> = (0..seq.len())
        .filter(|&l| seq.layer(l).is_some_and(|c| c.slot_window() > 0))
        .collect();
    let copied = lock(&kv)?.copy_slot(&sliding, base, src);
    copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::RowKv;
    use crate::model::cache::{KvCache, LayerCache, RotatingKvCache};

    const WINDOW: i32 = 8;

    /// Distinct values for every (row, step) write: `[rows, 2 heads, len, 2]`.
    fn kv(rows: i32, len: i32, seed: i32) -> Array {
        let n = rows * 2 * len * 2;
        let data: Vec<f32> = (0..n).map(|i| (seed * 100_000 + i) as f32).collect();
        Array::from_slice(&data, &[rows, 2, len, 2])
    }

    fn cache() -> RowCache {
        RowCache::new(vec![
            LayerCache::Full(KvCache::default()),
            LayerCache::Rotating(RotatingKvCache::new(WINDOW)),
        ])
    }

    /// Two caches prefilled with the same `len` positions: one stays per-row, one joins.
    fn twins(len: i32, seed: i32) -> (RowCache, RowCache) {
        let (mut a, mut b) = (cache(), cache());
        for c in [&mut a, &mut b] {
            for layer in 0..2 {
                let lc = c.layer_mut(layer).unwrap();
                lc.update_and_fetch(&kv(1, len, seed), &kv(1, len, -seed))
                    .unwrap();
            }
        }
        (a, b)
    }

    fn same(a: &Array, b: &Array) -> bool {
        a.shape() == b.shape() && a.eq_values(b).unwrap()
    }

    /// Every step, each row's view of the shared buffers equals what its per-row cache
    /// returns, bit for bit: prompts shorter than, equal to and longer than the window (ring
    /// growth, wrap and trim), full layers past their 256-position growth, a row leaving and
    /// a new one taking its slot.
    #[test]
    fn each_row_sees_its_serial_cache() {
        let kvs = SharedKv::new();
        let mut serial = Vec::new();
        let mut shared = Vec::new();
        for (r, len) in [3, 7, 8, 9, 20, 300].into_iter().enumerate() {
            let (a, mut b) = twins(len, r as i32 + 1);
            join(&kvs, &mut b).unwrap();
            serial.push(a);
            shared.push(b);
        }
        for step in 0..270 {
            if step == 40 {
                serial.remove(2);
                shared.remove(2);
                assert_eq!(lock(&kvs).unwrap().rows(), 5);
                let (a, mut b) = twins(11, 77);
                join(&kvs, &mut b).unwrap();
                assert_eq!(b.slot().map(Slot::index), Some(2), "the freed slot");
                serial.push(a);
                shared.push(b);
            }
            let rows = serial.len() as i32;
            for layer in 0..2 {
                let (k, v) = (kv(rows, 1, 1000 + step), kv(rows, 1, -1000 - step));
                let mut refs: Vec<&mut RowCache> = serial.iter_mut().collect();
                let mut want = RowKv::update(&mut refs, layer, &k, &v).unwrap();
                let mut refs: Vec<&mut RowCache> = shared.iter_mut().collect();
                let mut got = RowKv::update(&mut refs, layer, &k, &v).unwrap();
                assert!(got.slots().is_some());
                for r in 0..rows as usize {
                    let (w, g) = (want.row(r).unwrap(), got.row(r).unwrap());
                    assert!(
                        same(&w.0, &g.0) && same(&w.1, &g.1),
                        "step {step}, layer {layer}, row {r}: {:?} vs {:?}",
                        w.0.shape(),
                        g.0.shape()
                    );
                }
            }
            eval(&kvs).unwrap();
        }
        drop(shared);
        let left = lock(&kvs).unwrap();
        assert_eq!(
            (left.rows(), left.nbytes()),
            (0, 0),
            "the last row frees the buffers"
        );
    }

    #[test]
    fn the_variable_names_a_layout_or_leaves_the_default() {
        assert_eq!(parse_layout(Some(" Shared ")), Some(true));
        assert_eq!(parse_layout(Some("per-row")), Some(false));
        for v in [None, Some(""), Some("1"), Some("per_row")] {
            assert_eq!(parse_layout(v), None, "{v:?}");
        }
    }

    /// Row `r` of a `[rows, heads, 1, dim]` array.
    fn row_of(a: &Array, r: i32) -> Array {
        a.try_index((r..r + 1, .., .., ..)).unwrap()
    }

    /// A sequence verifying three drafts per step next to an ordinary row: each draft row sees
    /// what the serial cache holds after the positions up to its own (full layers past their
    /// 256-position growth, the ring growing, wrapping and overwriting in place), whatever
    /// number of drafts each step accepts; afterwards the sequence equals a serial cache fed
    /// the accepted positions, and the scratch slots are free again.
    #[test]
    fn draft_rows_see_the_serial_cache_at_their_positions() {
        const DRAFTS: usize = 3;
        let kvs = SharedKv::new();
        let (mut other_serial, mut other) = twins(5, 9);
        let (mut serial, mut seq) = twins(6, 1);
        join(&kvs, &mut other).unwrap();
        join(&kvs, &mut seq).unwrap();
        let rows = 2 + DRAFTS as i32;
        let step_kv = |step: i32| (kv(rows, 1, 1000 + step), kv(rows, 1, -1000 - step));
        for step in 0..130 {
            let mut drafts: Vec<RowCache> = (0..DRAFTS)
                .map(|i| seq.draft_row(i + 1, reserve(&kvs).unwrap()).unwrap())
                .collect();
            let (k, v) = step_kv(step);
            for layer in 0..2 {
                let mut refs: Vec<&mut RowCache> = [&mut other, &mut seq]
                    .into_iter()
                    .chain(drafts.iter_mut())
                    .collect();
                let mut got = RowKv::update(&mut refs, layer, &k, &v).unwrap();
                assert!(got.slots().is_some());
                let want = other_serial
                    .layer_mut(layer)
                    .unwrap()
                    .update_and_fetch(&row_of(&k, 0), &row_of(&v, 0))
                    .unwrap();
                let g = got.row(0).unwrap();
                assert!(same(&want.0, &g.0) && same(&want.1, &g.1), "other row");
                let mut ahead = serial.layer(layer).unwrap().clone();
                for i in 0..=DRAFTS as i32 {
                    let want = ahead
                        .update_and_fetch(&row_of(&k, 1 + i), &row_of(&v, 1 + i))
                        .unwrap();
                    let g = got.row(1 + i as usize).unwrap();
                    assert!(
                        same(&want.0, &g.0) && same(&want.1, &g.1),
                        "step {step}, layer {layer}, draft {i}: {:?} vs {:?}",
                        want.0.shape(),
                        g.0.shape()
                    );
                }
            }
            let accepted = (step as usize * 7 + 3) % (DRAFTS + 1);
            let refs: Vec<&RowCache> = drafts.iter().collect();
            accept(&mut seq, &refs, accepted).unwrap();
            for layer in 0..2 {
                let lc = serial.layer_mut(layer).unwrap();
                for i in 0..=accepted as i32 {
                    lc.update_and_fetch(&row_of(&k, 1 + i), &row_of(&v, 1 + i))
                        .unwrap();
                }
            }
            assert_eq!(seq.offset(), serial.offset(), "step {step}");
            drop(drafts);
            eval(&kvs).unwrap();
            mlx_rs::transforms::eval(serial.arrays().into_iter().chain(other_serial.arrays()))
                .unwrap();
            assert_eq!(lock(&kvs).unwrap().rows(), 2, "scratch slots freed");
        }
        assert!(
            serial.offset() > 256,
            "the full layer grew: {}",
            serial.offset()
        );
    }

    #[test]
    fn draft_rows_need_their_sequence_first() {
        let kvs = SharedKv::new();
        let (_, mut seq) = twins(4, 1);
        join(&kvs, &mut seq).unwrap();
        let mut draft = seq.draft_row(1, reserve(&kvs).unwrap()).unwrap();
        let (k, v) = (kv(2, 1, 5), kv(2, 1, -5));
        let mut refs: Vec<&mut RowCache> = vec![&mut draft, &mut seq];
        assert!(RowKv::update(&mut refs, 1, &k, &v).is_err());
        assert!(draft.draft_row(1, reserve(&kvs).unwrap()).is_err());
        let fresh = cache();
        assert!(fresh.draft_row(1, reserve(&kvs).unwrap()).is_err());
    }

    /// A row dropped while the buffers are locked (its thread inside a step, or a poisoned
    /// lock) still frees its slot: the next row takes it, and the buffers of a batch whose
    /// last row left that way go at the next join.
    #[test]
    fn a_row_dropped_under_the_lock_frees_its_slot() {
        let kvs = SharedKv::new();
        let (_, mut a) = twins(5, 1);
        let (_, mut b) = twins(6, 2);
        join(&kvs, &mut a).unwrap();
        join(&kvs, &mut b).unwrap();
        {
            let guard = lock(&kvs).unwrap();
            drop(a);
            assert_eq!(guard.rows(), 1);
            drop(b);
            assert_eq!(guard.rows(), 0);
            assert!(
                guard.nbytes() > 0,
                "buffers kept: the drop could not lock them"
            );
        }
        let (_, mut c) = twins(4, 3);
        join(&kvs, &mut c).unwrap();
        assert_eq!(c.slot().map(Slot::index), Some(0));
        let shared = lock(&kvs).unwrap();
        assert_eq!(shared.rows(), 1);
        assert_eq!(
            shared.taken.len(),
            1,
            "the old batch's buffers were dropped"
        );
    }

    #[test]
    fn a_row_without_a_prefill_cannot_join() {
        let kvs = SharedKv::new();
        let mut c = cache();
        assert!(join(&kvs, &mut c).is_err());
        assert!(c.slot().is_none());
        assert_eq!(lock(&kvs).unwrap().rows(), 0);
    }
}
