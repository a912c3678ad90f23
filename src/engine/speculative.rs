//! Greedy decoding that verifies drafted tokens: speculative decoding whose output is, token
//! for token, the serial greedy output ([`crate::generate::greedy`]).
//!
//! Why: a decode step on a GPU is bound by the host's work per graph node, not by the device
//! (H200, session 19: ~9.4 ms of host time per one-row e4b step, the device idle most of it),
//! and a step over a few rows costs little more than a step over one (4 rows: 1.7x). A
//! verification step feeds the sequence's last token AND guesses of the next ones as the rows
//! of one batched step; every row is computed exactly as a serial step at its position
//! ([`crate::model::batch_kv::update_rows`] gives a draft row the keys the serial cache would
//! hold there, and the batched forward computes each row alone), so the picks of the rows whose
//! inputs were the right guesses ARE the serial tokens, and one step yields up to `1 + drafts`
//! of them.
//!
//! Drafts come from the text itself ([`Drafts::Lookup`], "prompt lookup": the pipeline's
//! extraction and segmenting stages copy spans of their input) or from a given continuation
//! ([`Drafts::Continuation`]: tests and benchmarks with drafts of a known quality).
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlx_rs::transforms::async_eval;

use super::batched::{shared_buffers, Decoder, ROWS_PER_PRODUCT};
use super::draft_schedule::DraftSchedule;
use super::scheduler;
use crate::error::{Error, Result};
use crate::generate::{
    ids_array, prefill, read_tokens, step_picks, DecodeProfile, GenerateOptions, Generation,
    StopReason,
};
use crate::lora::Activation;
use crate::model::batch_kv::{accept, join, reserve, SharedKv};
use crate::model::{ForwardCtx, Model, RowCache};

/// The most drafts per step: one verification step is then one forward of at most
/// [`ROWS_PER_PRODUCT`] rows (on the CPU, where products take any number of rows, 7).
pub const MAX_DRAFTS: usize = if ROWS_PER_PRODUCT > 7 {
    6
} else {
    ROWS_PER_PRODUCT - 1
};

/// Where a step's drafts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drafts {
    /// The tokens that followed the latest earlier occurrence of the text's last `ngram`
    /// tokens (prompt and generated so far), trying shorter n-grams down to 2 (or `ngram` if
    /// smaller) when the longest does not occur; no draft when none does.
    Lookup {
        /// The longest n-gram matched.
        ngram: usize,
    },
    /// The next tokens of this continuation of the prompt (position `i` drafts output token
    /// `i`), whether or not the output followed it so far.
    Continuation(Vec<u32>),
}

impl Drafts {
    /// At most `max` drafts for the positions after `text` (the prompt, then the output so
    /// far, whose last `generated` tokens are the output).
    pub fn next(&self, text: &[u32], generated: usize, max: usize) -> Vec<u32> {
        match self {
            Drafts::Lookup { ngram } => lookup_draft(text, *ngram, max),
            Drafts::Continuation(c) => c.iter().skip(generated).take(max).copied().collect(),
        }
    }
}

/// Options of [`greedy_speculative`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculateOptions {
    /// Where drafts come from.
    pub drafts: Drafts,
    /// The most drafts per step (capped at [`MAX_DRAFTS`]).
    pub max_drafts: usize,
    /// Whether the draft count follows the acceptance ([`DraftSchedule`]: fewer drafts after
    /// rejections, pauses while they keep missing); false feeds up to `max_drafts` every step.
    pub adaptive: bool,
    /// The most KV bytes a verification step's draft rows may bring the shared buffers to
    /// (each takes a slot as large as its sequence's, kept until the sequence ends; see
    /// [`scheduler::drafts_within`]); `None`: no bound. Engines set their KV budget here.
    pub kv_budget: Option<u64>,
}

impl SpeculateOptions {
    /// Options drafting from `drafts`, at most `max_drafts` per step: an error unless
    /// `max_drafts` is 1 to [`MAX_DRAFTS`] and a lookup's n-gram is at least 1 (the one check
    /// behind the engine's `speculate` config and the CLI's `--speculate`).
    pub fn new(drafts: Drafts, max_drafts: usize) -> Result<SpeculateOptions> {
        if !(1..=MAX_DRAFTS).contains(&max_drafts) {
            return Err(Error::InvalidArgument(format!(
                "{max_drafts} drafts per step: 1 to {MAX_DRAFTS} on this platform"
            )));
        }
        if matches!(drafts, Drafts::Lookup { ngram: 0 }) {
            return Err(Error::InvalidArgument(
                "a lookup n-gram must be at least 1 token".into(),
            ));
        }
        Ok(SpeculateOptions {
            drafts,
            max_drafts,
            adaptive: true,
            kv_budget: None,
        })
    }

