//! The one JSON configuration document of an engine: which model, which adapters, what each
//! stage runs with, how wide a batch may be, which device, and the limits that protect the host.
//!
//! Unknown keys anywhere are an error (a typo must not silently fall back to a default).
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::model::quantized_row::RowKernel;
use crate::model::{DecodeAttention, WeightChoice};
use crate::{Error, Result};

/// The environment variable the TypeScript pipeline already uses for the batch width.
pub const BATCH_ENV: &str = "MLX_BUN_MEMORY_BATCH";

/// `maxTokens` callers may pass as a "never truncate" backstop (SPEC §1).
pub const MAX_TOKENS_CAP: usize = 64_000;

/// `maxTokens` when a call does not pass one (SPEC §1).
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// The configuration document given to `memexec_new` / [`crate::engine::Engine::new`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model directory (MLX checkpoint: config.json, safetensors, tokenizer, template).
    pub model_dir: PathBuf,
    /// Adapter directories by name, mounted once at start-up.
    #[serde(default)]
    pub adapters: BTreeMap<String, PathBuf>,
    /// Per-stage settings; they override the built-in stage defaults.
    #[serde(default)]
    pub stages: BTreeMap<String, StageSpec>,
    /// How many requests may share decode steps; default `$MLX_BUN_MEMORY_BATCH`, else
    /// [`DEFAULT_BATCH_WIDTH`] (logging a warning when the variable is set to anything but a
    /// positive integer).
    #[serde(default = "default_batch_width")]
    pub batch_width: usize,
    /// Where MLX runs.
    #[serde(default)]
    pub device: DeviceChoice,
    /// The form of the quantized matrices in memory: "auto" (default), "quantized" or "dense"
    /// (see [`crate::model::weight_form`]).
    #[serde(default)]
    pub weights: WeightChoice,
    /// How decode steps attend: "mlx" (MLX's op, mlx-lm's numeric path; on MLX CUDA computed
    /// as "probs" where that passes its start-up self-check, see
    /// [`crate::model::attention_probs`]) or "kernel" (one CUDA kernel node for all rows, MLX
    /// CUDA only, not mlx-lm's bits; see [`crate::model::decode_attention`]); absent =
    /// `$MEMEXEC_DECODE_ATTENTION`, else "mlx".
    #[serde(default)]
    pub decode_attention: Option<DecodeAttention>,
    /// Which one-row quantized products run through memexec's CUDA kernel with MLX's bits
    /// (see [`crate::model::quantized_row::RowKernel`]): "off", "large" or "all"; absent =
    /// `$MEMEXEC_ROW_KERNEL`, else "off". Where the kernel cannot run or does not match MLX
    /// (CPU, Metal, another MLX) the model keeps MLX's product and logs why.
    #[serde(default)]
    pub row_kernel: Option<RowKernel>,
    /// Limits on what a caller may ask for.
    #[serde(default)]
    pub limits: Limits,
    /// Speculative decoding with exact verification (see
    /// [`crate::engine::speculative`]): absent = off. With `batch_width` 1 every call's decode
    /// verifies drafts; a batched engine verifies them for a call while it runs alone (see
    /// [`crate::engine::Decoder::with_speculation`]).
    #[serde(default)]
    pub speculate: Option<Speculate>,
}

/// `speculate`: drafts found by n-gram lookup in each call's prompt and output, verified in
/// one step; the answers are the serial greedy ones token for token.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Speculate {
    /// The most drafts per step, 1 to [`crate::engine::speculative::MAX_DRAFTS`].
    pub max_drafts: usize,
    /// The longest n-gram the lookup matches (default 3).
    #[serde(default = "default_ngram")]
    pub ngram: usize,
}

impl Speculate {
    /// The decoding options this section asks for, checked (see
    /// [`crate::engine::speculative::SpeculateOptions::new`]).
    pub fn options(&self) -> Result<crate::engine::speculative::SpeculateOptions> {
        use crate::engine::speculative::{Drafts, SpeculateOptions};
        SpeculateOptions::new(Drafts::Lookup { ngram: self.ngram }, self.max_drafts)
    }
}

