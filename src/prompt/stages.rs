//! Pipeline stages and the messages of a call (SPEC §1): `system = input.system ??
//! defaultSystem(stage)`, sent only when non-empty.
use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::template::Message;
use crate::{Error, Result};

/// One call's input, as the TypeScript seam passes it: `{ system?: string, user: string }`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalInput {
    /// The system prompt; `None` means "use the stage's default", `Some("")` means "none".
    #[serde(default)]
    pub system: Option<String>,
    /// The user message.
    pub user: String,
}

impl LocalInput {
    /// An input with only a user message.
    pub fn user(user: impl Into<String>) -> Self {
        Self {
            system: None,
            user: user.into(),
        }
    }

    /// An input with an explicit system prompt.
    pub fn with_system(system: impl Into<String>, user: impl Into<String>) -> Self {
        Self {
            system: Some(system.into()),
            user: user.into(),
        }
    }
}

/// What configuration says about one stage.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The system prompt used when a call gives none (`null` or absent: no default).
    #[serde(default)]
    pub system: Option<String>,
}

/// The stage registry: stage name → [`StageSpec`]. Stages not listed are still valid: they
/// get no default system prompt.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct StageConfig {
    stages: BTreeMap<String, StageSpec>,
}

/// The built-in defaults, as JSON so that they read exactly like a user's configuration.
/// `chunk` is deliberately absent: its caller passes the system prompt its adapter was
/// trained with.
pub const DEFAULT_STAGES_JSON: &str = r#"{
  "entity": {"system": "You extract the names of the people, places, organisations and things the text mentions, one per line, and nothing else."},
  "route": {"system": "You answer only 'yes' or 'no'."},
  "section": {"system": "You answer only with the name of the section this text belongs in, chosen from the given list."},
  "synthesis": {"system": "You write a concise, factual article from the given notes, using only what they state."},
  "editor": {"system": "You edit the given article for accuracy and clarity and return only the revised article."}
}"#;

impl Default for StageConfig {
    fn default() -> Self {
        Self::builtin()
    }
}

impl StageConfig {
    /// The built-in stage defaults ([`DEFAULT_STAGES_JSON`]).
    pub fn builtin() -> Self {
        // The constant is covered by a unit test; an empty registry is the safe fallback.
        serde_json::from_str(DEFAULT_STAGES_JSON).unwrap_or_else(|_| Self::empty())
    }

    /// A registry with no stage defaults at all.
    pub fn empty() -> Self {
        Self {
            stages: BTreeMap::new(),
        }
    }

    /// Parses a JSON map `{"stage": {"system": "..."}}` (unknown keys are errors).
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("stage configuration: {e}")))
    }

    /// Reads a JSON stage map from a file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
            path: path.to_path_buf(),
            reason: format!("stage configuration: {e}"),
        })
    }

    /// These stages with `overrides` laid on top: a stage named there replaces the entry
    /// here (so `{"route": {}}` removes route's default system prompt).
    pub fn merged(mut self, overrides: StageConfig) -> Self {
        self.stages.extend(overrides.stages);
        self
    }

    /// The configuration of `stage`, if it is listed.
    pub fn get(&self, stage: &str) -> Option<&StageSpec> {
        self.stages.get(stage)
    }

    /// The default system prompt of `stage` (none for unlisted stages).
    pub fn default_system(&self, stage: &str) -> Option<&str> {
        self.stages.get(stage).and_then(|s| s.system.as_deref())
    }

    /// The listed stage names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.stages.keys().map(String::as_str)
    }

    /// The messages of a call: `[system, user]` when `input.system ?? default` is a
    /// non-empty string, else `[user]`.
    pub fn messages(&self, stage: &str, input: &LocalInput) -> Vec<Message> {
        let system = match &input.system {
            Some(s) => Some(s.as_str()),
            None => self.default_system(stage),
        };
        let mut out = Vec::with_capacity(2);
        if let Some(system) = system.filter(|s| !s.is_empty()) {
            out.push(Message::new("system", system));
        }
        out.push(Message::new("user", input.user.as_str()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_defaults_parse_and_chunk_has_none() {
        let parsed: StageConfig = serde_json::from_str(DEFAULT_STAGES_JSON).unwrap();
        assert_eq!(parsed, StageConfig::builtin());
        for stage in ["entity", "route", "section", "synthesis", "editor"] {
            let s = parsed.default_system(stage).unwrap_or_default();
            assert!(!s.is_empty() && !s.contains('\n'), "{stage}: {s:?}");
        }
        assert_eq!(parsed.default_system("chunk"), None);
    }
}
