//! `config.json` parsing for the supported architectures.
//!
//! Defaults are mlx-lm's (`ModelArgs` of `gemma4_text.py` / `gemma3_text.py`), not Hugging
//! Face's: mlx-lm is the oracle, and the two disagree on several fields.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Everything `Model::load` needs from a model directory's JSON files.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// The architecture and its hyper-parameters.
    pub arch: ArchConfig,
    /// The `model_type` at the top of `config.json`.
    pub model_type: String,
    /// Default and per-module quantization parameters.
    pub quant: QuantConfig,
    /// Token ids that end a generation (`generation_config.json` wins over `config.json`).
    pub eos_token_ids: Vec<u32>,
}

/// The supported text architectures.
#[derive(Debug, Clone)]
pub enum ArchConfig {
    /// Gemma-4 text (`gemma4` wrapper or bare `gemma4_text`).
    Gemma4(Gemma4Config),
    /// Gemma-3 text (`gemma3` wrapper or bare `gemma3_text`).
    Gemma3(Gemma3Config),
}

impl ArchConfig {
    /// The vocabulary size (rows of the embedding and of the output head).
    pub fn vocab_size(&self) -> i32 {
        match self {
            ArchConfig::Gemma4(c) => c.vocab_size,
            ArchConfig::Gemma3(c) => c.vocab_size,
        }
    }

    /// The number of decoder layers.
    pub fn num_layers(&self) -> usize {
        match self {
            ArchConfig::Gemma4(c) => c.num_hidden_layers,
            ArchConfig::Gemma3(c) => c.num_hidden_layers,
        }
    }

    /// The longest context the model was trained for.
    pub fn max_position_embeddings(&self) -> usize {
        match self {
            ArchConfig::Gemma4(c) => c.max_position_embeddings,
            ArchConfig::Gemma3(c) => c.max_position_embeddings,
        }
    }
}

/// The attention kind of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Attends to the last `sliding_window` positions (rotating cache).
    Sliding,
    /// Attends to every previous position (growing cache).
    Full,
}

/// RoPE parameters of one layer type (`rope_parameters[layer_type]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    /// `rope_type`: "default", "linear" or "proportional".
    pub rope_type: String,
    /// `rope_theta`.
    pub theta: f32,
    /// `partial_rotary_factor` (proportional RoPE only).
    pub partial_rotary_factor: f32,
    /// `factor` (linear: positions are divided by it; proportional: frequencies scaled).
    pub factor: f32,
}

/// Gemma-4 text hyper-parameters (`text_config` of the `gemma4` wrapper).
#[derive(Debug, Clone)]
#[allow(missing_docs)] // field names are the config.json keys
pub struct Gemma4Config {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub global_head_dim: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub vocab_size_per_layer_input: i32,
    pub num_key_value_heads: i32,
    pub num_kv_shared_layers: usize,
    pub hidden_size_per_layer_input: i32,
    pub rope_traditional: bool,
    pub sliding_window: i32,
    pub max_position_embeddings: usize,
    pub final_logit_softcapping: Option<f32>,
    pub use_double_wide_mlp: bool,
    pub tie_word_embeddings: bool,
    pub layer_types: Vec<LayerType>,
    pub rope_sliding: RopeParams,
    pub rope_full: RopeParams,
}

impl Gemma4Config {
    /// The first layer that reuses an earlier layer's keys and values.
    pub fn first_kv_shared_layer(&self) -> usize {
        self.num_hidden_layers - self.num_kv_shared_layers
    }
}

/// Gemma-3 text hyper-parameters.
#[derive(Debug, Clone)]
#[allow(missing_docs)] // field names are the config.json keys
pub struct Gemma3Config {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub head_dim: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub rope_theta: f32,
    pub rope_local_base_freq: f32,
    pub query_pre_attn_scalar: f32,
    pub sliding_window: i32,
    pub sliding_window_pattern: usize,
    pub max_position_embeddings: usize,
    /// `rope_scaling` of the global layers (None or `{"rope_type": "linear", "factor": f}`).
    pub rope_global: RopeParams,
}

impl Gemma3Config {
    /// Global (full-attention) layers are every `sliding_window_pattern`-th one.
    pub fn layer_type(&self, i: usize) -> LayerType {
        if i % self.sliding_window_pattern == self.sliding_window_pattern - 1 {
            LayerType::Full
        } else {
            LayerType::Sliding
        }
    }
}

/// Affine quantization parameters of one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    /// Elements sharing one scale and bias.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
}

/// The `quantization` block of `config.json`.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    /// The default parameters (absent for an unquantized checkpoint).
    pub default: Option<QuantParams>,
    /// Per-module overrides keyed by module path; `None` = left unquantized (`false`).
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl QuantConfig {
    /// The configured parameters of `module`, if the config states any.
    pub fn for_module(&self, module: &str) -> Option<QuantParams> {
        match self.overrides.get(module) {
            Some(p) => *p,
            None => self.default,
        }
    }
}

