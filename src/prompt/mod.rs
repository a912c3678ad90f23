//! The prompt contract (SPEC §1): a stage call `{system?, user}` becomes messages, the model
//! directory's own chat template renders them, and the tokenizer encodes the text without
//! adding special tokens. Training parity ([`sft`]) is checked against the same pieces.
use std::path::Path;

pub mod detokenize;
pub mod pycompat;
pub mod pyjson;
pub mod sft;
pub mod stages;
pub mod strftime;
pub mod template;
pub mod tokenizer;
pub mod tokenizer_config;

pub use detokenize::IncrementalDecoder;
pub use stages::{LocalInput, StageConfig, StageSpec};
pub use template::{ChatTemplate, Message, RenderOptions};
pub use tokenizer::{SpecialToken, Tokenizer};
pub use tokenizer_config::TokenizerConfig;

use crate::Result;

/// A stage call's prompt: the messages, the rendered text and its ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The messages given to the template.
    pub messages: Vec<Message>,
    /// The rendered template text.
    pub text: String,
    /// The ids the model is fed.
    pub ids: Vec<u32>,
}

/// Tokenizer + chat template + stage registry of one model directory: everything needed to
/// turn a stage call into prompt ids.
#[derive(Debug)]
pub struct Prompter {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    stages: StageConfig,
}

impl Prompter {
    /// Assembles a prompter from loaded parts.
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate, stages: StageConfig) -> Self {
        Self {
            tokenizer,
            template,
            stages,
        }
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json` and the chat template of a model
    /// directory, with the built-in stage defaults.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(crate::Error::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "model directory not found",
                ),
            });
        }
        let config = TokenizerConfig::from_file(&dir.join("tokenizer_config.json"))?;
        let tokenizer = Tokenizer::from_dir(dir, &config)?;
        let template = ChatTemplate::from_dir(dir, &config)?;
        Ok(Self::new(tokenizer, template, StageConfig::builtin()))
    }

    /// Replaces the stage registry.
    pub fn with_stages(mut self, stages: StageConfig) -> Self {
        self.stages = stages;
        self
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The stage registry.
    pub fn stages(&self) -> &StageConfig {
        &self.stages
    }

    /// The messages of a stage call.
    pub fn messages(&self, stage: &str, input: &LocalInput) -> Vec<Message> {
        self.stages.messages(stage, input)
    }

    /// The full prompt of a stage call: rendered with `add_generation_prompt`, no tools,
    /// `enable_thinking` undefined; encoded without special tokens; a doubled leading BOS
    /// (template BOS + a BOS already in the text) reduced to one.
    pub fn prompt(&self, stage: &str, input: &LocalInput) -> Result<Prompt> {
        let messages = self.messages(stage, input);
        let text = self.template.render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                enable_thinking: None,
            },
        )?;
        let mut ids = self.tokenizer.encode(&text)?;
        if let Some(bos) = self.tokenizer.bos() {
            if ids.len() >= 2 && ids[0] == bos.id && ids[1] == bos.id {
                ids.remove(0);
            }
        }
        Ok(Prompt {
            messages,
            text,
            ids,
        })
    }

    /// The ids the model is fed for a stage call (see [`Prompter::prompt`]).
    pub fn prompt_ids(&self, stage: &str, input: &LocalInput) -> Result<Vec<u32>> {
        Ok(self.prompt(stage, input)?.ids)
    }

    /// The fine-tuning prompt region of a training row (see [`sft`]).
    pub fn sft_prompt_region(&self, messages: &[Message]) -> Result<sft::PromptRegion> {
        sft::prompt_region(&self.template, &self.tokenizer, messages)
    }
}
