//! Training parity (SPEC §1): for chunk-like training rows, the inference prompt ids of
//! `{system, user}` equal the fine-tuning prompt region, and both equal what Python
//! (jinja2 + tokenizers, scripts/fixtures/prompt_oracle.py) computes.
mod prompt_common;

use memexec::prompt::{
    ChatTemplate, LocalInput, Prompter, StageConfig, Tokenizer, TokenizerConfig,
};
use std::sync::OnceLock;

use prompt_common::*;

struct Row {
    system: String,
    user: String,
    messages: Vec<memexec::prompt::Message>,
    oracle: serde_json::Value,
}

fn prompter_and_rows(name: &str) -> (&'static Prompter, Vec<Row>) {
    // One prompter per tokenizer for the whole binary: loading a tokenizer takes seconds.
    static G3: OnceLock<Prompter> = OnceLock::new();
    static G4: OnceLock<Prompter> = OnceLock::new();
    static G4E: OnceLock<Prompter> = OnceLock::new();
    let cell = match name {
        "gemma3" => &G3,
        "gemma4" => &G4,
        _ => &G4E,
    };
    let all = oracle("sft.json");
    let data = &all[name];
    let template = ChatTemplate::new(
        data["source"].as_str().unwrap(),
        data["bos_token"].as_str().map(String::from),
        data["eos_token"].as_str().map(String::from),
    )
    .unwrap();
    let prompter = cell.get_or_init(|| {
        let tok_name = if name == "gemma3" { "gemma3" } else { "gemma4" };
        let dir = tokenizer_dir(tok_name);
        let config = TokenizerConfig::from_file(&dir.join("tokenizer_config.json")).unwrap();
        let tok = Tokenizer::from_dir(&dir, &config).unwrap();
        Prompter::new(tok, template, StageConfig::builtin())
    });
    let rows = data["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let messages = messages(&r["messages"]);
            Row {
                system: messages[0].content.clone(),
                user: messages[1].content.clone(),
                messages,
                oracle: r.clone(),
            }
        })
        .collect();
    (prompter, rows)
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Rust and Python agree on every piece, for every template.
fn check_against_python(name: &str) {
    let (prompter, rows) = prompter_and_rows(name);
    for (i, row) in rows.iter().enumerate() {
        assert!(
            row.system.contains('—') && row.system.contains('\n'),
            "row {i} system"
        );
        let region = prompter.sft_prompt_region(&row.messages).unwrap();
        assert_eq!(
            region.full_ids,
            ids(&row.oracle["full_ids"]),
            "{name} row {i} full"
        );
        assert_eq!(
            region.prompt_ids,
            ids(&row.oracle["prompt_ids"]),
            "{name} row {i} prompt"
        );
        assert_eq!(
            region.region,
            ids(&row.oracle["region"]),
            "{name} row {i} region"
        );
        let input = LocalInput::with_system(row.system.clone(), row.user.clone());
        let prompt = prompter.prompt("chunk", &input).unwrap();
        assert_eq!(
            prompt.text,
            row.oracle["prompt_text"].as_str().unwrap(),
            "{name} row {i}"
        );
        assert_eq!(
            prompt.ids,
            ids(&row.oracle["inference_ids"]),
            "{name} row {i} inference"
        );
    }
    eprintln!("{name}: {} rows agree with Python", rows.len());
}

/// The SPEC parity: `prompt_ids("chunk", {system, user})` == the SFT prompt region.
fn check_parity(name: &str, system_turn: &str) {
    let (prompter, rows) = prompter_and_rows(name);
    let bos = prompter.tokenizer().bos().unwrap().text.clone();
    for (i, row) in rows.iter().enumerate() {
        let region = prompter.sft_prompt_region(&row.messages).unwrap().region;
        let input = LocalInput::with_system(row.system.clone(), row.user.clone());
        let prompt = prompter.prompt("chunk", &input).unwrap();
        assert_eq!(
            prompt.ids, region,
            "{name} row {i}: prompt ids != SFT region"
        );
        let head = format!("{bos}{system_turn}{}", row.system.trim());
        assert!(
            prompt.text.starts_with(&head),
            "{name} row {i}: no leading system turn"
        );
    }
}

#[test]
fn gemma3_rows_agree_with_python() {
    check_against_python("gemma3");
}

#[test]
fn gemma4_rows_agree_with_python() {
    check_against_python("gemma4");
}

#[test]
fn gemma4_e4b_rows_agree_with_python() {
    check_against_python("gemma4_e4b");
}

#[test]
fn gemma4_e4b_prompt_ids_equal_the_sft_region() {
    check_parity("gemma4_e4b", "<|turn>system\n");
}

/// Google's Gemma-3 template has no system turn: the system prompt opens the first user turn.
#[test]
fn gemma3_prompt_ids_equal_the_sft_region() {
    check_parity("gemma3", "<start_of_turn>user\n");
}

/// A template whose generation prompt appends more than the model-turn opener (here an
/// empty thought channel while `enable_thinking` is undefined) cannot meet the parity: the
/// training row's assistant turn never contains that tail, so the region stops before it.
/// Pin exactly that: the prompt is the region plus the rendered prompt's own tail.
#[test]
fn thought_primer_template_exceeds_the_region_by_its_generation_tail() {
    let (prompter, rows) = prompter_and_rows("gemma4");
    for (i, row) in rows.iter().enumerate() {
        let region = prompter.sft_prompt_region(&row.messages).unwrap().region;
        let input = LocalInput::with_system(row.system.clone(), row.user.clone());
        let prompt = prompter.prompt("chunk", &input).unwrap();
        assert!(
            prompt.ids.starts_with(&region) && prompt.ids.len() > region.len(),
            "row {i}"
        );
        let tail = prompter
            .tokenizer()
            .decode_with_special(&prompt.ids[region.len()..])
            .unwrap();
        assert!(prompt.text.ends_with(&tail), "row {i}: tail {tail:?}");
        assert!(
            !row.oracle["full_text"].as_str().unwrap().contains(&tail),
            "row {i}"
        );
    }
}
