//! Broken model directories give clear errors (naming the file / tensor at fault), never a
//! panic: each case edits a copy of the tiny fixture in a temporary directory.
mod model_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use memexec::model::Model;
use memexec::Error;
use mlx_rs::Array;
use model_support::model_dir;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh copy of the f32 tiny fixture (config, weights, index, tokenizer).
fn copy_fixture() -> PathBuf {
    let src = model_dir("tiny-gemma4-q4-f32");
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dst = std::env::temp_dir().join(format!("memexec-model-errors-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).expect("tempdir");
    for entry in std::fs::read_dir(&src).expect("read fixture") {
        let p = entry.expect("entry").path();
        if p.is_file() {
            std::fs::copy(&p, dst.join(p.file_name().expect("name"))).expect("copy");
        }
    }
    dst
}

fn edit_weights(dir: &Path, f: impl FnOnce(&mut HashMap<String, Array>)) {
    let file = dir.join("model.safetensors");
    let mut w = Array::load_safetensors(&file).expect("load");
    f(&mut w);
    std::fs::remove_file(&file).expect("rm");
    Array::save_safetensors(w.iter(), None, &file).expect("save");
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(&path, v.to_string()).expect("write");
}

fn load_err(dir: &Path) -> Error {
    let r = Model::load(dir);
    let _ = std::fs::remove_dir_all(dir);
    match r {
        Ok(_) => panic!("loading a broken model directory succeeded"),
        Err(e) => {
            println!("error: {e}");
            e
        }
    }
}

const NORM: &str = "language_model.model.layers.3.input_layernorm.weight";

#[test]
fn the_unbroken_copy_loads() {
    let dir = copy_fixture();
    let m = Model::load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let m = m.expect("load");
    assert_eq!(m.info().vocab_size, 4096);
    assert_eq!(m.info().num_layers, 12);
    assert_eq!(m.info().eos_token_ids, vec![1, 106]);
    assert_eq!(m.info().max_context, 131072);
}

#[test]
fn missing_config_json() {
    let dir = copy_fixture();
    std::fs::remove_file(dir.join("config.json")).expect("rm");
    let e = load_err(&dir);
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn malformed_config_json() {
    let dir = copy_fixture();
    std::fs::write(dir.join("config.json"), "{ not json").expect("write");
    let e = load_err(&dir);
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
}

#[test]
fn unsupported_model_type() {
    let dir = copy_fixture();
    edit_config(&dir, |v| v["model_type"] = "llama".into());
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::UnsupportedModel { model_type, .. } if model_type == "llama"),
        "{e:?}"
    );
}

#[test]
fn bad_config_field_type() {
    let dir = copy_fixture();
    edit_config(&dir, |v| v["text_config"]["hidden_size"] = "wide".into());
    let e = load_err(&dir);
    assert!(e.to_string().contains("text_config.hidden_size"), "{e}");
}

#[test]
fn missing_tensor() {
    let dir = copy_fixture();
    edit_weights(&dir, |w| {
        w.remove(NORM);
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::Tensor { tensor, .. } if tensor == NORM),
        "{e:?}"
    );
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn missing_quantization_scales_part() {
    let dir = copy_fixture();
    let key = "language_model.model.layers.2.mlp.up_proj.biases";
    edit_weights(&dir, |w| {
        w.remove(key);
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::Tensor { tensor, .. } if tensor == key),
        "{e:?}"
    );
}

#[test]
fn wrong_shape() {
    let dir = copy_fixture();
    edit_weights(&dir, |w| {
        w.insert(NORM.to_string(), Array::from_slice(&[1.0f32; 128], &[128]));
    });
    let e = load_err(&dir);
    match &e {
        Error::Tensor {
            tensor,
            file,
            message,
        } => {
            assert_eq!(tensor, NORM);
            assert!(file.ends_with("model.safetensors"), "{file:?}");
            assert!(
                message.contains("[128]") && message.contains("[256]"),
                "{message}"
            );
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn wrong_quantized_shape() {
    let dir = copy_fixture();
    let key = "language_model.model.layers.0.self_attn.q_proj.weight";
    edit_weights(&dir, |w| {
        w.insert(
            key.to_string(),
            Array::from_slice(&[0u32; 512 * 16], &[512, 16]),
        );
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::Tensor { tensor, .. } if tensor == key),
        "{e:?}"
    );
}

#[test]
fn unexpected_tensor() {
    let dir = copy_fixture();
    let key = "language_model.model.layers.0.mlp.extra.weight";
    edit_weights(&dir, |w| {
        w.insert(key.to_string(), Array::from_slice(&[0.0f32; 4], &[4]));
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::Tensor { tensor, .. } if tensor == key),
        "{e:?}"
    );
    assert!(e.to_string().contains("unexpected"), "{e}");
}

#[test]
fn ignored_tensors_are_accepted() {
    // Towers of the multimodal checkpoint and the unused k/v of KV-shared layers are dropped.
    let dir = copy_fixture();
    edit_weights(&dir, |w| {
        w.insert(
            "vision_tower.encoder.weight".into(),
            Array::from_slice(&[0.0f32; 4], &[4]),
        );
        w.insert(
            "audio_tower.x.weight".into(),
            Array::from_slice(&[0.0f32; 4], &[4]),
        );
        w.insert(
            "language_model.model.layers.9.self_attn.k_proj.weight".into(),
            Array::from_slice(&[0.0f32; 4], &[4]),
        );
    });
    let m = Model::load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    m.expect("ignored tensors must not fail the load");
}

#[test]
fn missing_weights_file() {
    let dir = copy_fixture();
    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    let e = load_err(&dir);
    assert!(e.to_string().contains("model.safetensors"), "{e}");
}
