//! Greedy decoding with mlx-lm's `generate_step` schedule: prefill all prompt tokens but the
//! last (chunks of at most [`PREFILL_STEP`]), then one token per step starting from the last
//! prompt token. Also the building blocks the batching engine uses ([`prefill`],
//! [`decode_step`]).
use std::time::{Duration, Instant};

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use mlx_rs::transforms::async_eval;
use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};
use crate::mlx_ffi::print_graph;
use crate::model::{ForwardCtx, Model, RowCache};

/// mlx-lm's default `prefill_step_size`.
pub const PREFILL_STEP: usize = 2048;

/// Options of [`greedy`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// The most tokens to generate (the stop token, if any, is not counted or returned).
    pub max_tokens: usize,
    /// Prompt tokens per prefill forward (at most; mlx-lm's default 2048).
    pub prefill_step: usize,
    /// Tokens that end the generation; `None` = the model's eos ids.
    pub stop_ids: Option<Vec<u32>>,
    /// The LoRA adapters to run with (`None`: the base model).
    pub adapters: Option<crate::lora::Activation>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            prefill_step: PREFILL_STEP,
            stop_ids: None,
            adapters: None,
        }
    }
}

impl GenerateOptions {
    /// The ids that end the generation: `stop_ids`, else `model`'s eos ids.
    pub fn stop_ids_for(&self, model: &Model) -> Vec<u32> {
        self.stop_ids
            .clone()
            .unwrap_or_else(|| model.info().eos_token_ids.clone())
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this stop token (not included in the output).
    Eos(u32),
    /// `max_tokens` were generated.
    MaxTokens,
}

/// The result of [`greedy`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// The generated ids, without the stop token.
    pub ids: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Time to process the prompt and pick the first token.
    pub prefill_time: Duration,
    /// Time of the decode steps after the first token.
    pub decode_time: Duration,
    /// Where the decode steps' time went on the host.
    pub decode_profile: DecodeProfile,
}

impl Generation {
    /// The result of a generation asked for no tokens (`max_tokens` 0).
    pub(crate) fn nothing() -> Generation {
        Generation {
            ids: Vec::new(),
            stop: StopReason::MaxTokens,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            decode_profile: DecodeProfile::default(),
        }
    }
}

/// Host time of a generation's decode steps, split by what the host was doing: building a
/// step's graph, handing it to MLX ([`async_eval`], which on a GPU encodes every kernel), and
/// waiting for a token. A large `wait` means the device is the bottleneck. A `wait` near zero
/// does not prove the host is: MLX lets only a few committed graphs run ahead, so `queue` also
/// absorbs the time it blocks while a busy device catches up (a kernel trace tells the two
/// apart: `scripts/gpu/cupti_trace.py`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeProfile {
    /// Decode steps built.
    pub steps: usize,
    /// Building the steps' lazy graphs (model forward + greedy pick).
    pub build: Duration,
    /// `async_eval` of the steps (graph scheduling and kernel encoding).
    pub queue: Duration,
    /// Blocked reading tokens after the first (the device still running).
    pub wait: Duration,
}

impl std::ops::AddAssign for DecodeProfile {
    fn add_assign(&mut self, other: DecodeProfile) {
        self.steps += other.steps;
        self.build += other.build;
        self.queue += other.queue;
        self.wait += other.wait;
    }
}

pub(crate) fn ids_array(ids: &[u32], shape: &[i32]) -> Result<Array> {
    let v: Vec<i32> = ids
        .iter()
        .map(|&t| {
            i32::try_from(t)
                .map_err(|_| Error::InvalidArgument(format!("token id {t} out of range")))
        })
        .collect::<Result<_>>()?;
    Ok(Array::from_slice(&v, shape))
}

/// Greedy picks from `[B, vocab]` f32 logits, computed per row exactly as mlx-lm's sampler
/// does: in the model's dtype, `argmax(logits - logsumexp(logits))`, ties to the lowest id.
pub fn argmax_rows(model: &Model, logits: &Array) -> Result<Vec<u32>> {
    argmax_rows_in(logits, model.info().dtype)
}

