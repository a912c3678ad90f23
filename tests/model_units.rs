//! Small contracts of the model layer: greedy tie rule, config parsing and its defaults.
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use memexec::generate::argmax_rows_in;
use memexec::model::config::{ArchConfig, LayerType, ModelConfig};
use memexec::Error;
use mlx_rs::{Array, Dtype};

/// mx.argmax (what mlx-lm's greedy sampler calls) returns the FIRST maximum:
/// `mx.argmax([[1,5,5,2]], -1) == [1]`, `mx.argmax([[0,3,3],[7,1,7]], -1) == [1, 0]`.
#[test]
fn argmax_ties_go_to_the_lowest_id() {
    let a = Array::from_slice(&[1.0f32, 5.0, 5.0, 2.0], &[1, 4]);
    assert_eq!(argmax_rows_in(&a, Dtype::Float32).unwrap(), vec![1]);
    let b = Array::from_slice(&[0.0f32, 3.0, 3.0, 7.0, 1.0, 7.0], &[2, 3]);
    assert_eq!(argmax_rows_in(&b, Dtype::Float32).unwrap(), vec![1, 0]);
}

/// In a bf16 model the pick happens in bf16, where 1.0 and 1.001 are the same value
/// (mlx-lm: `argmax(x - logsumexp(x))` on bf16 `[1.0, 1.001, 0.5]` gives 0).
#[test]
fn argmax_runs_in_the_model_dtype() {
    let a = Array::from_slice(&[1.0f32, 1.001, 0.5], &[1, 3]);
    assert_eq!(argmax_rows_in(&a, Dtype::Float32).unwrap(), vec![1]);
    assert_eq!(argmax_rows_in(&a, Dtype::Bfloat16).unwrap(), vec![0]);
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn dir_with(config: &serde_json::Value, generation: Option<&serde_json::Value>) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("memexec-model-units-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    if let Some(g) = generation {
        std::fs::write(d.join("generation_config.json"), g.to_string()).unwrap();
    }
    d
}

fn load(
    config: serde_json::Value,
    generation: Option<serde_json::Value>,
) -> memexec::Result<ModelConfig> {
    let d = dir_with(&config, generation.as_ref());
    let r = ModelConfig::load(&d);
    let _ = std::fs::remove_dir_all(&d);
    r
}

#[test]
fn gemma4_wrapper_vocab_and_defaults() {
    // mlx-lm's gemma4 wrapper overrides text_config.vocab_size with the top-level one
    // (default 262144) and defaults the head counts to 8 / 1.
    let c = load(
        serde_json::json!({
            "model_type": "gemma4",
            "vocab_size": 1000,
            "eos_token_id": 1,
            "text_config": {"vocab_size": 5, "num_hidden_layers": 12, "num_kv_shared_layers": 2},
        }),
        Some(serde_json::json!({"eos_token_id": [1, 106]})),
    )
    .unwrap();
    let ArchConfig::Gemma4(g) = &c.arch else {
        panic!("not gemma4")
    };
    assert_eq!(g.vocab_size, 1000);
    assert_eq!((g.num_attention_heads, g.num_key_value_heads), (8, 1));
    // sliding_window_pattern 5 when layer_types is absent: full = 4, 9.
    assert_eq!(g.layer_types[4], LayerType::Full);
    assert_eq!(g.layer_types[3], LayerType::Sliding);
    assert_eq!(g.rope_full.rope_type, "proportional");
    assert_eq!(g.final_logit_softcapping, Some(30.0));
    assert_eq!(c.eos_token_ids, vec![1, 106], "generation_config.json wins");
}

#[test]
fn quantization_overrides() {
    let c = load(
        serde_json::json!({
            "model_type": "gemma3_text",
            "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                              "model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 8},
                              "model.layers.1.mlp.up_proj": false},
        }),
        None,
    )
    .unwrap();
    let d = c.quant.for_module("model.layers.2.mlp.up_proj").unwrap();
    assert_eq!((d.group_size, d.bits), (64, 4));
    let o = c.quant.for_module("model.layers.0.mlp.up_proj").unwrap();
    assert_eq!((o.group_size, o.bits), (32, 8));
    assert!(c.quant.for_module("model.layers.1.mlp.up_proj").is_none());
}

#[test]
fn config_errors() {
    let e = load(
        serde_json::json!({"model_type": "gemma4", "text_config": {"enable_moe_block": true}}),
        None,
    );
    assert!(matches!(e, Err(Error::Config { .. })));
    let e = load(
        serde_json::json!({"model_type": "gemma3_text", "quantization": {"bits": 4, "mode": "mxfp4"}}),
        None,
    );
    assert!(matches!(e, Err(Error::Config { .. })));
    let e = load(serde_json::json!({"no_model_type": 1}), None);
    assert!(matches!(e, Err(Error::Config { .. })));
    let e = load(
        serde_json::json!({"model_type": "gemma4_text", "num_hidden_layers": 4, "num_kv_shared_layers": 4}),
        None,
    );
    assert!(matches!(e, Err(Error::Config { .. })));
}

/// The engine thread owns the model and the caches: both must move between threads.
#[test]
fn model_and_caches_are_send() {
    fn send<T: Send>() {}
    send::<memexec::model::Model>();
    send::<memexec::model::RowCache>();
}
