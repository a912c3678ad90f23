//! Continuous batching that gives the serial path's tokens (SPEC §4).
//!
//! Every admitted row is prefilled ALONE, exactly as the serial path does (B = 1, same chunks,
//! no padding to other rows), then joins the running set. Each step runs one decode forward
//! over all running rows; each row attends over its own cache with its own adapters, so its
//! logits equal the B = 1 ones bit for bit (the model guarantees row independence). Rows that
//! finish (stop id, `max_tokens`, cancellation) leave at once and drop their caches; waiting
//! rows join between steps.
//!
//! Steps are pipelined like mlx-lm's `generate_step`: a step is built on the previous step's
//! still-lazy picks and queued before the host reads them, so the device does not wait for the
//! host between steps. A row whose pending token turns out to end it leaves one step late (its
//! share of the step queued meanwhile is dropped with its cache); a row whose pending token is
//! surely its last (`max_tokens`) takes no part in the next step.
//!
//! A decoder given speculation ([`Decoder::with_speculation`]) verifies drafts for a row that
//! runs ALONE (a lone call, or the last row of a batch): its steps are then the verification
//! steps of [`super::speculative`], over the decoder's shared KV, and give the same tokens.
//! Rows that run together step plainly, pipelined.
//!
//! [`Decoder`] is the MLX-side mechanism (also used by the benchmark and the tests);
//! [`Batched`] drives it from the engine queue. [`select`] runs a start-up self-check and
//! falls back to the serial backend, saying why, if batched and serial ever disagree.
use std::cell::{Cell, OnceCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::backend::{Backend, BackendInfo, Generate, Intake, Serial};
use super::draft_schedule::DraftSchedule;
use super::model_backend::ModelBackend;
use super::request::{Completion, Job, StopReason};
use super::scheduler::{self, after_token, Limits, SharedBuffers, Verdict};
use super::speculative::{verify_step, SpeculateOptions, SpeculationStats, MAX_DRAFTS};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use mlx_rs::transforms::async_eval;

use crate::generate::{
    greedy, prefill, read_tokens, step_picks, DecodeProfile, GenerateOptions, PREFILL_STEP,
};
use crate::lora::{Activation, AdapterRegistry, AdapterStack};
use crate::model::batch_kv::{self, SharedKv};
use crate::model::{ForwardCtx, Model, RowCache};
use crate::{Error, Result};

/// One row to generate: its prompt ids (rendered), budget and adapters.
#[derive(Debug, Clone)]
pub struct RowRequest {
    /// The prompt ids, as fed to the model.
    pub prompt: Vec<u32>,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// The adapters this row runs with (prefill and decode).
    pub adapters: AdapterStack,
}

impl RowRequest {
    /// A base-model row.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> RowRequest {
        RowRequest {
            prompt,
            max_tokens,
            adapters: AdapterStack::none(),
        }
    }
}

/// A finished row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowOutput {
    /// Generated ids, without the stop id.
    pub ids: Vec<u32>,
    /// Why the row ended.
    pub stop: StopReason,
    /// The stop id that ended the row (with [`StopReason::Eos`]; not in `ids`).
    pub stop_id: Option<u32>,
    /// Prompt ids prefilled.
    pub prompt_tokens: usize,
    /// Time of the row's prefill.
    pub prefill_time: Duration,
    /// Summed time of the decode steps the row took part in.
    pub decode_time: Duration,
    /// What the row's drafts did, where the decoder speculates
    /// ([`Decoder::with_speculation`]); `None` otherwise.
    pub speculation: Option<SpeculationStats>,
}

/// The picks of one queued decode step, read from the device once, by the first row asking.
struct Picks {
    array: Array,
    host: OnceCell<Vec<u32>>,
}

/// A row's token of a queued step: `picks[index]`, not read yet.
struct Pending {
    picks: Rc<Picks>,
    index: usize,
}

impl Pending {
    /// Waits for the step and returns the token.
    fn read(&self) -> Result<u32> {
        if self.picks.host.get().is_none() {
            let v = read_tokens(&self.picks.array)?;
            let _ = self.picks.host.set(v);
        }
        self.picks
            .host
            .get()
            .and_then(|v| v.get(self.index))
            .copied()
            .ok_or_else(|| Error::Internal(format!("no pick {} in a decode step", self.index)))
    }

    /// The token as a lazy `[1, 1]` uint32 input of the next step.
    fn input(&self) -> Result<Array> {
        let a = &self.picks.array;
        let i = self.index as i32;
        let one = if a.size() == 1 {
            a.clone()
        } else {
            a.try_index(i..i + 1)?
        };
        Ok(one.reshape(&[1, 1])?)
    }
}

/// The picks array of the step queued last when `group` is exactly its rows, in its order
/// (each row pending at index `i` of the same picks, which hold as many tokens as `group`).
fn whole_picks<'a, T>(group: &'a [&mut Row<T>]) -> Option<&'a Array> {
    let first = &group.first()?.pending.as_ref()?.picks;
    let all = group.iter().enumerate().all(|(i, r)| {
        r.pending
            .as_ref()
            .is_some_and(|p| p.index == i && Rc::ptr_eq(&p.picks, first))
    });
    (all && first.array.size() == group.len()).then_some(&first.array)
}

/// A row's drafting state in a decoder that speculates.
struct RowDrafts {
    /// The prompt: lookup drafts come from it and the output.
    prompt: Vec<u32>,
    schedule: DraftSchedule,
    stats: SpeculationStats,
    /// Whether the row's pending step was queued while drafting was paused.
    pending_paused: bool,
}

