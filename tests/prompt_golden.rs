//! The real Gemma-4 tokenizer/template goldens (tests/data/gemma4-tokenizer-template.json,
//! an independent oracle) reproduced with the Gemma-4-renamed Gemma-3 tokenizer.
mod prompt_common;

use memexec::prompt::{IncrementalDecoder, LocalInput, Prompter, RenderOptions, StageConfig};
use prompt_common::*;

fn goldens() -> serde_json::Value {
    read_json(&data("gemma4-tokenizer-template.json"))
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn special_tokens_match_the_goldens() {
    let g = &goldens()["tokenizer"];
    let (_, tok) = gemma4();
    assert_eq!(
        tok.bos().map(|t| t.id),
        g["bos_token_id"].as_u64().map(|i| i as u32)
    );
    assert_eq!(
        tok.eos().map(|t| t.id),
        g["eos_token_id"].as_u64().map(|i| i as u32)
    );
    // The Gemma-3 file carries one more added token than Gemma-4's 262144 rows
    // (`<image_soft_token>` at 262144); every golden id is below it.
    assert!(tok.vocab_size() as u64 >= g["vocab_size"].as_u64().unwrap());
}

#[test]
fn every_text_case_encodes_and_decodes_exactly() {
    let g = goldens();
    let cases = g["tokenizer"]["cases"].as_array().unwrap();
    let (_, tok) = gemma4();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text).unwrap(), want, "encode {text:?}");
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(
            tok.decode_with_special(&want).unwrap(),
            decoded,
            "decode {text:?}"
        );
        // These texts contain no special-token ids, so skipping specials changes nothing.
        assert_eq!(
            tok.decode(&want).unwrap(),
            decoded,
            "decode (skip special) {text:?}"
        );
    }
    assert!(cases.len() >= 7);
}

#[test]
fn chat_cases_render_and_encode_exactly_with_the_gemma4_style_template() {
    let g = goldens();
    let template = gemma4_template("gemma4_chat_template.jinja");
    let (_, tok) = gemma4();
    let cases = g["chat_template"].as_array().unwrap();
    for case in cases {
        let msgs = messages(&case["messages"]);
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: None,
        };
        let rendered = template.render(&msgs, &opts).unwrap();
        assert_eq!(rendered, case["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&rendered).unwrap(), ids(&case["ids"]));
    }
    assert_eq!(cases.len(), 2);
}

#[test]
fn user_only_chat_case_through_the_prompter() {
    let g = goldens();
    let case = &g["chat_template"][0];
    let msgs = messages(&case["messages"]);
    assert_eq!((msgs.len(), msgs[0].role.as_str()), (1, "user"));
    let (config, _) = gemma4();
    let dir = tokenizer_dir("gemma4");
    let tok = memexec::prompt::Tokenizer::from_dir(&dir, config).unwrap();
    let prompter = Prompter::new(
        tok,
        gemma4_template("gemma4_chat_template.jinja"),
        StageConfig::builtin(),
    );
    let got = prompter
        .prompt_ids("chunk", &LocalInput::user(msgs[0].content.clone()))
        .unwrap();
    assert_eq!(got, ids(&case["ids"]));
}

/// The e4b checkpoint's template ends the prompt at the model turn (no thought primer);
/// tests/data/gemma4_e4b_chat_template.jinja must reproduce its golden prompt ids.
#[test]
fn e4b_prompt_ids_reproduce_with_the_primer_free_template() {
    let g = goldens();
    let want = ids(&g["e4b_greedy"]["prompt_ids"]);
    let (_, tok) = gemma4();
    let text = tok.decode_with_special(&want).unwrap();
    assert_eq!(tok.encode(&text).unwrap(), want, "decode/encode round trip");
    let user = text
        .split_once("<|turn>user\n")
        .and_then(|(_, rest)| rest.split_once("<turn|>"))
        .map(|(u, _)| u.to_string())
        .unwrap();
    let template = gemma4_template("gemma4_e4b_chat_template.jinja");
    let rendered = template
        .render(
            &[memexec::prompt::Message::new("user", user)],
            &RenderOptions {
                add_generation_prompt: true,
                enable_thinking: None,
            },
        )
        .unwrap();
    assert_eq!(tok.encode(&rendered).unwrap(), want);
}

#[test]
fn incremental_decoding_matches_full_decoding() {
    let g = goldens();
    let (_, tok) = gemma4();
    let mut seqs: Vec<Vec<u32>> = g["tokenizer"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["ids"]))
        .collect();
    seqs.extend(
        g["chat_template"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| ids(&c["ids"])),
    );
    seqs.push(ids(&g["e4b_greedy"]["greedy_ids"]));
    // Byte-fallback ids of a 4-byte emoji, split across pushes.
    let fallback = tok.encode("a 🦀 b 𝔘𝔫𝔦 ✓").unwrap();
    let first_byte = tok.token_to_id("<0xF0>").unwrap();
    assert!(
        fallback.contains(&first_byte),
        "expected byte-fallback ids: {fallback:?}"
    );
    seqs.push(fallback);
    for seq in seqs {
        let full = tok.decode(&seq).unwrap();
        let mut dec = IncrementalDecoder::new(tok);
        let mut out = String::new();
        for &id in &seq {
            let piece = dec.push(id).unwrap();
            if !full.contains('\u{FFFD}') {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "partial character emitted for {seq:?}"
                );
            }
            out.push_str(&piece);
        }
        out.push_str(&dec.finish().unwrap());
        assert_eq!(out, full, "ids {seq:?}");
    }
}

#[test]
fn the_fixture_model_dir_loads_with_the_same_template() {
    let dir = tokenizer_dir("gemma4");
    let prompter = Prompter::from_dir(&dir).unwrap();
    let committed = std::fs::read_to_string(data("gemma4_chat_template.jinja")).unwrap();
    assert_eq!(prompter.template().source(), committed);
}
