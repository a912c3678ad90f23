//! The Node-API addon: memexec's engine for Node (and Bun). Every call returns a Promise whose
//! work runs on the libuv thread pool, waiting for the engine thread; the JS thread never
//! blocks on the model. Errors carry the C API's status name as their `code`.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use memexec::capi::memexec_status;
use memexec::config::Config;
use memexec::engine::{CallOptions as EngineOptions, Engine as Inner, LocalInput as EngineInput};
use napi::bindgen_prelude::AsyncTask;
use napi::{Env, Task};
use napi_derive::napi;

/// A memexec error as a JS Error whose `code` is the C status name (e.g. `MEMEXEC_STATUS_CLOSED`).
fn js_error(e: memexec::Error) -> napi::Error {
    napi::Error::new(
        napi::Status::GenericFailure,
        format!("{}: {e}", memexec_status::of(&e).name()),
    )
}

/// One model input: `system` overrides the stage's default (`""` = no system message).
#[napi(object)]
pub struct LocalInput {
    pub system: Option<String>,
    pub user: String,
}

/// Per-call options.
#[napi(object)]
pub struct CallOptions {
    /// The most tokens to generate (1..64000; default 256).
    pub max_tokens: Option<u32>,
}

/// Counters since start-up.
#[napi(object)]
pub struct Stats {
    pub mode: String,
    pub batch_width: u32,
    pub load_seconds: f64,
    pub completed: f64,
    pub failed: f64,
    pub cancelled: f64,
    pub tokens_in: f64,
    pub tokens_out: f64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub peak_memory_bytes: f64,
    /// In batched mode: decode steps so far (a step over several rows counts once).
    pub batched_steps: Option<f64>,
    /// Draft counts where calls decode speculatively (`speculate` in the config).
    pub speculation: Option<SpeculationStats>,
}

/// What the drafts of speculative calls did (`Stats.speculation`).
#[napi(object)]
pub struct SpeculationStats {
    /// Decode steps (each verifies zero or more drafts).
    pub steps: f64,
    /// Steps that had at least one draft.
    pub steps_with_drafts: f64,
    /// Draft tokens fed.
    pub drafted: f64,
    /// Draft tokens that were the serial token (each saved a step).
    pub accepted: f64,
    /// Steps run without drafts because the adaptive schedule had paused drafting.
    pub paused_steps: f64,
}

fn input(i: LocalInput) -> EngineInput {
    EngineInput {
        system: i.system,
        user: i.user,
    }
}

fn options(o: Option<CallOptions>) -> EngineOptions {
    EngineOptions {
        max_tokens: o.and_then(|o| o.max_tokens).map(|n| n as usize),
    }
}

/// Loads a model on a pool thread.
pub struct OpenTask {
    config: Option<Config>,
}

impl Task for OpenTask {
    type Output = Inner;
    type JsValue = Engine;

    fn compute(&mut self) -> napi::Result<Inner> {
        let config = self
            .config
            .take()
            .ok_or_else(|| napi::Error::from_reason("memexec: open task ran twice"))?;
        Inner::new(config).map_err(js_error)
    }

    fn resolve(&mut self, _env: Env, inner: Inner) -> napi::Result<Engine> {
        Ok(Engine {
            inner: Arc::new(inner),
        })
    }
}

/// One generation (or a batch) waited for on a pool thread.
pub struct GenerateTask {
    engine: Arc<Inner>,
    stage: String,
    inputs: Vec<EngineInput>,
    opts: EngineOptions,
    batch: bool,
}

impl Task for GenerateTask {
    type Output = Vec<String>;
    type JsValue = napi::Either<String, Vec<String>>;

    fn compute(&mut self) -> napi::Result<Vec<String>> {
        let inputs = std::mem::take(&mut self.inputs);
        let done = if self.batch {
            self.engine.batch(&self.stage, inputs, self.opts)
        } else {
            let one = inputs
                .into_iter()
                .next()
                .ok_or_else(|| napi::Error::from_reason("memexec: no input"))?;
            self.engine
                .call(&self.stage, one, self.opts)
                .map(|c| vec![c])
        };
        Ok(done
            .map_err(js_error)?
            .into_iter()
            .map(|c| c.text)
            .collect())
    }

    fn resolve(&mut self, _env: Env, mut texts: Vec<String>) -> napi::Result<Self::JsValue> {
        if self.batch {
            Ok(napi::Either::B(texts))
        } else {
            Ok(napi::Either::A(texts.pop().unwrap_or_default()))
        }
    }
}