/// A row in the running set: its cache, the token to feed next, what it generated so far.
pub struct Row<T> {
    tag: T,
    cache: RowCache,
    /// The last token taken (the next input when nothing is pending).
    last: u32,
    /// The row's token of the step queued last, not yet taken.
    pending: Option<Pending>,
    ids: Vec<u32>,
    max_tokens: usize,
    adapters: AdapterStack,
    prompt_tokens: usize,
    prefill_time: Duration,
    decode_time: Duration,
    /// Set where the decoder speculates.
    drafts: Option<RowDrafts>,
}

impl<T> Row<T> {
    /// What the caller attached to the row.
    pub fn tag(&self) -> &T {
        &self.tag
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.ids.len()
    }

    /// The caller's tag back (the cache is dropped).
    pub fn into_tag(self) -> T {
        self.tag
    }

    fn finish(self, stop: StopReason, stop_id: Option<u32>) -> (T, RowOutput) {
        (
            self.tag,
            RowOutput {
                ids: self.ids,
                stop,
                stop_id,
                prompt_tokens: self.prompt_tokens,
                prefill_time: self.prefill_time,
                decode_time: self.decode_time,
                speculation: self.drafts.map(|d| d.stats),
            },
        )
    }

    /// Counts the step whose token was just read (speculation statistics only).
    fn counted_read(mut self) -> Row<T> {
        if let Some(d) = &mut self.drafts {
            d.stats.steps += 1;
            d.stats.paused_steps += usize::from(d.pending_paused);
            d.pending_paused = false;
        }
        self
    }

    /// Counts a plain step queued for the row (the schedule's pause runs down).
    fn count_plain_step(&mut self) {
        if let Some(d) = &mut self.drafts {
            d.pending_paused = d.schedule.paused();
            d.schedule.plain_step();
        }
    }

    /// Applies the serial rule to `token`: the row runs on, or it ended with it.
    fn take(mut self, token: u32, stop_ids: &[u32]) -> Started<T> {
        let (tag, out) = match after_token(token, self.ids.len(), self.max_tokens, stop_ids) {
            Verdict::Eos => self.finish(StopReason::Eos, Some(token)),
            Verdict::MaxTokens => {
                self.ids.push(token);
                self.finish(StopReason::MaxTokens, None)
            }
            Verdict::Continue => {
                self.ids.push(token);
                self.last = token;
                return Started::Running(self);
            }
        };
        Started::Done(tag, out)
    }
}

/// The result of prefilling a row: it runs on, or it already ended (first token).
pub enum Started<T> {
    /// The row joins the running set.
    Running(Row<T>),
    /// The row ended at its first token.
    Done(T, RowOutput),
}

/// A row whose prefill failed: its tag (`job`) and why.
pub struct StartError<T> {
    /// The caller's tag.
    pub job: T,
    /// The failure.
    pub error: Error,
}

/// What the shared buffers `kv` hold now, as admission and the draft bound count it (empty
/// when no row holds a slot: the buffers then go with the last row).
pub(crate) fn shared_buffers(kv: &Mutex<SharedKv>) -> SharedBuffers {
    // A step that panicked holding the lock left the buffers as they were: count them.
    let kv = kv.lock().unwrap_or_else(|e| e.into_inner());
    match kv.slots() {
        0 => SharedBuffers::default(),
        _ if kv.rows() == 0 => SharedBuffers::default(),
        slots => SharedBuffers {
            slots,
            slot_bytes: (kv.nbytes() / slots) as u64,
        },
    }
}

/// Prefills rows alone and steps the running set together, on one model.
pub struct Decoder<'a> {
    model: &'a Model,
    stop_ids: &'a [u32],
    registry: Option<Rc<AdapterRegistry>>,
    bytes_per_token: Cell<u64>,
    rows_per_forward: usize,
    rows_per_product: usize,
    product_kernel: bool,
    stacked_attention: bool,
    shared_kv: Option<Arc<Mutex<SharedKv>>>,
    speculate: Option<SpeculateOptions>,
    profile: Cell<DecodeProfile>,
}

/// Rows per quantized product of a decode forward on a GPU (see [`Decoder::rows_per_product`]):
/// MLX CUDA runs its row-wise `qmv` below 8 rows (`M * B < 8`), Metal below its
/// `get_qmv_batch_limit` (`mlx/backend/metal/quantized.cpp`), which is 6 on its lowest tier (Apple
/// GPU generations 13 / 14, not an Ultra, a product with an input or output dimension over 4096:
/// the e4b's MLP and output head). Metal's limit depends on the chip and the shape, and MLX
/// exposes no query for it, so the smallest tier's bound holds everywhere. Unverified here (no
/// Mac): whether Metal's multi-row `qmv` variants give each row its one-row bits; the start-up
/// batching self-check and `memexec bench`'s identical column are what tell on a Mac.
pub const ROWS_PER_PRODUCT: usize = if cfg!(target_os = "macos") { 5 } else { 7 };

