//! What travels between a caller and the engine thread: jobs (one prompt each), their replies,
//! and the flags that interrupt them.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::stats::Stats;
use crate::{Error, Result};

pub use crate::prompt::LocalInput;

/// Per-call options (`opts_json` in the C API): `{max_tokens?}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallOptions {
    /// The most tokens to generate; the configured default when absent.
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-sequence id (not part of the output).
    Eos,
    /// `max_tokens` ids were generated.
    MaxTokens,
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// The decoded output, special tokens skipped.
    pub text: String,
    /// The generated ids (without the stop id).
    pub ids: Vec<u32>,
    /// How many prompt ids were prefilled.
    pub prompt_tokens: usize,
    /// Why generation stopped.
    pub stop: StopReason,
    /// Time spent prefilling the prompt.
    #[serde(skip)]
    pub prefill_time: Duration,
    /// Time spent in decode steps.
    #[serde(skip)]
    pub decode_time: Duration,
    /// What this call's drafts did, where it decoded speculatively (`speculate` in the
    /// config); counted into [`super::Stats`] with the rest of the call, before its answer is
    /// sent.
    #[serde(skip)]
    pub speculation: Option<super::speculative::SpeculationStats>,
}

/// Interrupts a request: set by a caller's cancel, or for every request when the engine closes.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag {
    cancelled: Arc<AtomicBool>,
    closing: Arc<AtomicBool>,
}

impl CancelFlag {
    pub(crate) fn new(closing: Arc<AtomicBool>) -> Self {
        CancelFlag {
            cancelled: Arc::new(AtomicBool::new(false)),
            closing,
        }
    }

    /// Asks every job carrying this flag to stop at its next step.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// The error an interrupted job ends with, or `None` while it may continue.
    pub fn interruption(&self) -> Option<Error> {
        if self.closing.load(Ordering::SeqCst) {
            Some(Error::Closed)
        } else if self.cancelled.load(Ordering::SeqCst) {
            Some(Error::Cancelled)
        } else {
            None
        }
    }
}

/// One prompt for the engine thread to answer. A backend finishes every job it is given exactly
/// once ([`Job::finish`]); dropping one unfinished tells its caller the engine failed.
#[derive(Debug)]
pub struct Job {
    /// The stage (selects default system prompt and adapter; unknown stages have neither).
    pub stage: String,
    /// The input.
    pub input: LocalInput,
    /// The most tokens to generate (already validated: >= 1, <= the cap).
    pub max_tokens: usize,
    pub(crate) cancel: CancelFlag,
    pub(crate) reply: Sender<Result<Completion>>,
    pub(crate) stats: Arc<Mutex<Stats>>,
    pub(crate) queued_at: Instant,
}

impl Job {
    /// `Some(error)` when the job should stop now (cancelled, or the engine is closing); a
    /// backend checks this between decode steps and finishes the job with that error.
    pub fn interruption(&self) -> Option<Error> {
        self.cancel.interruption()
    }

    /// How long the job waited in the queue before this call.
    pub fn queued_for(&self) -> Duration {
        self.queued_at.elapsed()
    }

    /// Delivers the result to the caller and records it in the stats.
    pub fn finish(self, result: Result<Completion>) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.record(&result);
        }
        // The caller may have gone away (cancelled and stopped polling): nothing to tell.
        let _ = self.reply.send(result);
    }
}
