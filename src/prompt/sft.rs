//! The fine-tuning side of the prompt contract: which ids of a training row are "prompt".
//!
//! The trainer renders the full row `{messages: [..., assistant]}` without a generation
//! prompt, renders the messages before the last assistant turn with one, encodes both, and
//! takes their longest common prefix as the prompt region (loss is computed after it). An
//! adapter only sees at inference exactly what it was trained on if `prompt_ids` for
//! `{system, user}` equals that region, id for id; this module computes it so the parity is
//! testable without the trainer.
use serde::Deserialize;

use super::template::{ChatTemplate, Message, RenderOptions};
use super::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A training row as the fine-tuning data stores it.
#[derive(Debug, Clone, Deserialize)]
pub struct TrainingRow {
    /// The conversation, ending with the assistant turn the model learns.
    pub messages: Vec<Message>,
}

/// The prompt region of a training row, and the pieces it was computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRegion {
    /// The longest common prefix of `full_ids` and `prompt_ids`.
    pub region: Vec<u32>,
    /// Ids of the full row rendered without a generation prompt.
    pub full_ids: Vec<u32>,
    /// Ids of the rows before the last assistant turn, rendered with a generation prompt.
    pub prompt_ids: Vec<u32>,
}

/// Computes the prompt region of `messages` (which must contain an assistant turn).
pub fn prompt_region(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Message],
) -> Result<PromptRegion> {
    let last_assistant = messages
        .iter()
        .rposition(|m| m.role == "assistant")
        .ok_or_else(|| {
            Error::InvalidArgument("training row has no assistant message".to_string())
        })?;
    let full = template.render(
        messages,
        &RenderOptions {
            add_generation_prompt: false,
            enable_thinking: None,
        },
    )?;
    let prompt = template.render(
        &messages[..last_assistant],
        &RenderOptions {
            add_generation_prompt: true,
            enable_thinking: None,
        },
    )?;
    let full_ids = tokenizer.encode(&full)?;
    let prompt_ids = tokenizer.encode(&prompt)?;
    let n = full_ids
        .iter()
        .zip(&prompt_ids)
        .take_while(|(a, b)| a == b)
        .count();
    Ok(PromptRegion {
        region: full_ids[..n].to_vec(),
        full_ids,
        prompt_ids,
    })
}