impl<'a> Decoder<'a> {
    /// A decoder stopping at `stop_ids`, base model only.
    pub fn new(model: &'a Model, stop_ids: &'a [u32]) -> Decoder<'a> {
        Decoder {
            model,
            stop_ids,
            registry: None,
            bytes_per_token: Cell::new(0),
            rows_per_forward: limit_from_env("MEMEXEC_ROWS_PER_FORWARD").unwrap_or(usize::MAX),
            rows_per_product: rows_per_product_default(model),
            product_kernel: product_kernel_default(model),
            stacked_attention: stacked_attention_default(model),
            shared_kv: shared_kv_default(model).then(SharedKv::new),
            speculate: None,
            profile: Cell::new(DecodeProfile::default()),
        }
    }

    /// Whether running rows keep their keys in buffers shared by the batch, written by one
    /// node per layer and tensor per step (see [`crate::model::batch_kv`]) instead of one per
    /// row. Both layouts give the same bits. Default: on MLX CUDA (H200, session 17: an
    /// eight-row e4b step 2300 -> 1964 graph nodes, EXTRACT at width 8 ~7% faster on medians
    /// of 6-7 runs), off on the CPU and on Metal, where it is not measured;
    /// `MEMEXEC_BATCH_KV=shared` / `per-row` overrides. Every slot of a full layer holds as
    /// many positions as the longest row, so the KV budget then counts each running row at
    /// the largest row's estimate ([`scheduler::admit_shared`]).
    pub fn shared_kv(&self) -> bool {
        self.shared_kv.is_some()
    }

    /// Rows holding a slot of the shared KV now (`None` when [`Decoder::shared_kv`] is off).
    pub fn shared_kv_rows(&self) -> Option<usize> {
        self.shared_kv
            .as_ref()
            // A step that panicked holding the lock left the slot table as it was: count it.
            .map(|kv| kv.lock().unwrap_or_else(|e| e.into_inner()).rows())
    }

    /// What the shared KV's buffers hold now, as admission counts it (empty when
    /// [`Decoder::shared_kv`] is off).
    pub fn shared_buffers(&self) -> SharedBuffers {
        self.shared_kv
            .as_ref()
            .map_or_else(SharedBuffers::default, |kv| shared_buffers(kv))
    }

    /// Sets [`Decoder::shared_kv`] (before any row steps: rows that joined shared buffers
    /// keep them). A decoder that speculates keeps the shared KV whatever `on` says.
    pub fn with_shared_kv(mut self, on: bool) -> Decoder<'a> {
        self.shared_kv = (on || self.speculate.is_some()).then(SharedKv::new);
        self
    }

    /// Verifies drafts for a row that runs alone (`spec`'s drafts, draft count and schedule;
    /// `None`: never). Why alone: a verification step waits for the previous step's token
    /// (its drafts follow from it) and multiplies the rows of the step it joins, where a row
    /// running with others already shares its step's host cost. A lone row's steps are
    /// exactly [`super::speculative::greedy_speculative`]'s: verification steps where the text
    /// drafts, pipelined plain steps where it does not or where the schedule pauses. The
    /// tokens are the serial ones either way. [`Drafts::Continuation`] drafts the same
    /// continuation for every row (tests and benchmarks of one row). Verification steps
    /// write draft rows into the shared KV, so speculation turns [`Decoder::shared_kv`] on;
    /// each takes a slot as large as its row's, within [`SpeculateOptions::kv_budget`].
    /// Set before any row starts.
    pub fn with_speculation(mut self, spec: Option<SpeculateOptions>) -> Decoder<'a> {
        if spec.is_some() && self.shared_kv.is_none() {
            self.shared_kv = Some(SharedKv::new());
        }
        self.speculate = spec;
        self
    }

    /// The speculation this decoder runs lone rows with, if any.
    pub fn speculation(&self) -> Option<&SpeculateOptions> {
        self.speculate.as_ref()
    }

    /// At most this many rows go through one decode forward; a larger running set is stepped
    /// as several forwards (all queued before any token is read). Default: no limit (one
    /// forward per step, every weight read once for all rows); `MEMEXEC_ROWS_PER_FORWARD`
    /// sets it (0 = no limit), to compare against [`Decoder::rows_per_product`].
    pub fn rows_per_forward(&self) -> usize {
        self.rows_per_forward
    }

    /// Sets [`Decoder::rows_per_forward`] (0 = no limit).
    pub fn with_rows_per_forward(mut self, rows: usize) -> Decoder<'a> {
        self.rows_per_forward = if rows == 0 { usize::MAX } else { rows };
        self
    }

    /// At most this many rows per MLX quantized product in a decode forward (more run as
    /// row chunks, see [`ForwardCtx::product_rows`]; products the row-exact kernel takes,
    /// [`Decoder::product_kernel`], are not cut). Why: a row's logits must not depend on how
    /// many rows share its forward, and MLX's quantized matmul picks its GPU kernel by row
    /// count (CUDA: the row-wise `qmv` kernel, the serial path's, while rows < 8; a tiled
    /// `qmm` kernel, which rounds differently, from 8 rows on; `gather_qmm` switches the same
    /// way, see scripts/gpu/row_kernels.py; Metal: from as few as 6 rows, see
    /// [`ROWS_PER_PRODUCT`]). Everything else in a forward is row-wise at any
    /// count, so only the products are cut. Default [`ROWS_PER_PRODUCT`] on a GPU, no limit
    /// on the CPU; `MEMEXEC_ROWS_PER_PRODUCT` overrides it (0 = no limit).
    pub fn rows_per_product(&self) -> usize {
        self.rows_per_product
    }

    /// Sets [`Decoder::rows_per_product`] (0 = no limit).
    pub fn with_rows_per_product(mut self, rows: usize) -> Decoder<'a> {
        self.rows_per_product = if rows == 0 { usize::MAX } else { rows };
        self
    }

    /// Whether one-position products of two or more rows run as one node of memexec's
    /// row-exact CUDA kernel instead of MLX's product in chunks of at most
    /// [`Decoder::rows_per_product`] rows (see [`ForwardCtx::product_kernel`]). Default: on a GPU where
    /// [`crate::model::quantized_rows::available`] (the kernel runs and matches MLX's one-row
    /// product at start-up; `MEMEXEC_PRODUCT_KERNEL=0` turns it off), never on the CPU.
    pub fn product_kernel(&self) -> bool {
        self.product_kernel
    }

    /// Whether rows holding the same number of keys attend in one op (see
    /// [`ForwardCtx::stacked_attention`]). Default: on the CPU only, where it is exact;
    /// `MEMEXEC_STACKED_ATTENTION=1` / `0` overrides it (e.g. to try a Metal GPU: the start-up
    /// self-check and `memexec bench`'s identical-to-serial column tell whether it is exact).
    pub fn stacked_attention(&self) -> bool {
        self.stacked_attention
    }

    /// Sets [`Decoder::stacked_attention`].
    pub fn with_stacked_attention(mut self, on: bool) -> Decoder<'a> {
        self.stacked_attention = on;
        self
    }

    /// The context of a decode forward over rows without adapters (this decoder's row limit
    /// per product and attention form): what `memexec graph` counts.
    pub fn base_ctx(&self) -> ForwardCtx {
        let product_rows = (self.rows_per_product != usize::MAX).then_some(self.rows_per_product);
        ForwardCtx::default()
            .with_product_rows(product_rows)
            .with_product_kernel(self.product_kernel)
            .with_stacked_attention(self.stacked_attention)
    }

    /// Rows may name adapters of `registry`.
    pub fn with_registry(mut self, registry: Rc<AdapterRegistry>) -> Decoder<'a> {
        self.registry = Some(registry);
        self
    }

    /// [`Decoder::base_ctx`] with each row's adapters.
    fn ctx(&self, stacks: Vec<AdapterStack>) -> Result<ForwardCtx> {
        let base = self.base_ctx();
        match &self.registry {
            Some(r) => Ok(ForwardCtx {
                adapters: Activation::per_row(r.clone(), stacks)?,
                ..base
            }),
            None if stacks.iter().all(AdapterStack::is_empty) => Ok(base),
            None => Err(Error::InvalidArgument(
                "a row asks for adapters but no adapter registry is mounted".into(),
            )),
        }
    }

    /// Host time of the decode steps so far (a step of several forwards counts once; `wait`
    /// is the time blocked reading a step's tokens).
    pub fn profile(&self) -> DecodeProfile {
        self.profile.get()
    }

    fn add_profile(&self, more: DecodeProfile) {
        let mut p = self.profile.get();
        p += more;
        self.profile.set(p);
    }

    /// KV bytes per cached position, learned from the rows prefilled so far (0 = not yet).
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token.get()
    }

    /// Prefills `req` alone (exactly the serial prefill) and applies the serial rule to its
    /// first token. On error the tag comes back with it.
    pub fn start<T>(
        &self,
        tag: T,
        req: RowRequest,
    ) -> std::result::Result<Started<T>, StartError<T>> {
        let mut row = Row {
            tag,
            cache: self.model.new_cache(),
            last: 0,
            pending: None,
            ids: Vec::new(),
            max_tokens: req.max_tokens,
            adapters: req.adapters.clone(),
            prompt_tokens: req.prompt.len(),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            drafts: self.speculate.as_ref().map(|s| RowDrafts {
                prompt: req.prompt.clone(),
                schedule: DraftSchedule::new(s.max_drafts.min(MAX_DRAFTS), s.adaptive),
                stats: SpeculationStats::default(),
                pending_paused: false,
            }),
        };
        if req.max_tokens == 0 {
            let (tag, out) = row.finish(StopReason::MaxTokens, None);
            return Ok(Started::Done(tag, out));
        }
        let started = Instant::now();
        let first = match self
            .ctx(vec![req.adapters])
            .and_then(|ctx| prefill(self.model, &req.prompt, &mut row.cache, PREFILL_STEP, &ctx))
        {
            Ok(first) => first,
            Err(error) => {
                return Err(StartError {
                    job: row.tag,
                    error,
                })
            }
        };
        row.prefill_time = started.elapsed();
        if let Some(per) = (row.cache.nbytes() as u64).checked_div(row.cache.offset() as u64) {
            self.bytes_per_token
                .set(self.bytes_per_token.get().max(per));
        }
        Ok(row.take(first, self.stop_ids))
    }

    /// Builds and queues one decode forward over the rows marked in `stepping`, in groups of
    /// at most [`Decoder::rows_per_forward`] rows; returns their picks (lazy, in row order).
    fn queue_step<T>(&self, rows: &mut [Row<T>], stepping: &[bool]) -> Result<Array> {
        let started = Instant::now();
        let mut members: Vec<&mut Row<T>> = rows
            .iter_mut()
            .zip(stepping)
            .filter(|(_, &s)| s)
            .map(|(r, _)| r)
            .collect();
        let mut parts = Vec::new();
        for group in members.chunks_mut(self.rows_per_forward.max(1)) {
            let stacks = group.iter().map(|r| r.adapters.clone()).collect();
            let tokens = match whole_picks(group) {
                // The steady state: the rows of the previous step, in its order. Its picks
                // are this step's tokens as they are: no slices and no concatenation (on MLX
                // CUDA one copy kernel per row, each reading a page the host is reading too).
                Some(picks) => picks.reshape(&[group.len() as i32, 1])?,
                None => {
                    let inputs = group
                        .iter()
                        .map(|r| match &r.pending {
                            Some(p) => p.input(),
                            // uint32 like the picks, so the concatenation keeps one dtype.
                            None => Ok(Array::from_slice(&[r.last], &[1, 1])),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    match <[Array; 1]>::try_from(inputs) {
                        Ok([one]) => one,
                        Err(inputs) => concatenate(&inputs, 0)?,
                    }
                }
            };
            let ctx = self.ctx(stacks)?;
            if let Some(kv) = &self.shared_kv {
                for row in group.iter_mut() {
                    if row.cache.slot().is_none() {
                        batch_kv::join(kv, &mut row.cache)?;
                    }
                }
            }
            let mut caches: Vec<&mut RowCache> = group.iter_mut().map(|r| &mut r.cache).collect();
            let picks = step_picks(self.model, &tokens, &mut caches, &ctx)?;
            if picks.size() != caches.len() {
                return Err(Error::Internal(format!(
                    "a decode step over {} rows returned {} tokens",
                    caches.len(),
                    picks.size()
                )));
            }
            parts.push(picks);
        }
        let picks = if parts.len() == 1 {
            parts.swap_remove(0)
        } else {
            concatenate(&parts, 0)?
        };
        let built = Instant::now();
        async_eval([&picks])?;
        self.add_profile(DecodeProfile {
            steps: 1,
            build: built - started,
            queue: built.elapsed(),
            wait: Duration::ZERO,
        });
        Ok(picks)
    }

    /// One decode step over the running rows, pipelined: queues the next step (on the pending
    /// tokens, still lazy), then reads the pending tokens and applies the serial rule to them.
    /// In a speculating decoder a row running alone may instead take a verification step
    /// (see [`Decoder::with_speculation`]).
    /// Rows that end leave `rows` (dropping their caches) and are returned. On error `rows`
    /// is left as it was.
    pub fn step<T>(&self, rows: &mut Vec<Row<T>>) -> Result<Vec<(T, RowOutput)>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if let (Some(spec), 1) = (&self.speculate, rows.len()) {
            if let Some(done) = self.step_alone(spec, rows)? {
                return Ok(done);
            }
        }
        let started = Instant::now();
        // Every row steps but those whose pending token is surely their last.
        let stepping: Vec<bool> = rows
            .iter()
            .map(|r| r.pending.is_none() || r.ids.len() + 1 < r.max_tokens)
            .collect();
        let queued = if stepping.contains(&true) {
            let picks = self.queue_step(rows, &stepping)?;
            for (row, _) in rows.iter_mut().zip(&stepping).filter(|(_, &s)| s) {
                row.count_plain_step();
            }
            Some(Rc::new(Picks {
                array: picks,
                host: OnceCell::new(),
            }))
        } else {
            None
        };
        // The previous step's tokens (waits for that step only: this one stays queued).
        let reading = Instant::now();
        let taken: Vec<Option<u32>> = rows
            .iter()
            .map(|r| r.pending.as_ref().map(Pending::read).transpose())
            .collect::<Result<_>>()?;
        if taken.iter().any(Option::is_some) {
            self.add_profile(DecodeProfile {
                wait: reading.elapsed(),
                ..DecodeProfile::default()
            });
        }
        let took = started.elapsed();
        let mut done = Vec::new();
        let mut keep = Vec::with_capacity(rows.len());
        let mut index = 0;
        for ((mut row, token), steps) in rows.drain(..).zip(taken).zip(stepping) {
            row.decode_time += took;
            let next = match (&queued, steps) {
                (Some(picks), true) => {
                    index += 1;
                    Some(Pending {
                        picks: picks.clone(),
                        index: index - 1,
                    })
                }
                _ => None,
            };
            row.pending = None;
            let row = match token {
                Some(token) => match row.counted_read().take(token, self.stop_ids) {
                    Started::Running(row) => row,
                    Started::Done(tag, out) => {
                        done.push((tag, out));
                        continue;
                    }
                },
                None => row,
            };
            // A row that did not step keeps no pending token: it steps on `last` next time.
            keep.push(Row {
                pending: next,
                ..row
            });
        }
        *rows = keep;
        Ok(done)
    }

    /// The drafts for `row`'s next positions, at most `max` (see [`Decoder::with_speculation`]).
    fn draft<T>(spec: &SpeculateOptions, row: &Row<T>, max: usize) -> Vec<u32> {
        let Some(d) = &row.drafts else {
            return Vec::new();
        };
        let text: Vec<u32> = d.prompt.iter().chain(&row.ids).copied().collect();
        spec.drafts.next(&text, row.ids.len(), max)
    }

    /// The step of a row running alone in a speculating decoder, or `None` where it takes a
    /// plain pipelined step ([`Decoder::step`]'s). A row whose pending step was queued plain
    /// keeps the pipeline while the text known so far drafts nothing (or the schedule
    /// pauses): the next step is queued before that token is read, as
    /// [`super::speculative::greedy_speculative`] does. Otherwise the pending token is read,
    /// and where the text then drafts, one verification step (the row fed its last token and
    /// one draft row per draft) runs and is read at once: the row takes the picks of the
    /// rows whose drafts were right and the pick after them, each under the serial rule.
    fn step_alone<T>(
        &self,
        spec: &SpeculateOptions,
        rows: &mut Vec<Row<T>>,
    ) -> Result<Option<Vec<(T, RowOutput)>>> {
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let paused = row.drafts.as_ref().is_none_or(|d| d.schedule.paused());
        if row.pending.is_some() && (paused || Self::draft(spec, row, 1).is_empty()) {
            return Ok(None);
        }
        let started = Instant::now();
        let mut row = match &row.pending {
            Some(pending) => {
                let token = pending.read()?;
                self.add_profile(DecodeProfile {
                    wait: started.elapsed(),
                    ..DecodeProfile::default()
                });
                let Some(mut row) = rows.pop() else {
                    return Ok(None);
                };
                row.pending = None;
                row.decode_time += started.elapsed();
                match row.counted_read().take(token, self.stop_ids) {
                    Started::Running(row) => row,
                    Started::Done(tag, out) => return Ok(Some(vec![(tag, out)])),
                }
            }
            None => match rows.pop() {
                Some(row) => row,
                None => return Ok(None),
            },
        };
        let kv = self
            .shared_kv
            .as_ref()
            .ok_or_else(|| Error::Internal("speculation without a shared KV".into()))?;
        if row.cache.slot().is_none() {
            // Joined now rather than by the step below: the draft bound counts its slot.
            if let Err(e) = batch_kv::join(kv, &mut row.cache) {
                rows.push(row);
                return Err(e);
            }
        }
        let allowed = row.drafts.as_ref().map_or(0, |d| d.schedule.allowed());
        // Draft rows take slots of the shared buffers: no more than the KV budget holds.
        let need = self.kv_need(row.prompt_tokens, row.max_tokens);
        let allowed = spec.drafts_within(kv, need, allowed);
        // A step yields at most 1 + drafts tokens: drafts past the budget are never used.
        let budget = row
            .max_tokens
            .saturating_sub(row.ids.len() + 1)
            .min(allowed);
        let drafted = Self::draft(spec, &row, budget);
        if drafted.is_empty() {
            rows.push(row);
            return Ok(None);
        }
        let verified = Instant::now();
        let (picks, accepted) = match self.verify(&mut row, &drafted) {
            Ok(v) => v,
            Err(e) => {
                rows.push(row);
                return Err(e);
            }
        };
        row.decode_time += verified.elapsed();
        if let Some(d) = &mut row.drafts {
            d.stats.verified(drafted.len(), accepted);
            d.schedule.verified(drafted.len(), accepted);
        }
        for &token in picks.iter().take(accepted + 1) {
            row = match row.take(token, self.stop_ids) {
                Started::Running(row) => row,
                Started::Done(tag, out) => return Ok(Some(vec![(tag, out)])),
            };
        }
        rows.push(row);
        Ok(Some(Vec::new()))
    }

    /// Runs one verification step for `row` (no token pending) and `drafted` and reads it
    /// ([`verify_step`]): the picks, one per row, and how many drafts were right.
    fn verify<T>(&self, row: &mut Row<T>, drafted: &[u32]) -> Result<(Vec<u32>, usize)> {
        let kv = self
            .shared_kv
            .as_ref()
            .ok_or_else(|| Error::Internal("speculation without a shared KV".into()))?;
        let ctx = self.ctx(vec![row.adapters.clone(); drafted.len() + 1])?;
        let mut profile = DecodeProfile::default();
        let verified = verify_step(
            self.model,
            &mut row.cache,
            kv,
            row.last,
            drafted,
            &ctx,
            &mut profile,
        );
        self.add_profile(profile);
        verified
    }

    /// How many rows at the front of `waiting` to start now under `limits`, given each running
    /// and waiting row's [`Decoder::kv_need`], by the rule of this decoder's KV layout.
    ///
    /// Under a KV budget, a decoder that has not yet measured its KV bytes per position (no
    /// row prefilled: every need reads 0) admits one row and no more: that row's prefill
    /// measures them, so the rows after it are counted against the budget instead of a full
    /// width of them starting unmeasured.
    pub fn admit(&self, limits: Limits, running: &[u64], waiting: &[u64]) -> usize {
        let n = if self.shared_kv() {
            scheduler::admit_shared(limits, running, waiting, self.shared_buffers())
        } else {
            scheduler::admit(limits, running, waiting)
        };
        if limits.kv_budget.is_some() && self.bytes_per_token() == 0 {
            n.min(usize::from(running.is_empty()))
        } else {
            n
        }
    }

    /// The estimated final KV bytes of a row of `prompt_tokens` that may generate
    /// `max_tokens`, at the bytes per position measured so far (0 before any prefill).
    pub fn kv_need(&self, prompt_tokens: usize, max_tokens: usize) -> u64 {
        scheduler::row_kv_bytes(prompt_tokens, max_tokens, self.bytes_per_token())
    }

    /// [`Decoder::admit`] over `running` and the waiting rows' `(prompt tokens, max tokens)`,
    /// front first: how many of those rows to start now.
    pub fn admissible<T>(
        &self,
        limits: Limits,
        running: &[Row<T>],
        waiting: impl IntoIterator<Item = (usize, usize)>,
    ) -> usize {
        let running_need: Vec<u64> = running
            .iter()
            .map(|r| self.kv_need(r.prompt_tokens, r.max_tokens))
            .collect();
        let waiting_need: Vec<u64> = waiting
            .into_iter()
            .map(|(prompt_tokens, max_tokens)| self.kv_need(prompt_tokens, max_tokens))
            .collect();
        self.admit(limits, &running_need, &waiting_need)
    }

    /// Runs `pass` (one admission: [`Decoder::admit`] over the waiting rows, starting those
    /// it admits), and once more where that pass's prefills measured the first KV bytes per
    /// position: the rows the budget then holds start before the next step, as they would
    /// without a budget, instead of one step later.
    pub fn admission_passes(&self, mut pass: impl FnMut()) {
        let measured = self.bytes_per_token() > 0;
        pass();
        if !measured && self.bytes_per_token() > 0 {
            pass();
        }
    }

    /// Runs `reqs` with continuous batching under `limits`; outputs in input order.
    pub fn run_rows(&self, reqs: Vec<RowRequest>, limits: Limits) -> Vec<Result<RowOutput>> {
        let mut out: Vec<Option<Result<RowOutput>>> = (0..reqs.len()).map(|_| None).collect();
        let mut waiting: VecDeque<(usize, RowRequest)> = reqs.into_iter().enumerate().collect();
        let mut running: Vec<Row<usize>> = Vec::new();
        loop {
            self.admission_passes(|| {
                let waiting_rows = waiting.iter().map(|(_, r)| (r.prompt.len(), r.max_tokens));
                for _ in 0..self.admissible(limits, &running, waiting_rows) {
                    let Some((i, req)) = waiting.pop_front() else {
                        break;
                    };
                    match self.start(i, req) {
                        Ok(Started::Running(row)) => running.push(row),
                        Ok(Started::Done(i, o)) => out[i] = Some(Ok(o)),
                        Err(StartError { job: i, error }) => out[i] = Some(Err(error)),
                    }
                }
            });
            if running.is_empty() {
                if waiting.is_empty() {
                    break;
                }
                continue;
            }
            match self.step(&mut running) {
                Ok(done) => {
                    for (i, o) in done {
                        out[i] = Some(Ok(o));
                    }
                }
                Err(e) => {
                    for row in running.drain(..) {
                        out[row.tag] = Some(Err(Error::Internal(format!("decode step: {e}"))));
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::Internal("a row was never run".into()))))
            .collect()
    }
}

/// A row limit from the environment: `Some(usize::MAX)` for `0`, `None` when unset or not a
/// number.
fn limit_from_env(name: &str) -> Option<usize> {
    match std::env::var(name).ok()?.trim().parse::<usize>().ok()? {
        0 => Some(usize::MAX),
        n => Some(n),
    }
}

/// [`ROWS_PER_PRODUCT`] on a GPU; no limit on the CPU, whose kernels are row-count
/// independent (the packed kernel computes each row alone; dense products are padded to one
/// GEMM size, see `model::linear::DENSE_STEP_ROWS`).
fn rows_per_product_default(model: &Model) -> usize {
    match limit_from_env("MEMEXEC_ROWS_PER_PRODUCT") {
        Some(n) => n,
        None if model.info().on_cpu => usize::MAX,
        None => ROWS_PER_PRODUCT,
    }
}

/// On a GPU whose MLX runs the row-exact product kernel (asked once per thread); never on
/// the CPU, whose products need no chunks.
fn product_kernel_default(model: &Model) -> bool {
    !model.info().on_cpu && crate::model::quantized_rows::available()
}

/// On MLX CUDA (a GPU that is not Metal) unless `MEMEXEC_BATCH_KV` says otherwise.
fn shared_kv_default(model: &Model) -> bool {
    batch_kv::shared_from_env().unwrap_or(!model.info().on_cpu && !cfg!(target_os = "macos"))
}

/// On the CPU unless `MEMEXEC_STACKED_ATTENTION` says otherwise (`1` / `0`).
fn stacked_attention_default(model: &Model) -> bool {
    match std::env::var("MEMEXEC_STACKED_ATTENTION")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("1") => true,
        Some("0") => false,
        _ => model.info().on_cpu,
    }
}