/// [`argmax_rows`] with the dtype given (the model's activation dtype: the f32 logits are
/// cast back to it, exactly, so that the subtraction rounds as in mlx-lm).
pub fn argmax_rows_in(logits: &Array, dtype: Dtype) -> Result<Vec<u32>> {
    read_tokens(&argmax_lazy(logits, dtype)?)
}

/// The picks of [`argmax_rows_in`] as a lazy `[B]` uint32 array (nothing is evaluated), so
/// that the next step can be built on them before the host reads them.
pub fn argmax_lazy(logits: &Array, dtype: Dtype) -> Result<Array> {
    let rows = logits.dim(0);
    if rows > 1 && !crate::model::attention::per_row_ops() {
        // The same ops over all rows at once: each row is reduced alone (checked bit for bit
        // against the one-row form by the batch exactness tests and the start-up self-check).
        let l = logits.as_dtype(dtype)?;
        let logprobs = l.subtract(l.logsumexp_axis(-1, true)?)?;
        return Ok(argmax_axis(&logprobs, -1, false)?);
    }
    let mut picks = Vec::with_capacity(rows as usize);
    for r in 0..rows {
        let l = if rows == 1 {
            logits.clone()
        } else {
            logits.try_index(r..r + 1)?
        };
        picks.push(argmax_axis(&row_logprobs(&l, dtype)?, -1, false)?);
    }
    if picks.len() == 1 {
        if let Some(p) = picks.pop() {
            return Ok(p);
        }
    }
    Ok(concatenate(&picks, 0)?)
}

/// mlx-lm's sampler log-probabilities of one `[1, vocab]` logits row: cast to the model's
/// dtype, then `logits - logsumexp(logits)` over all axes (`logsumexp(keepdims=True)`).
fn row_logprobs(logits: &Array, dtype: Dtype) -> Result<Array> {
    let l = logits.as_dtype(dtype)?;
    Ok(l.subtract(l.logsumexp(true)?)?)
}

/// Evaluates (waits for) lazy picks and copies them to the host.
pub fn read_tokens(picks: &Array) -> Result<Vec<u32>> {
    picks
        .to_vec_exact::<u32>()
        .map_err(|e| Error::InvalidArgument(format!("argmax: {e}")))
}

/// Feeds `prompt[..n-1]` to `cache` (B = 1) in chunks of at most `step` (as mlx-lm), waiting
/// for each chunk's cache.
fn prefill_head(
    model: &Model,
    head: &[u32],
    cache: &mut RowCache,
    step: usize,
    ctx: &ForwardCtx,
) -> Result<()> {
    for chunk in head.chunks(step.max(1)) {
        let tokens = ids_array(chunk, &[1, chunk.len() as i32])?;
        // The chunk's logits are never evaluated: only the caches are needed.
        let _ = model.forward(&tokens, &mut [&mut *cache], ctx)?;
        cache.eval()?;
    }
    Ok(())
}

/// Runs a whole prompt through `cache` (B = 1): `prompt[..n-1]` in chunks of at most `step`,
/// then the last token alone (as mlx-lm). Returns the first generated token as a lazy `[1]`
/// array, already queued for evaluation ([`read_tokens`] reads it).
pub fn prefill_lazy(
    model: &Model,
    prompt: &[u32],
    cache: &mut RowCache,
    step: usize,
    ctx: &ForwardCtx,
) -> Result<Array> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::InvalidArgument("empty prompt".into()));
    };
    model.check_ids(prompt)?;
    prefill_head(model, head, cache, step, ctx)?;
    decode_step_lazy(model, &ids_array(&[last], &[1, 1])?, &mut [cache], ctx)
}

/// [`prefill_lazy`], waiting for the first token.
pub fn prefill(
    model: &Model,
    prompt: &[u32],
    cache: &mut RowCache,
    step: usize,
    ctx: &ForwardCtx,
) -> Result<u32> {
    let first = prefill_lazy(model, prompt, cache, step, ctx)?;
    read_tokens(&first)?
        .first()
        .copied()
        .ok_or_else(|| Error::InvalidArgument("no logits".into()))
}

