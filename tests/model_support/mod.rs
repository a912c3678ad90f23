//! Shared helpers of the model tests: fixture paths and the mlx-lm oracle files
//! (written by scripts/setup.sh; schema in tests/fixtures/README.md).
#![allow(dead_code)]
use std::path::PathBuf;
use std::rc::Rc;

use memexec::lora::{AdapterId, AdapterRegistry};
use memexec::model::Model;
use serde_json::Value;

/// `.deps/fixtures` (or `$MEMEXEC_FIXTURES`); fails with a setup hint when absent.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("MEMEXEC_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".deps/fixtures"));
    assert!(
        dir.is_dir(),
        "fixtures missing at {}: run scripts/setup.sh",
        dir.display()
    );
    dir
}

/// A fixture model directory.
pub fn model_dir(name: &str) -> PathBuf {
    let d = fixtures_dir().join(name);
    assert!(
        d.join("config.json").is_file(),
        "fixture model {} missing: run scripts/setup.sh",
        d.display()
    );
    d
}

/// A LoRA adapter fixture directory (`.deps/fixtures/adapters/NAME`).
pub fn adapter_dir(name: &str) -> PathBuf {
    let d = fixtures_dir().join("adapters").join(name);
    assert!(
        d.join("adapters.safetensors").is_file(),
        "adapter fixture {} missing: run scripts/setup.sh",
        d.display()
    );
    d
}

/// A registry for `model` with the adapter fixtures `names` mounted, and their ids in order.
pub fn mount_adapters(model: &Model, names: &[&str]) -> (Rc<AdapterRegistry>, Vec<AdapterId>) {
    let mut reg = AdapterRegistry::new(model.linear_modules());
    let ids = names
        .iter()
        .map(|n| reg.mount(&adapter_dir(n)).expect("mount"))
        .collect();
    (Rc::new(reg), ids)
}

/// One prompt of an oracle file.
pub struct OraclePrompt {
    pub name: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub argmax: u32,
    /// The full last-position logits (tiny fixtures only).
    pub logits: Option<Vec<f32>>,
    /// Top-k (id, value) of the last-position logits.
    pub top_k: Vec<(u32, f32)>,
    pub first_eos_index: Option<usize>,
}

pub struct Oracle {
    pub eos_token_ids: Vec<u32>,
    pub prompts: Vec<OraclePrompt>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Decodes standard base64 (the oracle's little-endian f32 vectors).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c) << (18 - 6 * i);
        }
        let n = chunk.len() - 1;
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// Reads `oracle/<name>.json`.
pub fn oracle(name: &str) -> Oracle {
    let path = fixtures_dir().join("oracle").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "oracle {} unreadable ({e}): run scripts/setup.sh",
            path.display()
        )
    });
    let doc: Value = serde_json::from_str(&text).expect("oracle JSON");
    assert_eq!(
        doc["schema"],
        "memexec-oracle/1",
        "unknown oracle schema in {}",
        path.display()
    );
    let prompts = doc["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let ll = &p["last_logits"];
            let logits = ll["f32le_b64"].as_str().map(|s| {
                base64_decode(s)
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            });
            let tk = &ll["top_k"];
            let top_k = ids(&tk["ids"])
                .into_iter()
                .zip(
                    tk["values"]
                        .as_array()
                        .expect("values")
                        .iter()
                        .map(|v| v.as_f64().expect("value") as f32),
                )
                .collect();
            OraclePrompt {
                name: p["name"].as_str().expect("name").to_string(),
                prompt_ids: ids(&p["prompt_ids"]),
                greedy_ids: ids(&p["greedy_ids"]),
                argmax: ll["argmax"].as_u64().expect("argmax") as u32,
                logits,
                top_k,
                first_eos_index: p["first_eos_index"].as_u64().map(|x| x as usize),
            }
        })
        .collect();
    Oracle {
        eos_token_ids: ids(&doc["eos_token_ids"]),
        prompts,
    }
}

/// Index of the first maximum (the oracle's tie rule: lowest id).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The serial greedy ids of `req` (its adapters from `registry`, stopping at the model's eos
/// ids): the reference every batched row must equal.
pub fn serial_ids(
    model: &memexec::model::Model,
    req: &memexec::engine::RowRequest,
    registry: Option<&std::rc::Rc<memexec::lora::AdapterRegistry>>,
) -> Vec<u32> {
    use memexec::generate::{greedy, GenerateOptions};
    let adapters = registry.and_then(|r| {
        memexec::lora::Activation::per_row(r.clone(), vec![req.adapters.clone()])
            .expect("activation")
    });
    let opts = GenerateOptions {
        max_tokens: req.max_tokens,
        stop_ids: Some(model.info().eos_token_ids.clone()),
        adapters,
        ..GenerateOptions::default()
    };
    greedy(model, &req.prompt, opts).expect("serial greedy").ids
}

/// Runs `rows` through `decoder` at each of `widths` and asserts every row's ids equal
/// `want` (its serial ids); `label` names the case in failures.
pub fn assert_batches_equal(
    decoder: &memexec::engine::Decoder<'_>,
    rows: &[memexec::engine::RowRequest],
    want: &[Vec<u32>],
    widths: &[usize],
    label: &str,
) {
    for &width in widths {
        let got = decoder.run_rows(
            rows.to_vec(),
            memexec::engine::scheduler::Limits {
                width,
                kv_budget: None,
            },
        );
        for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
            assert_eq!(&g.expect("row").ids, w, "{label}, width {width}, row {i}");
        }
    }
}
