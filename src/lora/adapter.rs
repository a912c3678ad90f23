//! Reading an adapter directory: its config (the scale rule) and its raw tensors. Nothing is
//! checked against a model here; see [`super::validate`].
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Weight files, in the order they are looked for (mlx-lm's, then peft's name).
pub const WEIGHT_FILES: [&str; 2] = ["adapters.safetensors", "adapter_model.safetensors"];
/// Config files, in the order they are looked for (mlx-lm's, then the fine-tuner's own).
pub const CONFIG_FILES: [&str; 2] = ["adapter_config.json", "optiq_lora_config.json"];

/// What the per-module rank divides the configured scale by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankDivisor {
    /// mlx-lm's `scale`: used as is.
    One,
    /// rsLoRA (`rs_lora` / `use_rslora`): `scale / sqrt(rank)`.
    SqrtRank,
    /// peft's `lora_alpha` without rsLoRA: `alpha / rank`.
    Rank,
}

/// The scale rule of an adapter; the rank comes from each pair's shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraScale {
    /// `scale` (mlx-lm) or `lora_alpha` (peft).
    pub base: f64,
    /// How the rank enters.
    pub divisor: RankDivisor,
}

impl LoraScale {
    /// The factor applied to `(x @ A) @ B` for a pair of rank `rank`.
    pub fn for_rank(&self, rank: i32) -> f32 {
        let r = f64::from(rank);
        let s = match self.divisor {
            RankDivisor::One => self.base,
            RankDivisor::SqrtRank => self.base / r.sqrt(),
            RankDivisor::Rank => self.base / r,
        };
        s as f32
    }
}

/// An adapter directory as read from disk.
pub struct AdapterFiles {
    /// The directory.
    pub dir: PathBuf,
    /// The safetensors file the tensors came from.
    pub weights_file: PathBuf,
    /// The config file the scale came from.
    pub config_file: PathBuf,
    /// The scale rule.
    pub scale: LoraScale,
    /// Every tensor of the weights file, by name (lazy: read when first evaluated).
    pub tensors: HashMap<String, Array>,
}

fn adapter_err(dir: &Path, message: impl Into<String>) -> Error {
    Error::Adapter {
        dir: dir.to_path_buf(),
        message: message.into(),
    }
}

fn first_existing(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

impl AdapterFiles {
    /// Reads `dir`: the first of [`CONFIG_FILES`] and of [`WEIGHT_FILES`] that exists.
    pub fn read(dir: &Path) -> Result<AdapterFiles> {
        if !dir.is_dir() {
            return Err(Error::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "adapter directory not found",
                ),
            });
        }
        let config_file = first_existing(dir, &CONFIG_FILES).ok_or_else(|| {
            adapter_err(dir, format!("no config file (looked for {CONFIG_FILES:?})"))
        })?;
        let weights_file = first_existing(dir, &WEIGHT_FILES).ok_or_else(|| {
            adapter_err(
                dir,
                format!("no weights file (looked for {WEIGHT_FILES:?})"),
            )
        })?;
        let text = std::fs::read_to_string(&config_file).map_err(|source| Error::Io {
            path: config_file.clone(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
            path: config_file.clone(),
            reason: e.to_string(),
        })?;
        let scale = parse_scale(&json).map_err(|reason| Error::InvalidFile {
            path: config_file.clone(),
            reason,
        })?;
        let tensors = Array::load_safetensors(&weights_file).map_err(|e| Error::InvalidFile {
            path: weights_file.clone(),
            reason: e.to_string(),
        })?;
        Ok(AdapterFiles {
            dir: dir.to_path_buf(),
            weights_file,
            config_file,
            scale,
            tensors,
        })
    }
}

fn number(obj: &Map<String, Value>, key: &str) -> std::result::Result<Option<f64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(format!("{key} must be a finite number, got {v}")),
        },
    }
}

fn flag(obj: &Map<String, Value>, keys: &[&str]) -> std::result::Result<bool, String> {
    for key in keys {
        match obj.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => return Ok(*b),
            Some(v) => return Err(format!("{key} must be true or false, got {v}")),
        }
    }
    Ok(false)
}

