//! The parts of a Hugging Face `tokenizer_config.json` that shape a prompt: the special token
//! strings and the embedded chat template.
use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// A special token as `tokenizer_config.json` writes it: a bare string or an `AddedToken`
/// object (`{"content": "<bos>", ...}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Plain(String),
    Added { content: String },
}

impl TokenSpec {
    fn into_string(self) -> String {
        match self {
            TokenSpec::Plain(s) | TokenSpec::Added { content: s } => s,
        }
    }
}

/// One entry of the list form of `chat_template`.
#[derive(Debug, Clone, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// `chat_template` is either one template or a list of named ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TemplateSpec {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
struct Raw {
    bos_token: Option<TokenSpec>,
    eos_token: Option<TokenSpec>,
    pad_token: Option<TokenSpec>,
    chat_template: Option<TemplateSpec>,
}

/// What memexec reads from `tokenizer_config.json`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    /// The beginning-of-sequence token text (`<bos>` for Gemma).
    pub bos_token: Option<String>,
    /// The end-of-sequence token text.
    pub eos_token: Option<String>,
    /// The padding token text.
    pub pad_token: Option<String>,
    /// The chat template embedded in the config, already resolved to the `default` one when
    /// the config carries a list of named templates.
    pub chat_template: Option<String>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|reason| Error::InvalidFile {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses the JSON text of a `tokenizer_config.json`; the error is a reason without path.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let chat_template = match raw.chat_template {
            None => None,
            Some(TemplateSpec::One(s)) => Some(s),
            Some(TemplateSpec::Named(list)) => {
                let names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
                let found = list.iter().find(|t| t.name == "default");
                match found {
                    Some(t) => Some(t.template.clone()),
                    None => {
                        return Err(format!(
                            "chat_template is a list of named templates without a \"default\" one \
                             (names: {names:?})"
                        ))
                    }
                }
            }
        };
        Ok(Self {
            bos_token: raw.bos_token.map(TokenSpec::into_string),
            eos_token: raw.eos_token.map(TokenSpec::into_string),
            pad_token: raw.pad_token.map(TokenSpec::into_string),
            chat_template,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_as_strings_or_added_token_objects() {
        let c = TokenizerConfig::from_json(
            r#"{"bos_token": "<bos>", "eos_token": {"content": "<eos>", "lstrip": false},
                "pad_token": null, "other": 1}"#,
        )
        .unwrap();
        assert_eq!(c.bos_token.as_deref(), Some("<bos>"));
        assert_eq!(c.eos_token.as_deref(), Some("<eos>"));
        assert_eq!(c.pad_token, None);
        assert_eq!(c.chat_template, None);
    }

    #[test]
    fn named_templates_pick_default() {
        let c = TokenizerConfig::from_json(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}]}"#,
        )
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        let err = TokenizerConfig::from_json(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
        )
        .unwrap_err();
        assert!(err.contains("default") && err.contains("tool_use"), "{err}");
    }
}