    /// These options with the draft count fixed at `max_drafts` (`adaptive` false: benchmarks
    /// of one draft count) or following the acceptance (true, the default).
    pub fn adaptive(self, adaptive: bool) -> SpeculateOptions {
        SpeculateOptions { adaptive, ..self }
    }

    /// These options with draft rows bounded by `kv_budget` (see
    /// [`SpeculateOptions::kv_budget`]).
    pub fn within(self, kv_budget: Option<u64>) -> SpeculateOptions {
        SpeculateOptions { kv_budget, ..self }
    }

    /// How many of `max` drafts a verification step over `kv` may feed for a sequence
    /// estimated at `need` KV bytes, under [`SpeculateOptions::kv_budget`].
    pub(crate) fn drafts_within(&self, kv: &Mutex<SharedKv>, need: u64, max: usize) -> usize {
        scheduler::drafts_within(self.kv_budget, need, shared_buffers(kv), max)
    }
}

impl Default for SpeculateOptions {
    fn default() -> Self {
        SpeculateOptions {
            drafts: Drafts::Lookup { ngram: 3 },
            max_drafts: 4.min(MAX_DRAFTS),
            adaptive: true,
            kv_budget: None,
        }
    }
}

/// What the drafts of a [`greedy_speculative`] run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpeculationStats {
    /// Decode steps (each verifies zero or more drafts).
    pub steps: usize,
    /// Steps that had at least one draft.
    pub steps_with_drafts: usize,
    /// Draft tokens fed.
    pub drafted: usize,
    /// Draft tokens that were the serial token (each saved a step).
    pub accepted: usize,
    /// Steps run without drafts because the adaptive schedule had paused drafting after
    /// rejected drafts (a part of `steps - steps_with_drafts`; 0 with a fixed schedule).
    pub paused_steps: usize,
}

impl SpeculationStats {
    /// Counts one verification step that fed `drafted` drafts, `accepted` of them right.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        self.steps += 1;
        self.steps_with_drafts += 1;
        self.drafted += drafted;
        self.accepted += accepted;
    }
}

impl std::ops::AddAssign for SpeculationStats {
    fn add_assign(&mut self, o: SpeculationStats) {
        self.steps += o.steps;
        self.steps_with_drafts += o.steps_with_drafts;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.paused_steps += o.paused_steps;
    }
}

/// The tokens that followed the latest earlier occurrence of `text`'s last `n`-gram (longest
/// `n` first, from `ngram` down to 2, or `ngram` if smaller), at most `max`.
pub fn lookup_draft(text: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    let shortest = ngram.clamp(1, 2);
    for n in (shortest..=ngram).rev() {
        if text.len() <= n {
            continue;
        }
        let tail = &text[text.len() - n..];
        // The latest match first: recent text predicts the next tokens best.
        if let Some(start) = (0..text.len() - n).rev().find(|&s| &text[s..s + n] == tail) {
            let from = start + n;
            return text[from..(from + max).min(text.len())].to_vec();
        }
    }
    Vec::new()
}

/// `activation` (one row's adapters) for `rows` rows of one sequence (the same stack on each).
fn widen(activation: &Option<Activation>, rows: usize) -> Result<Option<Activation>> {
    match activation {
        None => Ok(None),
        Some(a) => {
            let stack = a
                .rows()
                .first()
                .cloned()
                .ok_or_else(|| Error::InvalidArgument("adapters given for no row".into()))?;
            Activation::uniform(a.registry().clone(), stack, rows)
        }
    }
}

/// Greedy generation for one prompt that verifies drafts (see the module doc): the same ids
/// and stop as [`crate::generate::greedy`] with the same options, in fewer decode steps when
/// drafts match.
///
/// Verification steps are not pipelined (the next step's drafts depend on this step's
/// tokens): each costs its device time on top of the host's. Stretches where the text drafts
/// nothing, or where [`DraftSchedule`] pauses drafting after rejections (with
/// `spec.adaptive`), run as `greedy` does, pipelined. `memexec generate --speculate` reports both the
/// speed and [`SpeculationStats`].
pub fn greedy_speculative(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    spec: &SpeculateOptions,
) -> Result<(Generation, SpeculationStats)> {
    greedy_speculative_until(model, prompt, opts, spec, || Ok(()))
}