fn default_ngram() -> usize {
    3
}

/// What one stage runs with.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The name of an entry of [`Config::adapters`]; absent = the base model.
    #[serde(default)]
    pub adapter: Option<String>,
    /// The default system prompt; an empty string means "no system message".
    #[serde(default)]
    pub system: Option<String>,
}

/// The device MLX should run on.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// MLX's default (the GPU where the build has one).
    #[default]
    Default,
    /// MLX's CPU backend.
    Cpu,
    /// The GPU (Metal on macOS); an error where the build has none.
    Gpu,
}

/// Limits on requests, checked before anything is queued.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// The most inputs one batch call may carry.
    pub max_batch: usize,
    /// The largest `max_tokens` a call may pass.
    pub max_tokens_cap: usize,
    /// `max_tokens` when a call passes none.
    pub default_max_tokens: usize,
    /// An extra cap on prompt length in tokens (the model's context always applies).
    pub max_prompt_tokens: Option<usize>,
    /// The most KV-cache bytes the rows decoding together may hold (estimated at each row's
    /// end): a row waits for others to finish rather than exceed it, and a speculative
    /// verification step feeds fewer drafts (each takes a slot of the row's size). `None`:
    /// half of the physical memory left after the weights (no bound where memory is unknown).
    pub max_kv_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch: 4096,
            max_tokens_cap: MAX_TOKENS_CAP,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            max_prompt_tokens: None,
            max_kv_bytes: None,
        }
    }
}

fn default_batch_width() -> usize {
    let value = std::env::var(BATCH_ENV).ok();
    let width = batch_width_from_env(value.as_deref());
    // The TS pipeline this replaces fell back silently; a typo should at least be visible.
    if let Some(v) = value.filter(|v| positive_width(v).is_none()) {
        tracing::warn!("${BATCH_ENV}={v:?} is not a positive integer: batch width {width}");
    }
    width
}

/// The batch width when neither the config nor `$MLX_BUN_MEMORY_BATCH` sets one.
///
/// Batched decoding is the default because it is exact (rows get the serial tokens, checked
/// at start-up) and faster: 8 rows share each weight read (see benchmarks/). The TypeScript
/// pipeline defaulted to 1 because its batching was slower than serial; `1` still forces
/// serial.
pub const DEFAULT_BATCH_WIDTH: usize = 8;

/// Parses `$MLX_BUN_MEMORY_BATCH`: a positive integer, else [`DEFAULT_BATCH_WIDTH`].
pub fn batch_width_from_env(value: Option<&str>) -> usize {
    value
        .and_then(positive_width)
        .unwrap_or(DEFAULT_BATCH_WIDTH)
}

fn positive_width(value: &str) -> Option<usize> {
    value.trim().parse::<usize>().ok().filter(|&n| n >= 1)
}

