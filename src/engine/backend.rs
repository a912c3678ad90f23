//! The contract between the engine thread and whatever generates tokens.
//!
//! The engine thread owns the backend (and through it every MLX object) for its whole life.
//! It hands the backend the jobs that are queued; the backend may admit more between decode
//! steps through [`Intake::pull`], which is how a continuous-batching scheduler lets waiting
//! rows join a running batch.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Mutex;

use super::request::Job;
use super::stats::Stats;

/// What the engine thread drives. Implementations live on the engine thread only, so they need
/// not be `Send` after construction (they are built on that thread by the loader).
pub trait Backend {
    /// Static facts, reported in the stats.
    fn info(&self) -> BackendInfo;

    /// Runs `jobs`, and any job `intake` yields while they run, finishing every one of them
    /// exactly once with [`Job::finish`]. A job whose [`Job::interruption`] is `Some` must be
    /// finished with that error at the next step boundary. Returns when no job is unfinished.
    fn run(&mut self, jobs: Vec<Job>, intake: &mut Intake<'_>);

    /// MLX's peak memory in bytes, if the backend can tell.
    fn peak_memory(&self) -> Option<u64> {
        None
    }

    /// Whether the backend steps several rows at once (and counts its steps with
    /// [`Intake::count_batched_steps`]).
    fn batches_rows(&self) -> bool {
        false
    }
}

/// Facts about a loaded backend.
#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// Generation mode ("serial", "batched", ...).
    pub mode: String,
    /// The model's context length in tokens.
    pub max_context: usize,
    /// The form the model's matrices run in ("quantized" / "dense", see
    /// [`crate::model::weight_form`]).
    pub weights: String,
    /// The backend's prompter (tokenizer + template + stages, no MLX state): shared so that
    /// prompt questions are answered on the caller's thread, without queueing.
    pub prompter: Option<std::sync::Arc<crate::prompt::Prompter>>,
}

/// Messages on the engine queue.
pub(crate) enum Msg {
    /// Jobs to run; a batch call sends its jobs together so they can share steps.
    Jobs(Vec<Job>),
    /// Stop: fail what is queued, drop the backend, end the thread.
    Shutdown,
}

/// The backend's view of the engine queue: newly submitted jobs, without blocking.
pub struct Intake<'a> {
    rx: &'a Receiver<Msg>,
    closing: &'a AtomicBool,
    stats: &'a Mutex<Stats>,
    shutdown: bool,
}

impl<'a> Intake<'a> {
    pub(crate) fn new(
        rx: &'a Receiver<Msg>,
        closing: &'a AtomicBool,
        stats: &'a Mutex<Stats>,
    ) -> Self {
        Intake {
            rx,
            closing,
            stats,
            shutdown: false,
        }
    }

    /// Adds `steps` decode steps to [`Stats::batched_steps`]. A backend calls it before it
    /// answers the jobs those steps finished, so a caller reading the stats after its answer
    /// sees every step its call took part in.
    pub fn count_batched_steps(&self, steps: u64) {
        if let Ok(mut s) = self.stats.lock() {
            s.batched_steps = Some(s.batched_steps.unwrap_or(0) + steps);
        }
    }

    /// Every job queued since the last pull, in submission order; never blocks.
    pub fn pull(&mut self) -> Vec<Job> {
        let mut jobs = Vec::new();
        if self.shutdown {
            return jobs;
        }
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Jobs(more)) => jobs.extend(more),
                Ok(Msg::Shutdown) | Err(TryRecvError::Disconnected) => {
                    self.shutdown = true;
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        jobs
    }

    /// True once the engine is closing: every running job should be interrupted.
    pub fn closing(&self) -> bool {
        self.shutdown || self.closing.load(Ordering::SeqCst)
    }

    pub(crate) fn saw_shutdown(&self) -> bool {
        self.shutdown
    }
}

/// Generates one job at a time; [`Serial`] turns it into a [`Backend`].
pub trait Generate {
    /// Static facts, reported in the stats.
    fn info(&self) -> BackendInfo;

    /// Answers one job. Implementations check [`Job::interruption`] between decode steps and
    /// return its error when set.
    fn generate(&mut self, job: &Job) -> crate::Result<super::request::Completion>;

    /// MLX's peak memory in bytes, if known.
    fn peak_memory(&self) -> Option<u64> {
        None
    }
}

/// The reference scheduling: one job after another, in arrival order, admitting newly queued
/// jobs after each.
pub struct Serial<G>(pub G);

impl<G: Generate> Backend for Serial<G> {
    fn info(&self) -> BackendInfo {
        self.0.info()
    }

    fn run(&mut self, jobs: Vec<Job>, intake: &mut Intake<'_>) {
        let mut queue: VecDeque<Job> = jobs.into();
        while let Some(job) = queue.pop_front() {
            let result = match job.interruption() {
                Some(e) => Err(e),
                None => self.0.generate(&job),
            };
            job.finish(result);
            queue.extend(intake.pull());
        }
    }

    fn peak_memory(&self) -> Option<u64> {
        self.0.peak_memory()
    }
}
