//! A benchmark, not a test: time to render + encode a ~4000-token prompt.
//! Run: cargo test --release --test prompt_bench -- --ignored --nocapture
mod prompt_common;

use std::time::Instant;

use memexec::prompt::{LocalInput, Prompter};
use prompt_common::*;

#[test]
#[ignore = "benchmark; run with --ignored --nocapture"]
fn render_and_encode_a_4000_token_prompt() {
    let t0 = Instant::now();
    let prompter = Prompter::from_dir(&tokenizer_dir("gemma4")).unwrap();
    let load = t0.elapsed();
    let data = oracle("sft.json");
    let row = &data["gemma4_e4b"]["rows"][0]["messages"];
    let system = row[0]["content"].as_str().unwrap().to_string();
    let mut user = String::new();
    while prompter.tokenizer().encode(&user).unwrap().len() < 4000 {
        user.push_str(row[1]["content"].as_str().unwrap());
        user.push('\n');
    }
    let input = LocalInput::with_system(system, user);
    let n = 20;
    let mut len = 0;
    let t = Instant::now();
    for _ in 0..n {
        len = prompter.prompt_ids("chunk", &input).unwrap().len();
    }
    let per = t.elapsed() / n;
    eprintln!("load {load:?}; render+encode of a {len}-token prompt: {per:?} per call ({n} calls)");
}