/// A JSON object with the file it came from, for error messages naming file and key.
struct Fields<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
    scope: &'a str,
}

impl<'a> Fields<'a> {
    fn err(&self, message: String) -> Error {
        Error::Config {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn key_name(&self, key: &str) -> String {
        if self.scope.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.scope)
        }
    }

    /// `key` parsed as `T`, or `default` when absent. An explicit `null` is an error.
    fn get<T: DeserializeOwned>(&self, key: &str, default: T) -> Result<T> {
        match self.obj.get(key) {
            None => Ok(default),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| self.err(format!("field {}: {e}", self.key_name(key)))),
        }
    }

    /// `key` parsed as `T`, `None` when absent or `null`, `default` only when absent.
    fn get_opt<T: DeserializeOwned>(&self, key: &str, default: Option<T>) -> Result<Option<T>> {
        match self.obj.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| self.err(format!("field {}: {e}", self.key_name(key)))),
        }
    }

    fn positive(&self, key: &str, default: i64) -> Result<i32> {
        let v: i64 = self.get(key, default)?;
        if v <= 0 || v > i32::MAX as i64 {
            return Err(self.err(format!(
                "field {}: must be positive, got {v}",
                self.key_name(key)
            )));
        }
        Ok(v as i32)
    }

    fn non_negative(&self, key: &str, default: i64) -> Result<usize> {
        let v: i64 = self.get(key, default)?;
        if v < 0 || v > i32::MAX as i64 {
            return Err(self.err(format!(
                "field {}: must be >= 0, got {v}",
                self.key_name(key)
            )));
        }
        Ok(v as usize)
    }
}

fn read_json(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::Config {
            path: path.to_path_buf(),
            message: "expected a JSON object".into(),
        }),
        Err(e) => Err(Error::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

fn token_ids(v: &Value) -> Option<Vec<u32>> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(|x| vec![x]),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect(),
        _ => None,
    }
}

impl ModelConfig {
    /// Reads `config.json` (and `generation_config.json` when present) from `dir`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let path: PathBuf = dir.join("config.json");
        let top = read_json(&path)?;
        let f = Fields {
            path: &path,
            obj: &top,
            scope: "",
        };
        let model_type: String = match top.get("model_type") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(f.err("missing string field model_type".into())),
        };
        let arch = match model_type.as_str() {
            "gemma4" | "gemma3" => {
                let text = match top.get("text_config") {
                    Some(Value::Object(m)) => m.clone(),
                    None | Some(Value::Null) => Map::new(),
                    Some(_) => return Err(f.err("field text_config: expected an object".into())),
                };
                let tf = Fields {
                    path: &path,
                    obj: &text,
                    scope: "text_config",
                };
                if model_type == "gemma4" {
                    // mlx-lm's wrapper copies the top-level vocab_size (default 262144) over
                    // text_config's; the head counts default differently from the text model.
                    let vocab = f.positive("vocab_size", 262144)?;
                    ArchConfig::Gemma4(gemma4(&tf, Some(vocab), 8, 1)?)
                } else {
                    let vocab = f.positive("vocab_size", 262208)?;
                    ArchConfig::Gemma3(gemma3(&tf, Some(vocab), 8, 4)?)
                }
            }
            "gemma4_text" => ArchConfig::Gemma4(gemma4(&f, None, 8, 1)?),
            "gemma3_text" => ArchConfig::Gemma3(gemma3(&f, None, 4, 1)?),
            other => {
                return Err(Error::UnsupportedModel {
                    path,
                    model_type: other.to_string(),
                })
            }
        };

        let quant = match top.get("quantization") {
            None | Some(Value::Null) => QuantConfig::default(),
            Some(Value::Object(q)) => quant_config(&path, q)?,
            Some(_) => return Err(f.err("field quantization: expected an object".into())),
        };

        let mut eos = top
            .get("eos_token_id")
            .or_else(|| top.get("text_config").and_then(|t| t.get("eos_token_id")))
            .and_then(token_ids);
        let gen_path = dir.join("generation_config.json");
        if gen_path.exists() {
            // mlx-lm lets generation_config.json's eos_token_id win (and ignores a bad file).
            if let Ok(g) = read_json(&gen_path) {
                if let Some(ids) = g.get("eos_token_id").and_then(token_ids) {
                    if !ids.is_empty() {
                        eos = Some(ids);
                    }
                }
            }
        }
        Ok(ModelConfig {
            arch,
            model_type,
            quant,
            eos_token_ids: eos.unwrap_or_default(),
        })
    }
}