/// One decode step on `tokens` `[B, 1]` (any integer dtype; may be lazy, e.g. the previous
/// step's picks): returns each row's next greedy token as a lazy `[B]` uint32 array, queued
/// for evaluation. The caches' new keys / values are evaluated with it (the picks depend on
/// them), as in mlx-lm, which never evaluates the caches separately while decoding.
pub fn decode_step_lazy(
    model: &Model,
    tokens: &Array,
    caches: &mut [&mut RowCache],
    ctx: &ForwardCtx,
) -> Result<Array> {
    let picks = step_picks(model, tokens, caches, ctx)?;
    async_eval([&picks])?;
    Ok(picks)
}

/// [`decode_step_lazy`] without queueing: the lazy `[B]` picks of one decode forward.
pub fn step_picks(
    model: &Model,
    tokens: &Array,
    caches: &mut [&mut RowCache],
    ctx: &ForwardCtx,
) -> Result<Array> {
    // The tokens are picks of this model or prompt ids checked by `prefill_lazy`.
    let logits = model.forward_own_tokens(tokens, caches, ctx)?;
    argmax_lazy(&logits, model.info().dtype)
}

/// The graph of one decode step over `rows` sequences that have each seen `prompt`, as MLX's
/// `print_graph` text ([`crate::mlx_ffi::print_graph`]; [`crate::mlx_ffi::GraphCensus::from_text`] counts
/// it): every node MLX will run for the step, nothing of the prefill (the caches are evaluated
/// first). On a GPU a decode step costs host time per node, so the node count is a noise-free
/// proxy for its speed. With `shared_kv` the rows hold slots of one shared batch KV
/// ([`crate::model::batch_kv`]), as the batched decoder's do where it defaults to it.
pub fn decode_step_graph(
    model: &Model,
    prompt: &[u32],
    rows: usize,
    ctx: &ForwardCtx,
    shared_kv: bool,
) -> Result<String> {
    if rows == 0 {
        return Err(Error::InvalidArgument("rows must be at least 1".into()));
    }
    let mut caches: Vec<RowCache> = (0..rows).map(|_| model.new_cache()).collect();
    let mut firsts = Vec::with_capacity(rows);
    for cache in caches.iter_mut() {
        firsts.push(prefill(model, prompt, cache, PREFILL_STEP, ctx)?);
        cache.eval()?;
    }
    if shared_kv {
        // The steady state of a shared batch KV: rows joined (and the join evaluated) before
        // the step whose graph is counted.
        let kv = crate::model::batch_kv::SharedKv::new();
        for cache in caches.iter_mut() {
            crate::model::batch_kv::join(&kv, cache)?;
        }
        crate::model::batch_kv::eval(&kv)?;
    }
    let tokens = ids_array(&firsts, &[rows as i32, 1])?;
    tokens.eval()?;
    let mut refs: Vec<&mut RowCache> = caches.iter_mut().collect();
    let picks = step_picks(model, &tokens, &mut refs, ctx)?;
    let text = print_graph(&[&picks])?;
    picks.eval()?;
    Ok(text)
}

/// One step of [`greedy_logprobs`]: the greedy id and the log-probabilities it was picked
/// from (`logits - logsumexp(logits)` in the model's dtype, as f32, whole vocabulary).
pub struct StepLogprobs {
    /// The greedy pick.
    pub id: u32,
    /// The step's log-probabilities.
    pub logprobs: Vec<f32>,
}

/// Greedy generation that also returns each step's log-probabilities, step by step (not
/// pipelined: every step is read before the next is built), for comparing the numbers of two
/// implementations (`memexec generate --logprobs-out`). Same prefill schedule and ops as
/// [`greedy`]; `max_tokens` steps, no stop ids.
pub fn greedy_logprobs(
    model: &Model,
    prompt: &[u32],
    max_tokens: usize,
    ctx: &ForwardCtx,
) -> Result<Vec<StepLogprobs>> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::InvalidArgument("empty prompt".into()));
    };
    model.check_ids(prompt)?;
    let mut cache = model.new_cache();
    prefill_head(model, head, &mut cache, PREFILL_STEP, ctx)?;
    let dtype = model.info().dtype;
    let mut token = last;
    let mut steps = Vec::with_capacity(max_tokens);
    for _ in 0..max_tokens {
        let logits = model.forward(&ids_array(&[token], &[1, 1])?, &mut [&mut cache], ctx)?;
        let logprobs = row_logprobs(&logits, dtype)?;
        let id = read_tokens(&argmax_axis(&logprobs, -1, false)?)?
            .first()
            .copied()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))?;
        let logprobs = logprobs
            .as_dtype(Dtype::Float32)?
            .to_vec_exact::<f32>()
            .map_err(|e| Error::InvalidArgument(format!("logprobs: {e}")))?;
        cache.eval()?;
        steps.push(StepLogprobs { id, logprobs });
        token = id;
    }
    Ok(steps)
}