/// [`greedy_speculative`], asking `interrupted` before each step is queued: an error from it
/// ends the generation with that error (the engine's cancellation and shutdown checks).
pub fn greedy_speculative_until(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    spec: &SpeculateOptions,
    mut interrupted: impl FnMut() -> Result<()>,
) -> Result<(Generation, SpeculationStats)> {
    let stop_ids = opts.stop_ids_for(model);
    let max_drafts = spec.max_drafts.min(MAX_DRAFTS);
    let mut schedule = DraftSchedule::new(max_drafts, spec.adaptive);
    let base = Decoder::new(model, &stop_ids).base_ctx();
    let mut stats = SpeculationStats::default();
    let mut profile = DecodeProfile::default();
    if opts.max_tokens == 0 {
        return Ok((Generation::nothing(), stats));
    }
    // The kernels' start-up self-checks (seconds on MLX CUDA, once per thread) run here, not
    // inside the first timed step.
    crate::model::slot_attention::used_with(model.info().decode_attention, true);
    let started = Instant::now();
    let one_row = ForwardCtx {
        adapters: opts.adapters.clone(),
        ..base.clone()
    };
    let mut seq = model.new_cache();
    let mut token = prefill(model, prompt, &mut seq, opts.prefill_step, &one_row)?;
    let prefill_time = started.elapsed();
    let bytes_per_token = (seq.nbytes() as u64)
        .checked_div(seq.offset() as u64)
        .unwrap_or(0);
    let decode_start = Instant::now();
    let kv = SharedKv::new();
    // Queues one step of the sequence alone fed `tokens` ([1, 1], known or a lazy pick).
    let one_step = |seq: &mut RowCache,
                    tokens: &mlx_rs::Array,
                    profile: &mut DecodeProfile|
     -> Result<mlx_rs::Array> {
        let t0 = Instant::now();
        let picks = step_picks(model, tokens, &mut [seq], &one_row)?;
        let t1 = Instant::now();
        async_eval([&picks])?;
        profile.steps += 1;
        profile.build += t1 - t0;
        profile.queue += t1.elapsed();
        Ok(picks)
    };
    // The prompt, then the output: lookup drafts from both, the output is its tail.
    let mut text: Vec<u32> = prompt.to_vec();
    let generated = |text: &[u32]| text.len() - prompt.len();
    let draft = |text: &[u32], max: usize| spec.drafts.next(text, generated(text), max);
    let stop = 'decode: loop {
        if stop_ids.contains(&token) {
            break StopReason::Eos(token);
        }
        text.push(token);
        if generated(&text) >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        if seq.slot().is_none() {
            join(&kv, &mut seq)?;
        }
        // A step yields at most 1 + drafts tokens: drafts past the budget are never used.
        // Draft rows take slots of the shared buffers: no more than the KV budget holds.
        let need = scheduler::row_kv_bytes(prompt.len(), opts.max_tokens, bytes_per_token);
        let allowed = spec.drafts_within(&kv, need, schedule.allowed());
        let budget = (opts.max_tokens - generated(&text) - 1).min(allowed);
        let drafted = draft(&text, budget);
        if drafted.is_empty() {
            // Nothing to verify (or drafting paused): one-row steps, pipelined as in `greedy`
            // (the next step is queued, fed this one's lazy pick, before this one's token is
            // read), for as long as the text drafts nothing and the pause lasts. The step fed
            // the first token that drafts again is already queued without drafts: one drafting
            // chance lost per stretch, against a device wait saved on every step of it.
            // Whether the step queued was paused: counted when its token is read, as `steps`.
            interrupted()?;
            let mut pending_paused = schedule.paused();
            schedule.plain_step();
            let mut pending = one_step(&mut seq, &ids_array(&[token], &[1, 1])?, &mut profile)?;
            token = loop {
                let more = generated(&text) + 1 < opts.max_tokens
                    && (schedule.paused() || draft(&text, 1).is_empty());
                let next = if more {
                    interrupted()?;
                    let paused = schedule.paused();
                    schedule.plain_step();
                    let step = one_step(&mut seq, &pending.reshape(&[1, 1])?, &mut profile)?;
                    Some((step, paused))
                } else {
                    None
                };
                let t0 = Instant::now();
                let t = read_tokens(&pending)?
                    .first()
                    .copied()
                    .ok_or_else(|| Error::Internal("a decode step lost its row".into()))?;
                profile.wait += t0.elapsed();
                stats.steps += 1;
                stats.paused_steps += usize::from(pending_paused);
                let Some((next, next_paused)) = next else {
                    break t;
                };
                if stop_ids.contains(&t) {
                    break 'decode StopReason::Eos(t);
                }
                text.push(t);
                pending = next;
                pending_paused = next_paused;
            };
            continue;
        }
        interrupted()?;
        let ctx = ForwardCtx {
            adapters: widen(&opts.adapters, drafted.len() + 1)?,
            ..base.clone()
        };
        let (picks, accepted) =
            verify_step(model, &mut seq, &kv, token, &drafted, &ctx, &mut profile)?;
        stats.verified(drafted.len(), accepted);
        schedule.verified(drafted.len(), accepted);
        for &t in &picks[..accepted] {
            if stop_ids.contains(&t) {
                break 'decode StopReason::Eos(t);
            }
            text.push(t);
        }
        token = *picks
            .get(accepted)
            .ok_or_else(|| Error::Internal("a verification step lost a row".into()))?;
    };
    Ok((
        Generation {
            ids: text.split_off(prompt.len()),
            stop,
            prefill_time,
            decode_time: decode_start.elapsed(),
            decode_profile: profile,
        },
        stats,
    ))
}