fn rope_params(
    f: &Fields,
    v: Option<&Value>,
    default_type: &str,
    default_theta: f32,
    default_prf: f32,
) -> Result<RopeParams> {
    let empty = Map::new();
    let obj = match v {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(f.err("rope parameters: expected an object".into())),
    };
    let rf = Fields {
        path: f.path,
        obj,
        scope: "rope_parameters",
    };
    // mlx-lm: `scaling_config.get("type") or scaling_config.get("rope_type", "default")`.
    let rope_type = match rf.get_opt::<String>("type", None)? {
        Some(t) if !t.is_empty() => t,
        _ => rf.get("rope_type", default_type.to_string())?,
    };
    if !matches!(rope_type.as_str(), "default" | "linear" | "proportional") {
        return Err(f.err(format!("unsupported rope_type {rope_type:?}")));
    }
    Ok(RopeParams {
        rope_type,
        theta: rf.get("rope_theta", default_theta)?,
        partial_rotary_factor: rf.get("partial_rotary_factor", default_prf)?,
        factor: rf.get("factor", 1.0)?,
    })
}

fn layer_types(f: &Fields, n: usize, pattern: usize) -> Result<Vec<LayerType>> {
    match f.get_opt::<Vec<String>>("layer_types", None)? {
        Some(names) => {
            if names.len() < n {
                return Err(f.err(format!("layer_types has {} entries, need {n}", names.len())));
            }
            names[..n]
                .iter()
                .map(|s| match s.as_str() {
                    "sliding_attention" => Ok(LayerType::Sliding),
                    "full_attention" => Ok(LayerType::Full),
                    other => Err(f.err(format!("unknown layer type {other:?}"))),
                })
                .collect()
        }
        None => {
            if pattern == 0 {
                return Err(f.err("sliding_window_pattern must be positive".into()));
            }
            Ok((0..n)
                .map(|i| {
                    if i % pattern == pattern - 1 {
                        LayerType::Full
                    } else {
                        LayerType::Sliding
                    }
                })
                .collect())
        }
    }
}

fn gemma4(
    f: &Fields,
    vocab_override: Option<i32>,
    heads: i64,
    kv_heads: i64,
) -> Result<Gemma4Config> {
    if f.get("enable_moe_block", false)? {
        return Err(f.err("enable_moe_block (mixture-of-experts Gemma-4) is not supported".into()));
    }
    if f.get("attention_k_eq_v", false)? {
        return Err(f.err("attention_k_eq_v is not supported".into()));
    }
    let n = f.non_negative("num_hidden_layers", 35)?;
    let shared = f.non_negative("num_kv_shared_layers", 20)?;
    if n == 0 || shared >= n {
        return Err(f.err(format!(
            "num_kv_shared_layers {shared} must be < num_hidden_layers {n}"
        )));
    }
    let pattern = f.non_negative("sliding_window_pattern", 5)?;
    let layer_types = layer_types(f, n, pattern)?;
    let rp = f.obj.get("rope_parameters");
    let (rope_sliding, rope_full) = match rp {
        None | Some(Value::Null) => (
            RopeParams {
                rope_type: "default".into(),
                theta: 10000.0,
                partial_rotary_factor: 1.0,
                factor: 1.0,
            },
            RopeParams {
                rope_type: "proportional".into(),
                theta: 1e6,
                partial_rotary_factor: 0.25,
                factor: 1.0,
            },
        ),
        Some(Value::Object(m)) => (
            rope_params(f, m.get("sliding_attention"), "default", 10000.0, 1.0)?,
            rope_params(f, m.get("full_attention"), "default", 10000.0, 1.0)?,
        ),
        Some(_) => return Err(f.err("field rope_parameters: expected an object".into())),
    };
    let cfg = Gemma4Config {
        hidden_size: f.positive("hidden_size", 1536)?,
        num_hidden_layers: n,
        intermediate_size: f.positive("intermediate_size", 6144)?,
        num_attention_heads: f.positive("num_attention_heads", heads)?,
        head_dim: f.positive("head_dim", 256)?,
        global_head_dim: match f.get_opt::<i64>("global_head_dim", Some(512))? {
            // mlx-lm falls back to head_dim when global_head_dim is null / 0.
            Some(d) if d > 0 => d as i32,
            _ => f.positive("head_dim", 256)?,
        },
        rms_norm_eps: f.get("rms_norm_eps", 1e-6)?,
        vocab_size: match vocab_override {
            Some(v) => v,
            None => f.positive("vocab_size", 262144)?,
        },
        vocab_size_per_layer_input: f.positive("vocab_size_per_layer_input", 262144)?,
        num_key_value_heads: f.positive("num_key_value_heads", kv_heads)?,
        num_kv_shared_layers: shared,
        hidden_size_per_layer_input: f
            .get_opt::<i32>("hidden_size_per_layer_input", Some(256))?
            .unwrap_or(0),
        rope_traditional: f.get("rope_traditional", false)?,
        sliding_window: f.positive("sliding_window", 512)?,
        max_position_embeddings: f.non_negative("max_position_embeddings", 131072)?,
        final_logit_softcapping: f.get_opt("final_logit_softcapping", Some(30.0))?,
        use_double_wide_mlp: f.get("use_double_wide_mlp", true)?,
        tie_word_embeddings: f.get("tie_word_embeddings", true)?,
        layer_types,
        rope_sliding,
        rope_full,
    };
    let first_shared = cfg.first_kv_shared_layer();
    for (i, t) in cfg.layer_types.iter().enumerate().skip(first_shared) {
        if !cfg.layer_types[..first_shared].contains(t) {
            return Err(f.err(format!(
                "KV-shared layer {i} has no earlier non-shared layer of its type"
            )));
        }
    }
    if cfg.num_attention_heads % cfg.num_key_value_heads != 0 {
        return Err(f.err("num_attention_heads must be a multiple of num_key_value_heads".into()));
    }
    Ok(cfg)
}

