//! Opt-in: the real Gemma-4 e4b checkpoint (`MEMEXEC_E4B_DIR`, e.g. a local copy of
//! mlx-community/gemma-4-e4b-it-OptiQ-4bit) must reproduce the 24 greedy tokens recorded on
//! Apple silicon (tests/data/gemma4-tokenizer-template.json, `e4b_greedy`). Not available on
//! the CI machines; bf16 numerics on the CPU backend may drift from Metal late in the run.
use std::path::PathBuf;

use memexec::generate::{greedy, GenerateOptions};
use memexec::model::Model;

#[test]
#[ignore = "needs the real e4b checkpoint: MEMEXEC_E4B_DIR=/path cargo test --test model_e4b -- --ignored"]
fn e4b_greedy_matches_the_apple_silicon_golden() {
    let dir = PathBuf::from(
        std::env::var_os("MEMEXEC_E4B_DIR")
            .expect("set MEMEXEC_E4B_DIR to the e4b model directory"),
    );
    let golden_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma4-tokenizer-template.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden_path).expect("golden file"))
            .expect("golden JSON");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let prompt = ids(&golden["e4b_greedy"]["prompt_ids"]);
    let want = ids(&golden["e4b_greedy"]["greedy_ids"]);

    let model = Model::load(&dir).expect("load e4b");
    let opts = GenerateOptions {
        max_tokens: want.len(),
        stop_ids: Some(vec![]),
        ..Default::default()
    };
    let g = greedy(&model, &prompt, opts).expect("greedy");
    let agree = g.ids.iter().zip(&want).take_while(|(a, b)| a == b).count();
    println!(
        "e4b: {agree}/{} greedy ids agree with the Apple-silicon golden",
        want.len()
    );
    assert!(agree >= 8, "first tokens differ: {:?} vs {:?}", g.ids, want);
}
