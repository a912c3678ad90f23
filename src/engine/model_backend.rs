//! The production backend: the model, its prompter and the serial greedy path (SPEC §4's
//! reference), driven one request at a time with cancellation between decode steps.
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use mlx_rs::Device;

use super::backend::{Backend, BackendInfo, Generate};
use super::request::{Completion, Job, StopReason};
use super::speculative::{greedy_speculative_until, SpeculateOptions};
use crate::config::{Config, DeviceChoice};
use crate::generate::{greedy_until, GenerateOptions, StopReason as GenStop, PREFILL_STEP};
use crate::lora::{Activation, AdapterId, AdapterRegistry, AdapterStack};
use crate::model::{LoadOptions, Model};
use crate::prompt::Prompter;
use crate::{Error, Result};

/// The model and everything needed to turn a stage call into its greedy answer.
pub struct ModelBackend {
    model: Model,
    adapters: Rc<AdapterRegistry>,
    /// Each stage's adapter; stages not listed run on the base model.
    stage_adapters: BTreeMap<String, AdapterId>,
    prompter: Arc<Prompter>,
    stop_ids: Vec<u32>,
    max_prompt_tokens: usize,
    prompt_limit_why: &'static str,
    /// Set: calls decode speculatively (the same ids, fewer steps where drafts match).
    speculate: Option<SpeculateOptions>,
    kv_budget: Option<u64>,
}

/// The loader [`super::Engine::new`] runs on the engine thread.
pub(crate) fn load(config: &Config) -> Result<Box<dyn Backend>> {
    let backend = ModelBackend::load(config)?;
    let kv_budget = backend.kv_budget();
    Ok(super::batched::select(
        backend,
        config.batch_width,
        kv_budget,
    ))
}

/// The KV budget an engine on `model` runs under: `max_kv_bytes` when set, else half the
/// physical memory the weights leave (`None` where that is unknown). Tools that drive the
/// decoders directly (`memexec bench`, `memexec generate`) use it too, so they bound draft
/// rows and admission as the engine does.
pub fn kv_budget_for(model: &Model, max_kv_bytes: Option<u64>) -> Option<u64> {
    max_kv_bytes.or_else(|| {
        let memory = crate::model::weight_form::physical_memory()?;
        let weights = model.info().weight_bytes as u64;
        Some(memory.saturating_sub(weights) / 2)
    })
}

fn select_device(choice: DeviceChoice) -> Result<()> {
    match choice {
        DeviceChoice::Default => Ok(()),
        DeviceChoice::Cpu => {
            Device::set_default(&Device::cpu());
            Ok(())
        }
        // mlx-rs' `Device::gpu()` aborts where MLX has no GPU backend; only Apple builds have
        // Metal for certain.
        DeviceChoice::Gpu if cfg!(target_os = "macos") => {
            Device::set_default(&Device::gpu());
            Ok(())
        }
        DeviceChoice::Gpu => Err(Error::InvalidConfig(
            "`device: \"gpu\"` is only available on macOS builds; use \"default\" (MLX picks its GPU when it has one) or \"cpu\"".into(),
        )),
    }
}

/// Mounts every configured adapter once (validated against the model before anything is
/// mounted; a bad adapter fails the load, naming the adapter and tensor).
fn mount_adapters(config: &Config, model: &Model) -> Result<Rc<AdapterRegistry>> {
    let mut registry = AdapterRegistry::new(model.linear_modules());
    for (name, dir) in &config.adapters {
        registry.mount_named(name, dir)?;
    }
    Ok(Rc::new(registry))
}