/// The scale rule of a config: mlx-lm's `lora_parameters.scale` (or a top-level `scale`),
/// else peft's `lora_alpha`; `rs_lora` / `use_rslora` (in either object) divides by
/// `sqrt(rank)`. DoRA and full fine-tunes are refused: they are not LoRA pairs.
pub fn parse_scale(json: &Value) -> std::result::Result<LoraScale, String> {
    let top = json
        .as_object()
        .ok_or_else(|| "the config must be a JSON object".to_string())?;
    match top.get("fine_tune_type").and_then(Value::as_str) {
        None | Some("lora") => {}
        Some(other) => {
            return Err(format!(
                "fine_tune_type {other:?} is not supported (only \"lora\")"
            ))
        }
    }
    if flag(top, &["use_dora"])? {
        return Err("use_dora: DoRA adapters are not supported".into());
    }
    let params = match top.get("lora_parameters") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => return Err(format!("lora_parameters must be an object, got {v}")),
    };
    let rs = flag(top, &["rs_lora", "use_rslora"])?
        || match params {
            Some(p) => flag(p, &["rs_lora", "use_rslora"])?,
            None => false,
        };
    let scale = match params {
        Some(p) => number(p, "scale")?,
        None => None,
    };
    let scale = match scale {
        Some(s) => Some(s),
        None => number(top, "scale")?,
    };
    if let Some(base) = scale {
        let divisor = if rs {
            RankDivisor::SqrtRank
        } else {
            RankDivisor::One
        };
        return Ok(LoraScale { base, divisor });
    }
    if let Some(alpha) = number(top, "lora_alpha")? {
        let non_empty = |k: &str| {
            top.get(k)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
        };
        if non_empty("rank_pattern") || non_empty("alpha_pattern") {
            return Err("rank_pattern / alpha_pattern are not supported".into());
        }
        let divisor = if rs {
            RankDivisor::SqrtRank
        } else {
            RankDivisor::Rank
        };
        return Ok(LoraScale {
            base: alpha,
            divisor,
        });
    }
    Err(
        "no LoRA scale: expected lora_parameters.scale (mlx-lm), scale, or lora_alpha (peft)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mlx_lm_scale() {
        let s = parse_scale(&json!({"lora_parameters": {"rank": 8, "scale": 20.0}})).unwrap();
        assert_eq!(s.for_rank(8), 20.0);
        let s =
            parse_scale(&json!({"lora_parameters": {"rank": 16, "scale": 8.0, "rs_lora": true}}))
                .unwrap();
        assert_eq!(s.for_rank(16), 2.0);
        let s = parse_scale(&json!({"scale": 3.0, "use_rslora": true})).unwrap();
        assert_eq!(s.for_rank(9), 1.0);
    }

    #[test]
    fn peft_alpha() {
        let s = parse_scale(&json!({"r": 8, "lora_alpha": 16})).unwrap();
        assert_eq!(s.for_rank(8), 2.0);
        let s = parse_scale(&json!({"r": 4, "lora_alpha": 16, "use_rslora": true})).unwrap();
        assert_eq!(s.for_rank(4), 8.0);
    }

    #[test]
    fn refused_configs() {
        for (cfg, needle) in [
            (json!({"lora_parameters": {"rank": 8}}), "no LoRA scale"),
            (
                json!({"fine_tune_type": "dora", "lora_parameters": {"scale": 1}}),
                "dora",
            ),
            (json!({"fine_tune_type": "full"}), "full"),
            (json!({"lora_parameters": {"scale": "x"}}), "finite number"),
            (
                json!({"lora_parameters": {"scale": 1, "rs_lora": 1}}),
                "true or false",
            ),
            (json!([1]), "JSON object"),
        ] {
            let e = parse_scale(&cfg).unwrap_err();
            assert!(e.contains(needle), "{cfg}: {e}");
        }
    }
}