/// The batched engine backend over a [`ModelBackend`].
pub struct Batched {
    inner: ModelBackend,
    limits: Limits,
}

impl Batched {
    /// Batches up to `width` rows; `kv_budget` bounds the running rows' estimated KV bytes.
    pub fn new(inner: ModelBackend, width: usize, kv_budget: Option<u64>) -> Batched {
        Batched {
            inner,
            limits: Limits { width, kv_budget },
        }
    }

    /// Starts the waiting jobs `decoder` admits now (see [`Decoder::admission_passes`]).
    fn admit_waiting(
        &self,
        decoder: &Decoder<'_>,
        waiting: &mut VecDeque<Waiting>,
        running: &mut Vec<Row<Job>>,
    ) {
        decoder.admission_passes(|| {
            // The jobs that could join now are rendered (once each), so the budget counts
            // their prompts; the ones behind them cannot be admitted before them anyway.
            let room = self.limits.width.max(1).saturating_sub(running.len());
            for w in waiting.iter_mut().take(room) {
                w.render(&self.inner);
            }
            let waiting_rows = waiting
                .iter()
                .map(|w| (w.prompt_tokens(), w.job.max_tokens));
            for _ in 0..decoder.admissible(self.limits, running, waiting_rows) {
                let Some(Waiting { job, prompt }) = waiting.pop_front() else {
                    break;
                };
                if let Some(e) = job.interruption() {
                    job.finish(Err(e));
                    continue;
                }
                let prompt = match prompt.unwrap_or_else(|| self.inner.prompt_for(&job)) {
                    Ok(p) => p,
                    Err(e) => {
                        job.finish(Err(e));
                        continue;
                    }
                };
                let req = RowRequest {
                    prompt,
                    max_tokens: job.max_tokens,
                    adapters: self.inner.stage_stack(&job.stage),
                };
                match decoder.start(job, req) {
                    Ok(Started::Running(row)) => running.push(row),
                    Ok(Started::Done(job, out)) => {
                        let result = self.completion(out);
                        job.finish(result);
                    }
                    Err(StartError { job, error }) => job.finish(Err(error)),
                }
            }
        });
    }