fn gemma3(
    f: &Fields,
    vocab_override: Option<i32>,
    heads: i64,
    kv_heads: i64,
) -> Result<Gemma3Config> {
    let rope_global = match f.obj.get("rope_scaling") {
        None | Some(Value::Null) => RopeParams {
            rope_type: "default".into(),
            theta: 0.0,
            partial_rotary_factor: 1.0,
            factor: 1.0,
        },
        v => rope_params(f, v, "default", 0.0, 1.0)?,
    };
    if rope_global.rope_type == "proportional" {
        return Err(f.err("rope_scaling: proportional RoPE is not supported on Gemma-3".into()));
    }
    let mut cfg = Gemma3Config {
        hidden_size: f.positive("hidden_size", 1152)?,
        num_hidden_layers: f.non_negative("num_hidden_layers", 26)?,
        intermediate_size: f.positive("intermediate_size", 6912)?,
        num_attention_heads: f.positive("num_attention_heads", heads)?,
        head_dim: f.positive("head_dim", 256)?,
        rms_norm_eps: f.get("rms_norm_eps", 1e-6)?,
        vocab_size: match vocab_override {
            Some(v) => v,
            None => f.positive("vocab_size", 262144)?,
        },
        num_key_value_heads: f.positive("num_key_value_heads", kv_heads)?,
        rope_theta: f.get("rope_theta", 1e6)?,
        rope_local_base_freq: f.get("rope_local_base_freq", 1e4)?,
        query_pre_attn_scalar: f.get("query_pre_attn_scalar", 256.0)?,
        sliding_window: f.positive("sliding_window", 512)?,
        sliding_window_pattern: f.non_negative("sliding_window_pattern", 6)?,
        max_position_embeddings: f.non_negative("max_position_embeddings", 32768)?,
        rope_global,
    };
    cfg.rope_global.theta = cfg.rope_theta;
    if cfg.num_hidden_layers == 0 || cfg.sliding_window_pattern == 0 {
        return Err(f.err("num_hidden_layers and sliding_window_pattern must be positive".into()));
    }
    if cfg.num_attention_heads % cfg.num_key_value_heads != 0 {
        return Err(f.err("num_attention_heads must be a multiple of num_key_value_heads".into()));
    }
    Ok(cfg)
}

fn quant_params(
    path: &Path,
    key: &str,
    q: &Map<String, Value>,
    default: Option<QuantParams>,
) -> Result<QuantParams> {
    let f = Fields {
        path,
        obj: q,
        scope: key,
    };
    let mode: String = f.get("mode", "affine".to_string())?;
    if mode != "affine" {
        return Err(f.err(format!(
            "quantization mode {mode:?} is not supported (only affine)"
        )));
    }
    let gs = f.positive("group_size", default.map_or(64, |d| d.group_size as i64))?;
    let bits = f.positive("bits", default.map_or(4, |d| d.bits as i64))?;
    if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) {
        return Err(f.err(format!("unsupported quantization bits {bits}")));
    }
    Ok(QuantParams {
        group_size: gs,
        bits,
    })
}

fn quant_config(path: &Path, q: &Map<String, Value>) -> Result<QuantConfig> {
    let default = quant_params(path, "quantization", q, None)?;
    let mut overrides = BTreeMap::new();
    for (k, v) in q {
        match v {
            Value::Object(m) => {
                overrides.insert(k.clone(), Some(quant_params(path, k, m, Some(default))?));
            }
            Value::Bool(false) => {
                overrides.insert(k.clone(), None);
            }
            _ => {} // group_size / bits / mode, or `true` (= the default)
        }
    }
    Ok(QuantConfig {
        default: Some(default),
        overrides,
    })
}