impl ModelBackend {
    /// Loads model, tokenizer, template and stage registry of `config`.
    pub fn load(config: &Config) -> Result<ModelBackend> {
        select_device(config.device)?;
        let mut opts = LoadOptions::new(config.weights);
        if let Some(d) = config.decode_attention {
            opts.decode_attention = d;
        }
        if let Some(r) = config.row_kernel {
            opts.row_kernel = r;
        }
        let model = Model::load_opts(&config.model_dir, opts)?;
        let adapters = mount_adapters(config, &model)?;
        let mut stage_adapters = BTreeMap::new();
        for (stage, spec) in &config.stages {
            if let Some(name) = &spec.adapter {
                let id = adapters.id(name).ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "stage `{stage}`: adapter `{name}` is not mounted"
                    ))
                })?;
                stage_adapters.insert(stage.clone(), id);
            }
        }
        let prompter = Prompter::from_dir(&config.model_dir)?
            .with_stages(crate::config::stage_registry(&config.stages)?);
        let mut stop_ids = model.info().eos_token_ids.clone();
        if let Some(eos) = prompter.tokenizer().eos() {
            if !stop_ids.contains(&eos.id) {
                stop_ids.push(eos.id);
            }
        }
        let context = model.info().max_context;
        let (max_prompt_tokens, prompt_limit_why) = match config.limits.max_prompt_tokens {
            Some(n) if n < context => (n, "limits.max_prompt_tokens"),
            _ => (context, "the model's context"),
        };
        let kv_budget = kv_budget_for(&model, config.limits.max_kv_bytes);
        let speculate = match &config.speculate {
            Some(s) => Some(s.options()?.within(kv_budget)),
            None => None,
        };
        Ok(ModelBackend {
            kv_budget,
            model,
            adapters,
            stage_adapters,
            prompter: Arc::new(prompter),
            stop_ids,
            max_prompt_tokens,
            prompt_limit_why,
            speculate,
        })
    }

    /// The most KV bytes the running rows may hold together, estimated: `limits.max_kv_bytes`,
    /// else half the memory the weights leave (`None` where that is unknown). Bounds batch
    /// admission and speculation's draft rows.
    pub fn kv_budget(&self) -> Option<u64> {
        self.kv_budget
    }

    /// The speculation calls decode with (`speculate` in the config), if any.
    pub fn speculation(&self) -> Option<&SpeculateOptions> {
        self.speculate.as_ref()
    }

    /// The ids generation stops at: the model's eos ids plus the tokenizer's eos.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The loaded model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The prompter (tokenizer, template, stages).
    pub fn prompter(&self) -> &Prompter {
        &self.prompter
    }

    /// The mounted adapters.
    pub fn adapters(&self) -> &Rc<AdapterRegistry> {
        &self.adapters
    }

    /// Exactly the stage's adapter, or none (the base model, with no adapter op at all).
    pub fn stage_stack(&self, stage: &str) -> AdapterStack {
        match self.stage_adapters.get(stage) {
            Some(id) => AdapterStack::single(*id),
            None => AdapterStack::none(),
        }
    }

    /// The prompt ids of `job`, checked against the prompt limit.
    pub fn prompt_for(&self, job: &Job) -> Result<Vec<u32>> {
        let prompt = self.prompter.prompt_ids(&job.stage, &job.input)?;
        if prompt.len() > self.max_prompt_tokens {
            return Err(Error::PromptTooLong {
                tokens: prompt.len(),
                limit: self.max_prompt_tokens,
                why: self.prompt_limit_why,
            });
        }
        Ok(prompt)
    }
}

impl Generate for ModelBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            mode: match &self.speculate {
                None => "serial".into(),
                Some(s) => format!("serial, speculative k{}", s.max_drafts),
            },
            max_context: self.model.info().max_context,
            weights: self.model.info().weight_form.name().into(),
            prompter: Some(self.prompter.clone()),
        }
    }

    /// Exactly [`crate::generate::greedy`]'s schedule, with an interruption check before the
    /// prefill and between decode steps.
    fn generate(&mut self, job: &Job) -> Result<Completion> {
        let prompt = self.prompt_for(job)?;
        if let Some(e) = job.interruption() {
            return Err(e);
        }
        let stack = self.stage_stack(&job.stage);
        let opts = GenerateOptions {
            max_tokens: job.max_tokens,
            prefill_step: PREFILL_STEP,
            stop_ids: Some(self.stop_ids.clone()),
            adapters: Activation::per_row(self.adapters.clone(), vec![stack])?,
        };
        let interrupted = || match job.interruption() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        let (g, speculation) = match &self.speculate {
            None => (greedy_until(&self.model, &prompt, opts, interrupted)?, None),
            Some(spec) => {
                let (g, s) =
                    greedy_speculative_until(&self.model, &prompt, opts, spec, interrupted)?;
                (g, Some(s))
            }
        };
        let stop = match g.stop {
            GenStop::Eos(_) => StopReason::Eos,
            GenStop::MaxTokens => StopReason::MaxTokens,
        };
        Ok(Completion {
            text: self.prompter.tokenizer().decode(&g.ids)?,
            ids: g.ids,
            prompt_tokens: prompt.len(),
            stop,
            prefill_time: g.prefill_time,
            decode_time: g.decode_time,
            speculation,
        })
    }

    fn peak_memory(&self) -> Option<u64> {
        mlx_rs::memory::peak_memory().ok().map(|b| b as u64)
    }
}
