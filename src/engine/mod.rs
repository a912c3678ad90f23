//! The engine: one thread owns the backend and every MLX object (MLX is not thread-safe);
//! [`Engine`] is the `Send + Sync` handle that queues requests for it.
//!
//! Callers on any thread submit jobs; the engine thread runs them through the [`Backend`],
//! which may admit newly queued jobs between decode steps. The loader runs on the engine thread
//! too, and a load failure is returned by [`Engine::new`] (nothing is cached: a later `new`
//! tries again).
pub mod backend;
pub mod batched;
pub mod draft_schedule;
mod model_backend;
pub mod request;
pub mod scheduler;
pub mod speculative;
pub mod stats;
mod ticket;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

pub use backend::{Backend, BackendInfo, Generate, Intake, Serial};
pub use batched::{Batched, Decoder, RowOutput, RowRequest};
pub use model_backend::{kv_budget_for, ModelBackend};
pub use request::{CallOptions, CancelFlag, Completion, Job, LocalInput, StopReason};
pub use stats::Stats;
pub use ticket::Ticket;

use crate::config::Config;
use crate::{Error, Result};
use backend::Msg;

/// Builds the backend on the engine thread.
pub type Loader = Box<dyn FnOnce(&Config) -> Result<Box<dyn Backend>> + Send>;

/// A running engine. Cheap to share (`Arc<Engine>`); every method may be called from any thread.
pub struct Engine {
    config: Arc<Config>,
    tx: Sender<Msg>,
    closing: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    info: BackendInfo,
}

impl Engine {
    /// Starts an engine serving the model of `config` (loaded on the engine thread).
    pub fn new(config: Config) -> Result<Engine> {
        Self::with_loader(config, Box::new(model_backend::load))
    }