    fn completion(&self, out: RowOutput) -> Result<Completion> {
        Ok(Completion {
            text: self.inner.prompter().tokenizer().decode(&out.ids)?,
            ids: out.ids,
            prompt_tokens: out.prompt_tokens,
            stop: out.stop,
            prefill_time: out.prefill_time,
            decode_time: out.decode_time,
            speculation: out.speculation,
        })
    }
}

impl Backend for Batched {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            mode: match self.inner.speculation() {
                None => "batched".into(),
                Some(s) => format!("batched, speculative k{} (rows alone)", s.max_drafts),
            },
            ..Generate::info(&self.inner)
        }
    }

    fn run(&mut self, jobs: Vec<Job>, intake: &mut Intake<'_>) {
        let decoder = Decoder::new(self.inner.model(), self.inner.stop_ids())
            .with_registry(self.inner.adapters().clone())
            .with_speculation(self.inner.speculation().cloned());
        let mut waiting: VecDeque<Waiting> = jobs.into_iter().map(Waiting::new).collect();
        let mut running: Vec<Row<Job>> = Vec::new();
        loop {
            waiting.extend(intake.pull().into_iter().map(Waiting::new));
            // Interrupted rows leave at the step boundary; the others are untouched.
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut running)
                .into_iter()
                .partition(|r| r.tag().interruption().is_some());
            running = kept;
            for row in gone {
                let job = row.into_tag();
                let e = job.interruption().unwrap_or(Error::Cancelled);
                job.finish(Err(e));
            }
            self.admit_waiting(&decoder, &mut waiting, &mut running);
            if running.is_empty() {
                if waiting.is_empty() {
                    break;
                }
                continue;
            }
            let before = decoder.profile().steps;
            let stepped = decoder.step(&mut running);
            intake.count_batched_steps(decoder.profile().steps.saturating_sub(before) as u64);
            match stepped {
                Ok(done) => {
                    for (job, out) in done {
                        let result = self.completion(out);
                        job.finish(result);
                    }
                }
                Err(e) => {
                    for row in running.drain(..) {
                        row.into_tag()
                            .finish(Err(Error::Internal(format!("decode step: {e}"))));
                    }
                }
            }
        }
    }

    fn peak_memory(&self) -> Option<u64> {
        Generate::peak_memory(&self.inner)
    }

    fn batches_rows(&self) -> bool {
        true
    }
}

