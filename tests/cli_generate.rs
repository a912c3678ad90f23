//! `memexec generate` through the batched decoder (`--decoder`: one row alone, the path a
//! batched engine takes for a lone call) gives the serial loop's ids, plainly and verifying
//! drafts (`--speculate` with `--drafts-from` the serial ids: every draft right).
mod model_support;

use std::process::Command;

use model_support::model_dir;
use serde_json::Value;

/// `memexec generate --json` on the tiny fixture with `extra` arguments.
fn generate(extra: &[&str]) -> Value {
    let prompt: Vec<String> = (0..45u32)
        .map(|t| (2 + (t * 131 + t * t) % 4000).to_string())
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_memexec"))
        .args(["generate", "--json", "--ignore-eos", "--max-tokens", "40"])
        .arg("--model")
        .arg(model_dir("tiny-gemma4-q4-f32"))
        .arg("--prompt-ids")
        .arg(prompt.join(","))
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("run memexec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "memexec generate {extra:?}: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn the_decoder_gives_the_serial_ids_plainly_and_with_drafts() {
    let serial = generate(&[]);
    let ids = serial["ids"].as_array().expect("ids").clone();
    assert_eq!(ids.len(), 40, "{serial}");
    let plain = generate(&["--decoder"]);
    assert_eq!(plain["ids"].as_array(), Some(&ids));
    let drafts: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
    let speculative = generate(&[
        "--decoder",
        "--speculate",
        "4",
        "--drafts-from",
        &drafts.join(","),
    ]);
    assert_eq!(speculative["ids"].as_array(), Some(&ids));
    let s = &speculative["speculation"];
    let (drafted, accepted) = (s["drafted"].as_u64(), s["accepted"].as_u64());
    assert!(drafted.is_some_and(|d| d > 0), "{s}");
    assert_eq!(drafted, accepted, "{s}");
    // 40 tokens in steps of up to 5: far fewer steps than tokens.
    assert!(s["steps"].as_u64().is_some_and(|n| n * 2 <= 40), "{s}");
}

#[test]
fn a_kv_budget_too_small_for_a_draft_row_keeps_the_ids_and_drafts_nothing() {
    let serial = generate(&[]);
    let ids = serial["ids"].as_array().expect("ids").clone();
    let drafts: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
    let drafts = drafts.join(",");
    // The serial loop and the decoder's lone row; one byte holds the row itself (a lone row is
    // always admitted) but no slot for a draft row.
    for path in [&[][..], &["--decoder"][..]] {
        let mut args = path.to_vec();
        args.extend(["--speculate", "4", "--drafts-from", &drafts]);
        let unbounded = generate(&args);
        let s = &unbounded["speculation"];
        assert!(
            s["drafted"].as_u64().is_some_and(|d| d > 0),
            "{path:?}: {s}"
        );
        args.extend(["--max-kv-bytes", "1"]);
        let bounded = generate(&args);
        assert_eq!(bounded["ids"].as_array(), Some(&ids), "{path:?}");
        let s = &bounded["speculation"];
        assert_eq!(s["drafted"].as_u64(), Some(0), "{path:?}: {s}");
    }
}

#[test]
fn a_kv_budget_without_speculation_is_refused_as_a_usage_error() {
    // Without draft rows the budget bounds nothing (a lone row is always admitted); a flag
    // that silently does nothing would read as a measured bound.
    let out = Command::new(env!("CARGO_BIN_EXE_memexec"))
        .args(["generate", "--prompt-ids", "2,3", "--max-kv-bytes", "1"])
        .arg("--model")
        .arg(model_dir("tiny-gemma4-q4-f32"))
        .env_remove("RUST_LOG")
        .output()
        .expect("run memexec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--speculate"), "{stderr}");
}