    /// Starts an engine thread that builds its backend with `loader`, and waits for the load.
    ///
    /// A load error (or a panic in the loader) is returned as [`Error::Load`] and the thread
    /// ends; nothing of the failed attempt is kept.
    pub fn with_loader(config: Config, loader: Loader) -> Result<Engine> {
        config.validate()?;
        let config = Arc::new(config);
        let (tx, rx) = mpsc::channel::<Msg>();
        let (loaded_tx, loaded_rx) = mpsc::sync_channel::<Result<BackendInfo>>(1);
        let closing = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats {
            batch_width: config.batch_width,
            speculation: config.speculate.map(|_| Default::default()),
            ..Stats::default()
        }));
        let thread = {
            let (config, closing, stats) = (config.clone(), closing.clone(), stats.clone());
            std::thread::Builder::new()
                .name("memexec-engine".into())
                .spawn(move || {
                    let started = Instant::now();
                    let loaded = catch_unwind(AssertUnwindSafe(|| loader(&config)))
                        .unwrap_or_else(|p| Err(Error::Internal(panic_message(&p))));
                    let backend = match loaded {
                        Ok(backend) => backend,
                        Err(e) => {
                            let _ = loaded_tx.send(Err(Error::Load(Box::new(e))));
                            return;
                        }
                    };
                    let info = backend.info();
                    if let Ok(mut s) = stats.lock() {
                        s.mode = info.mode.clone();
                        s.weights = info.weights.clone();
                        s.load_seconds = started.elapsed().as_secs_f64();
                        s.batched_steps = backend.batches_rows().then_some(0);
                    }
                    if loaded_tx.send(Ok(info)).is_err() {
                        return;
                    }
                    serve(backend, &rx, &closing, &stats);
                })
                .map_err(|e| Error::Internal(format!("cannot spawn the engine thread: {e}")))?
        };
        let info = match loaded_rx.recv() {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Load(Box::new(Error::Internal(
                    "the engine thread ended during the load".into(),
                ))));
            }
        };
        Ok(Engine {
            config,
            tx,
            closing,
            stats,
            thread: Mutex::new(Some(thread)),
            info,
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the backend reported at load.
    pub fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// Queues one input; the ticket yields a one-element result.
    pub fn submit(&self, stage: &str, input: LocalInput, opts: CallOptions) -> Result<Ticket> {
        self.enqueue(stage, vec![input], opts, false)
    }

    /// Queues a batch; the ticket yields results in input order. An empty batch is answered at
    /// once, without touching the engine thread.
    pub fn submit_batch(
        &self,
        stage: &str,
        inputs: Vec<LocalInput>,
        opts: CallOptions,
    ) -> Result<Ticket> {
        self.enqueue(stage, inputs, opts, true)
    }

    /// Generates for one input, blocking the calling thread until done.
    pub fn call(&self, stage: &str, input: LocalInput, opts: CallOptions) -> Result<Completion> {
        let mut out = self.submit(stage, input, opts)?.wait()?;
        out.pop()
            .ok_or_else(|| Error::Internal("a single call produced no completion".into()))
    }

    /// Generates for every input (order preserved), blocking until all are done. The first
    /// failing input fails the batch (its index is in the error) and cancels the rest.
    pub fn batch(
        &self,
        stage: &str,
        inputs: Vec<LocalInput>,
        opts: CallOptions,
    ) -> Result<Vec<Completion>> {
        self.submit_batch(stage, inputs, opts)?.wait()
    }

    /// The prompt of a stage call (messages, rendered text, ids), as generation would see it.
    pub fn prompt(&self, stage: &str, input: &LocalInput) -> Result<crate::prompt::Prompt> {
        match &self.info.prompter {
            Some(p) => p.prompt(stage, input),
            None => Err(Error::Internal("this backend has no prompter".into())),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        match self.stats.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// True once [`Engine::close`] ran.
    pub fn is_closed(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Stops the engine: queued and running requests fail with [`Error::Closed`], the backend
    /// (and the model's memory) is dropped on its thread, and this returns once the thread has
    /// ended. Idempotent.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Msg::Shutdown);
        let thread = match self.thread.lock() {
            Ok(mut t) => t.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    fn enqueue(
        &self,
        stage: &str,
        inputs: Vec<LocalInput>,
        opts: CallOptions,
        batch: bool,
    ) -> Result<Ticket> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let limits = &self.config.limits;
        if inputs.len() > limits.max_batch {
            return Err(Error::InvalidArgument(format!(
                "a batch of {} inputs exceeds `limits.max_batch` ({})",
                inputs.len(),
                limits.max_batch
            )));
        }
        let max_tokens = opts.max_tokens.unwrap_or(limits.default_max_tokens);
        if max_tokens == 0 {
            return Err(Error::InvalidArgument(
                "`max_tokens` must be at least 1".into(),
            ));
        }
        if max_tokens > limits.max_tokens_cap {
            return Err(Error::InvalidArgument(format!(
                "`max_tokens` {max_tokens} exceeds `limits.max_tokens_cap` ({})",
                limits.max_tokens_cap
            )));
        }
        let cancel = CancelFlag::new(self.closing.clone());
        let now = Instant::now();
        let mut receivers = Vec::with_capacity(inputs.len());
        let mut jobs = Vec::with_capacity(inputs.len());
        for input in inputs {
            let (reply, rx) = mpsc::channel();
            receivers.push(rx);
            jobs.push(Job {
                stage: stage.to_owned(),
                input,
                max_tokens,
                cancel: cancel.clone(),
                reply,
                stats: self.stats.clone(),
                queued_at: now,
            });
        }
        if !jobs.is_empty() && self.tx.send(Msg::Jobs(jobs)).is_err() {
            return Err(Error::Closed);
        }
        Ok(Ticket::new(receivers, cancel, self.closing.clone(), batch))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.close();
    }
}

/// The engine thread's loop: wait for jobs, let the backend run them (admitting more as they
/// arrive), until shutdown; then fail whatever is still queued.
fn serve(
    mut backend: Box<dyn Backend>,
    rx: &Receiver<Msg>,
    closing: &AtomicBool,
    stats: &Mutex<Stats>,
) {
    while let Ok(msg) = rx.recv() {
        let Msg::Jobs(jobs) = msg else { break };
        let mut intake = Intake::new(rx, closing, stats);
        let mut jobs = jobs;
        jobs.extend(intake.pull());
        // A panicking backend drops its jobs: their callers see the engine fail, and the
        // thread keeps serving the next requests.
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| backend.run(jobs, &mut intake))) {
            tracing::error!("backend panicked: {}", panic_message(&p));
        }
        if let (Some(peak), Ok(mut s)) = (backend.peak_memory(), stats.lock()) {
            s.peak_memory_bytes = peak;
        }
        if intake.saw_shutdown() {
            break;
        }
    }
    closing.store(true, Ordering::SeqCst);
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Jobs(jobs) = msg {
            for job in jobs {
                job.finish(Err(Error::Closed));
            }
        }
    }
    drop(backend);
}

/// The text of a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic with a non-string payload".into()
    }
}