/// One batched decode step: feeds `last[i]` to row `i` (each with its own cache) and returns
/// each row's next greedy token.
pub fn decode_step(
    model: &Model,
    last: &[u32],
    caches: &mut [&mut RowCache],
    ctx: &ForwardCtx,
) -> Result<Vec<u32>> {
    model.check_ids(last)?;
    let tokens = ids_array(last, &[last.len() as i32, 1])?;
    read_tokens(&decode_step_lazy(model, &tokens, caches, ctx)?)
}

/// Greedy generation for one prompt (serial, B = 1).
///
/// Pipelined like mlx-lm's `generate_step`: step t+1 is built on step t's still-lazy token and
/// queued before the host reads token t, so the device never waits for the host. The numbers
/// are those of the unpipelined loop (same graphs; only the moment of reading changes); when
/// the read token ends the generation, the one step queued past it is dropped with the cache.
pub fn greedy(model: &Model, prompt: &[u32], opts: GenerateOptions) -> Result<Generation> {
    greedy_until(model, prompt, opts, || Ok(()))
}

/// [`greedy`], asking `interrupted` before each decode step is queued: an error from it ends
/// the generation with that error (the engine's cancellation and shutdown checks).
pub fn greedy_until(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    mut interrupted: impl FnMut() -> Result<()>,
) -> Result<Generation> {
    let ctx = ForwardCtx::with_adapters(opts.adapters.clone());
    let stop_ids = opts.stop_ids_for(model);
    let mut cache = model.new_cache();
    let started = Instant::now();
    let mut ids = Vec::new();
    if opts.max_tokens == 0 {
        return Ok(Generation::nothing());
    }
    let mut pending = prefill_lazy(model, prompt, &mut cache, opts.prefill_step, &ctx)?;
    let mut prefill_time = None;
    let mut decode_start = Instant::now();
    let mut profile = DecodeProfile::default();
    let stop = loop {
        // Queue the next step before reading this token (unless this one is surely the last).
        interrupted()?;
        let next = if ids.len() + 1 < opts.max_tokens {
            let t0 = Instant::now();
            // The uint32 picks go in as they are: a cast would be one more few-byte array
            // written on the device every step.
            let tokens = pending.reshape(&[1, 1])?;
            let picks = step_picks(model, &tokens, &mut [&mut cache], &ctx)?;
            let t1 = Instant::now();
            async_eval([&picks])?;
            profile.steps += 1;
            profile.build += t1 - t0;
            profile.queue += t1.elapsed();
            Some(picks)
        } else {
            None
        };
        let t0 = Instant::now();
        let token = read_tokens(&pending)?
            .first()
            .copied()
            .ok_or_else(|| Error::InvalidArgument("no logits".into()))?;
        if prefill_time.is_some() {
            profile.wait += t0.elapsed();
        }
        if prefill_time.is_none() {
            prefill_time = Some(started.elapsed());
            decode_start = Instant::now();
        }
        if stop_ids.contains(&token) {
            break StopReason::Eos(token);
        }
        ids.push(token);
        match next {
            Some(n) if ids.len() < opts.max_tokens => pending = n,
            _ => break StopReason::MaxTokens,
        }
    };
    Ok(Generation {
        ids,
        stop,
        prefill_time: prefill_time.unwrap_or_default(),
        decode_time: decode_start.elapsed(),
        decode_profile: profile,
    })
}
