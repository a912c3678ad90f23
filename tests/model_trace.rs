//! `MEMEXEC_TRACE_DIR` (parity debugging): the files `memexec generate` writes, one per
//! one-row forward call, hold every layer's tensors, and the traced logits of the prompt's last
//! position are the mlx-lm oracle's.
mod model_support;

use std::process::Command;

use mlx_rs::Array;
use model_support::{argmax, model_dir, oracle};

#[test]
fn trace_files_hold_every_layer_and_the_oracle_logits() {
    let fixture = "tiny-gemma4-q4-f32";
    let dir = model_dir(fixture);
    let oracle = oracle(fixture);
    // Past the 32-token window, so the traced keys come from the rotating cache.
    let p = oracle
        .prompts
        .iter()
        .filter(|p| p.prompt_ids.len() > 32)
        .min_by_key(|p| p.prompt_ids.len())
        .expect("an oracle prompt past the window");
    let trace = tempfile::tempdir().expect("tempdir");
    let ids: Vec<String> = p.prompt_ids.iter().map(u32::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_memexec"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt-ids", &ids.join(","), "--max-tokens", "2"])
        .args(["--ignore-eos", "--json"])
        .env("MEMEXEC_TRACE_DIR", trace.path())
        .output()
        .expect("run memexec");
    assert!(
        out.status.success(),
        "memexec generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut files: Vec<_> = std::fs::read_dir(trace.path())
        .expect("trace dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    files.sort();
    // prompt[..n-1] in one call, the last prompt token, then one call per further token.
    assert!(files.len() >= 3, "trace files: {files:?}");
    assert_eq!(files[0], "forward-0000.safetensors");

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("config json");
    let text = config.get("text_config").unwrap_or(&config);
    let layers = text["num_hidden_layers"].as_u64().expect("layers") as usize;
    let hidden = text["hidden_size"].as_i64().expect("hidden") as i32;

    let last_prompt_call =
        Array::load_safetensors(trace.path().join(&files[1])).expect("load trace");
    for i in 0..layers {
        for kind in ["h", "k", "v", "q", "o"] {
            assert!(
                last_prompt_call.contains_key(&format!("{kind}.{i}")),
                "{kind}.{i} missing from {}",
                files[1]
            );
        }
    }
    assert_eq!(
        last_prompt_call[&format!("h.{}", layers - 1)].shape(),
        &[1, 1, hidden]
    );
    let logits = last_prompt_call["logits"]
        .as_dtype(mlx_rs::Dtype::Float32)
        .expect("f32");
    logits.eval().expect("eval");
    let ours = logits.as_slice::<f32>();
    let theirs = p.logits.as_ref().expect("tiny oracles carry full logits");
    assert_eq!(ours.len(), theirs.len());
    let d = ours
        .iter()
        .zip(theirs)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 1e-3, "{}: traced logits max |diff| {d}", p.name);
    assert_eq!(argmax(ours), p.argmax, "{}: traced argmax", p.name);
}