/// Runs one verification step and reads it: the sequence's row fed `token`, then one draft
/// row per draft, over the shared KV `kv` (the sequence joins it first if it holds no slot),
/// with `ctx` for `1 + drafted.len()` rows. Returns the picks (one per row) and how many drafts
/// were right; the sequence's cache keeps the positions of those, and the draft rows' scratch
/// slots are freed. Host times go to `profile` as one step. Shared by [`greedy_speculative`]
/// and the batched decoder's lone row ([`super::Decoder::with_speculation`]).
pub(crate) fn verify_step(
    model: &Model,
    seq: &mut RowCache,
    kv: &Arc<Mutex<SharedKv>>,
    token: u32,
    drafted: &[u32],
    ctx: &ForwardCtx,
    profile: &mut DecodeProfile,
) -> Result<(Vec<u32>, usize)> {
    let t0 = Instant::now();
    if seq.slot().is_none() {
        join(kv, seq)?;
    }
    let mut drafts = Vec::with_capacity(drafted.len());
    for i in 0..drafted.len() {
        drafts.push(seq.draft_row(i + 1, reserve(kv)?)?);
    }
    let inputs: Vec<u32> = std::iter::once(token)
        .chain(drafted.iter().copied())
        .collect();
    model.check_ids(&inputs)?;
    let tokens = ids_array(&inputs, &[inputs.len() as i32, 1])?;
    let mut rows: Vec<&mut RowCache> = std::iter::once(&mut *seq)
        .chain(drafts.iter_mut())
        .collect();
    let picks = step_picks(model, &tokens, &mut rows, ctx)?;
    let t1 = Instant::now();
    async_eval([&picks])?;
    let t2 = Instant::now();
    let picks = read_tokens(&picks)?;
    profile.steps += 1;
    profile.build += t1 - t0;
    profile.queue += t2 - t1;
    profile.wait += t2.elapsed();
    if picks.len() != inputs.len() {
        return Err(Error::Internal(format!(
            "a verification step over {} rows returned {} tokens",
            inputs.len(),
            picks.len()
        )));
    }
    let accepted = drafted
        .iter()
        .zip(&picks)
        .take_while(|(d, p)| d == p)
        .count();
    let refs: Vec<&RowCache> = drafts.iter().collect();
    accept(seq, &refs, accepted)?;
    Ok((picks, accepted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_one_to_max_drafts_and_a_positive_ngram() {
        let lookup = |ngram| Drafts::Lookup { ngram };
        assert!(SpeculateOptions::new(lookup(3), 1).is_ok());
        assert!(SpeculateOptions::new(lookup(1), MAX_DRAFTS).is_ok());
        assert!(SpeculateOptions::new(Drafts::Continuation(vec![]), 2).is_ok());
        for (drafts, max) in [(lookup(3), 0), (lookup(3), MAX_DRAFTS + 1), (lookup(0), 2)] {
            let e = SpeculateOptions::new(drafts, max).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        }
    }

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        // "1 2 3" occurs twice before the tail; the later one continues with 7 8.
        let text = [1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3];
        assert_eq!(lookup_draft(&text, 3, 4), vec![7, 8, 9, 1]);
        assert_eq!(lookup_draft(&text, 3, 2), vec![7, 8]);
        assert_eq!(lookup_draft(&text, 3, 0), Vec::<u32>::new());
    }

    #[test]
    fn lookup_falls_back_to_shorter_ngrams_but_not_to_one_token() {
        // The 3-gram "9 2 3" never occurred; "2 3" did, followed by 4.
        assert_eq!(lookup_draft(&[1, 2, 3, 4, 9, 2, 3], 3, 2), vec![4, 9]);
        // Only the last token repeats: no draft from a 1-gram unless asked for.
        assert_eq!(lookup_draft(&[5, 1, 6, 7, 1], 3, 2), Vec::<u32>::new());
        assert_eq!(lookup_draft(&[5, 1, 6, 7, 1], 1, 2), vec![6, 7]);
        assert_eq!(lookup_draft(&[1, 2], 3, 2), Vec::<u32>::new());
    }

    #[test]
    fn a_repeating_tail_drafts_its_own_continuation() {
        assert_eq!(lookup_draft(&[4, 4, 4, 4], 2, 3), vec![4]);
        assert_eq!(lookup_draft(&[1, 2, 1, 2, 1, 2], 2, 3), vec![1, 2]);
    }
}