/// A job waiting for admission to a [`Batched`] engine, with its prompt once rendered.
struct Waiting {
    job: Job,
    /// The prompt ids, or why there are none (the job then fails at admission).
    prompt: Option<Result<Vec<u32>>>,
}

impl Waiting {
    fn new(job: Job) -> Waiting {
        Waiting { job, prompt: None }
    }

    /// Renders the prompt unless it was already.
    fn render(&mut self, backend: &ModelBackend) {
        if self.prompt.is_none() {
            self.prompt = Some(backend.prompt_for(&self.job));
        }
    }

    /// The prompt's length (0 while unrendered or where it failed: such a job runs no row).
    fn prompt_tokens(&self) -> usize {
        match &self.prompt {
            Some(Ok(p)) => p.len(),
            _ => 0,
        }
    }
}

/// The serial backend standing in for a batched one whose self-check failed.
struct Fallback {
    serial: Serial<ModelBackend>,
    why: String,
}

impl Backend for Fallback {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            mode: format!("serial (fallback: {})", self.why),
            ..self.serial.info()
        }
    }

    fn run(&mut self, jobs: Vec<Job>, intake: &mut Intake<'_>) {
        self.serial.run(jobs, intake)
    }

    fn peak_memory(&self) -> Option<u64> {
        self.serial.peak_memory()
    }
}