/// Starts an engine from a configuration document (the JSON of `memexec_new`, as a string).
/// Resolves once the model is loaded; rejects with a `MEMEXEC_STATUS_*` error otherwise.
#[napi(ts_return_type = "Promise<Engine>")]
pub fn open(config_json: String) -> napi::Result<AsyncTask<OpenTask>> {
    let config = Config::from_json(&config_json).map_err(js_error)?;
    Ok(AsyncTask::new(OpenTask {
        config: Some(config),
    }))
}

/// A chat message.
#[napi(object)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// What the model is fed for a stage call.
#[napi(object)]
pub struct Prompt {
    pub messages: Vec<Message>,
    pub text: String,
    pub ids: Vec<u32>,
}

fn messages_of(m: Vec<memexec::prompt::Message>) -> Vec<Message> {
    m.into_iter()
        .map(|m| Message {
            role: m.role,
            content: m.content,
        })
        .collect()
}

/// The messages of a stage call without a model: `stagesJson` (a config's `stages` map, or
/// null) laid over the built-in stage defaults.
#[napi]
pub fn messages(
    stages_json: Option<String>,
    stage: String,
    input: LocalInput,
) -> napi::Result<Vec<Message>> {
    let stages = match stages_json {
        None => Default::default(),
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            js_error(memexec::Error::InvalidJson {
                what: "stagesJson",
                message: e.to_string(),
            })
        })?,
    };
    let registry = memexec::config::stage_registry(&stages).map_err(js_error)?;
    Ok(messages_of(registry.messages(&stage, &self::input(input))))
}

/// The C ABI version this addon's library implements.
#[napi]
pub fn abi_version() -> u32 {
    memexec::capi::MEMEXEC_ABI_VERSION
}

/// A loaded model. Every method may be called any number of times concurrently.
#[napi]
pub struct Engine {
    inner: Arc<Inner>,
}

#[napi]
impl Engine {
    /// The greedy completion of one input.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn call(
        &self,
        stage: String,
        input: LocalInput,
        opts: Option<CallOptions>,
    ) -> AsyncTask<GenerateTask> {
        AsyncTask::new(GenerateTask {
            engine: self.inner.clone(),
            stage,
            inputs: vec![self::input(input)],
            opts: options(opts),
            batch: false,
        })
    }

    /// The greedy completions of a batch, `out[i]` answering `inputs[i]`.
    #[napi(ts_return_type = "Promise<string[]>")]
    pub fn batch(
        &self,
        stage: String,
        inputs: Vec<LocalInput>,
        opts: Option<CallOptions>,
    ) -> AsyncTask<GenerateTask> {
        AsyncTask::new(GenerateTask {
            engine: self.inner.clone(),
            stage,
            inputs: inputs.into_iter().map(self::input).collect(),
            opts: options(opts),
            batch: true,
        })
    }

    /// What the model is fed for a stage call (no generation).
    #[napi]
    pub fn prompt(&self, stage: String, input: LocalInput) -> napi::Result<Prompt> {
        let p = self
            .inner
            .prompt(&stage, &self::input(input))
            .map_err(js_error)?;
        Ok(Prompt {
            messages: messages_of(p.messages),
            text: p.text,
            ids: p.ids,
        })
    }

    /// Counters since start-up.
    #[napi]
    pub fn stats(&self) -> Stats {
        let s = self.inner.stats();
        Stats {
            mode: s.mode,
            batch_width: s.batch_width as u32,
            load_seconds: s.load_seconds,
            completed: s.completed as f64,
            failed: s.failed as f64,
            cancelled: s.cancelled as f64,
            tokens_in: s.tokens_in as f64,
            tokens_out: s.tokens_out as f64,
            prefill_seconds: s.prefill_seconds,
            decode_seconds: s.decode_seconds,
            peak_memory_bytes: s.peak_memory_bytes as f64,
            batched_steps: s.batched_steps.map(|n| n as f64),
            speculation: s.speculation.map(|p| SpeculationStats {
                steps: p.steps as f64,
                steps_with_drafts: p.steps_with_drafts as f64,
                drafted: p.drafted as f64,
                accepted: p.accepted as f64,
                paused_steps: p.paused_steps as f64,
            }),
        }
    }

    /// Stops the engine: pending calls reject with `MEMEXEC_STATUS_CLOSED`. Idempotent.
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}