impl Config {
    /// Parses and validates a configuration document.
    pub fn from_json(text: &str) -> Result<Config> {
        let config: Config = serde_json::from_str(text).map_err(|e| Error::InvalidJson {
            what: "config",
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// A configuration with every default, for `model_dir`.
    pub fn for_model(model_dir: impl Into<PathBuf>) -> Config {
        Config {
            model_dir: model_dir.into(),
            adapters: BTreeMap::new(),
            stages: BTreeMap::new(),
            batch_width: default_batch_width(),
            device: DeviceChoice::Default,
            weights: WeightChoice::Auto,
            decode_attention: None,
            row_kernel: None,
            limits: Limits::default(),
            speculate: None,
        }
    }

    /// Checks what serde cannot: cross references and ranges.
    pub fn validate(&self) -> Result<()> {
        if self.model_dir.as_os_str().is_empty() {
            return Err(Error::InvalidConfig("`model_dir` is empty".into()));
        }
        if self.batch_width == 0 {
            return Err(Error::InvalidConfig(
                "`batch_width` must be at least 1".into(),
            ));
        }
        let l = &self.limits;
        if l.max_batch == 0 || l.max_tokens_cap == 0 || l.default_max_tokens == 0 {
            return Err(Error::InvalidConfig(
                "`limits.max_batch`, `limits.max_tokens_cap` and `limits.default_max_tokens` must be at least 1".into(),
            ));
        }
        if l.default_max_tokens > l.max_tokens_cap {
            return Err(Error::InvalidConfig(format!(
                "`limits.default_max_tokens` ({}) exceeds `limits.max_tokens_cap` ({})",
                l.default_max_tokens, l.max_tokens_cap
            )));
        }
        if l.max_prompt_tokens == Some(0) {
            return Err(Error::InvalidConfig(
                "`limits.max_prompt_tokens` must be at least 1".into(),
            ));
        }
        if let Some(s) = &self.speculate {
            s.options().map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidConfig(format!(
                    "`speculate` (max_drafts {}, ngram {}): {m}",
                    s.max_drafts, s.ngram
                )),
                e => e,
            })?;
        }
        for (stage, spec) in &self.stages {
            if let Some(adapter) = &spec.adapter {
                if !self.adapters.contains_key(adapter) {
                    return Err(Error::InvalidConfig(format!(
                        "stage `{stage}` uses adapter `{adapter}`, which is not declared in `adapters`"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The adapter name a stage runs with, if any; unknown stages run on the base model.
    pub fn adapter_for(&self, stage: &str) -> Option<&str> {
        self.stages.get(stage).and_then(|s| s.adapter.as_deref())
    }
}

/// The stage registry a configuration gives: the built-in defaults, with each configured
/// `system` laid on top (a stage configured only with an adapter keeps its default system).
pub fn stage_registry(stages: &BTreeMap<String, StageSpec>) -> Result<crate::prompt::StageConfig> {
    let overrides: BTreeMap<&str, serde_json::Value> = stages
        .iter()
        .filter_map(|(name, spec)| {
            spec.system
                .as_ref()
                .map(|s| (name.as_str(), serde_json::json!({ "system": s })))
        })
        .collect();
    let json = serde_json::to_string(&overrides).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(crate::prompt::StageConfig::builtin().merged(crate::prompt::StageConfig::from_json(&json)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_document_gets_defaults() {
        let c = Config::from_json(r#"{"model_dir": "/m"}"#).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.device, DeviceChoice::Default);
        assert_eq!(c.weights, WeightChoice::Auto);
        assert!(c.adapters.is_empty());
    }

    #[test]
    fn weights_and_kv_budget_parse() {
        let c = Config::from_json(
            r#"{"model_dir": "/m", "weights": "dense", "limits": {"max_kv_bytes": 1048576}}"#,
        )
        .unwrap();
        assert_eq!(c.weights, WeightChoice::Dense);
        assert_eq!(c.limits.max_kv_bytes, Some(1 << 20));
        assert!(Config::from_json(r#"{"model_dir": "/m", "weights": "int3"}"#).is_err());
    }

    #[test]
    fn row_kernel_parses() {
        let c = |doc: &str| Config::from_json(doc).map(|c| c.row_kernel);
        assert_eq!(c(r#"{"model_dir": "/m"}"#).unwrap(), None);
        for (v, want) in [
            ("off", RowKernel::Off),
            ("large", RowKernel::Large),
            ("all", RowKernel::All),
        ] {
            let doc = format!(r#"{{"model_dir": "/m", "row_kernel": "{v}"}}"#);
            assert_eq!(c(&doc).unwrap(), Some(want));
        }
        assert!(c(r#"{"model_dir": "/m", "row_kernel": "on"}"#).is_err());
    }

    #[test]
    fn decode_attention_parses() {
        let c = |doc: &str| Config::from_json(doc).map(|c| c.decode_attention);
        assert_eq!(c(r#"{"model_dir": "/m"}"#).unwrap(), None);
        assert_eq!(
            c(r#"{"model_dir": "/m", "decode_attention": "kernel"}"#).unwrap(),
            Some(DecodeAttention::Kernel)
        );
        assert_eq!(
            c(r#"{"model_dir": "/m", "decode_attention": "mlx"}"#).unwrap(),
            Some(DecodeAttention::Mlx)
        );
        assert!(c(r#"{"model_dir": "/m", "decode_attention": "fast"}"#).is_err());
    }

    #[test]
    fn speculate_parses_at_any_batch_width_and_checks_its_counts() {
        for width in [1, 8] {
            let c = Config::from_json(&format!(
                r#"{{"model_dir": "/m", "batch_width": {width}, "speculate": {{"max_drafts": 2}}}}"#
            ))
            .unwrap();
            assert_eq!(
                c.speculate,
                Some(Speculate {
                    max_drafts: 2,
                    ngram: 3
                })
            );
        }
        for doc in [
            r#"{"model_dir": "/m", "batch_width": 1, "speculate": {"max_drafts": 0}}"#,
            r#"{"model_dir": "/m", "batch_width": 1, "speculate": {"max_drafts": 99}}"#,
            r#"{"model_dir": "/m", "batch_width": 1, "speculate": {"max_drafts": 2, "ngram": 0}}"#,
        ] {
            let e = Config::from_json(doc).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{doc}: {e}");
        }
        let e = Config::from_json(r#"{"model_dir": "/m", "speculate": {"drafts": 2}}"#);
        assert!(matches!(e, Err(Error::InvalidJson { .. })), "{e:?}");
    }

    #[test]
    fn unknown_keys_are_errors_at_every_level() {
        for doc in [
            r#"{"model_dir": "/m", "modeldir": 1}"#,
            r#"{"model_dir": "/m", "limits": {"max_batchh": 1}}"#,
            r#"{"model_dir": "/m", "stages": {"chunk": {"sytem": "x"}}}"#,
        ] {
            let e = Config::from_json(doc).unwrap_err();
            assert!(matches!(e, Error::InvalidJson { .. }), "{doc}: {e}");
            assert!(e.to_string().contains("unknown field"), "{e}");
        }
    }

    #[test]
    fn undeclared_adapter_is_named() {
        let e = Config::from_json(
            r#"{"model_dir": "/m", "stages": {"chunk": {"adapter": "memory-chunk"}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("memory-chunk"), "{e}");
    }

    #[test]
    fn bad_values_are_errors() {
        for doc in [
            r#"{"model_dir": ""}"#,
            r#"{"model_dir": "/m", "batch_width": 0}"#,
            r#"{"model_dir": "/m", "device": "tpu"}"#,
            r#"{"model_dir": "/m", "limits": {"default_max_tokens": 10, "max_tokens_cap": 5}}"#,
            r#"{}"#,
            r#"[1]"#,
        ] {
            assert!(Config::from_json(doc).is_err(), "{doc}");
        }
    }

    #[test]
    fn stage_registry_keeps_defaults_unless_a_system_is_given() {
        let c = Config::from_json(
            r#"{"model_dir": "/m", "adapters": {"a": "/a"},
                "stages": {"route": {"adapter": "a"}, "entity": {"system": ""}, "chunk": {"system": "S"}}}"#,
        )
        .unwrap();
        let reg = stage_registry(&c.stages).unwrap();
        assert_eq!(
            reg.default_system("route"),
            Some("You answer only 'yes' or 'no'.")
        );
        assert_eq!(reg.default_system("entity"), Some(""));
        assert_eq!(reg.default_system("chunk"), Some("S"));
        assert_eq!(reg.default_system("nope"), None);
    }

    #[test]
    fn batch_env_parsing() {
        assert_eq!(batch_width_from_env(None), DEFAULT_BATCH_WIDTH);
        assert_eq!(batch_width_from_env(Some("1")), 1);
        assert_eq!(batch_width_from_env(Some("4")), 4);
        assert_eq!(batch_width_from_env(Some(" 3 ")), 3);
        assert_eq!(batch_width_from_env(Some("0")), DEFAULT_BATCH_WIDTH);
        assert_eq!(batch_width_from_env(Some("x")), DEFAULT_BATCH_WIDTH);
    }
}