/// Mixed-length probe rows (one past the 32-token sliding window of the Gemma fixtures, one
/// that joins late because the width is exceeded) with different budgets.
fn probes(vocab: usize) -> Vec<RowRequest> {
    let span = vocab.clamp(3, 3000) as u32 - 2;
    [(5usize, 4usize), (40, 3), (12, 5), (3, 2), (70, 4)]
        .iter()
        .enumerate()
        .map(|(r, &(len, max_tokens))| {
            let ids = (0..len as u32)
                .map(|t| 2 + (t * 37 + 11 * r as u32 + 5) % span)
                .collect();
            RowRequest::new(ids, max_tokens)
        })
        .collect()
}

/// Why batched and serial disagree on the probes, or `None` when they agree token for token.
/// `spec`: the speculation the batched backend runs lone rows with (the probes' last rows run
/// alone).
pub fn self_check(
    model: &Model,
    stop_ids: &[u32],
    width: usize,
    spec: Option<&SpeculateOptions>,
) -> Option<String> {
    let reqs = probes(model.info().vocab_size);
    let limits = Limits {
        width: width.min(reqs.len() - 1).max(2),
        kv_budget: None,
    };
    let batched = Decoder::new(model, stop_ids)
        .with_speculation(spec.cloned())
        .run_rows(reqs.clone(), limits);
    for (i, (req, got)) in reqs.into_iter().zip(batched).enumerate() {
        let opts = GenerateOptions {
            max_tokens: req.max_tokens,
            stop_ids: Some(stop_ids.to_vec()),
            ..GenerateOptions::default()
        };
        let serial = match greedy(model, &req.prompt, opts) {
            Ok(g) => g.ids,
            Err(e) => return Some(format!("probe {i}: serial run failed: {e}")),
        };
        let got = match got {
            Ok(o) => o.ids,
            Err(e) => return Some(format!("probe {i}: batched run failed: {e}")),
        };
        if got != serial {
            let at = got.iter().zip(&serial).take_while(|(a, b)| a == b).count();
            return Some(format!(
                "probe {i} ({} prompt ids): batched differs from serial at token {at}",
                req.prompt.len()
            ));
        }
    }
    None
}

/// The backend for `width`: serial at width 1; batched (admitting rows within `kv_budget`
/// bytes of KV cache) when the self-check passes, else the serial path with the reason in its
/// mode.
pub fn select(inner: ModelBackend, width: usize, kv_budget: Option<u64>) -> Box<dyn Backend> {
    if width <= 1 {
        return Box::new(Serial(inner));
    }
    match self_check(inner.model(), inner.stop_ids(), width, inner.speculation()) {
        None => Box::new(Batched::new(inner, width, kv_budget)),
        Some(why) => {
            tracing::warn!("batched decoding disabled: {why}");
            Box::new(Fallback {
                serial: Serial(inner),
                why,
            })
        }
    }
}
