//! Stage rules of SPEC §1: default systems, unknown stages, explicit and empty overrides.
mod prompt_common;

use memexec::prompt::{LocalInput, Message, Prompter, RenderOptions, StageConfig};
use prompt_common::*;

#[test]
fn route_default_system_is_exact() {
    let stages = StageConfig::builtin();
    assert_eq!(
        stages.default_system("route"),
        Some("You answer only 'yes' or 'no'.")
    );
    let msgs = stages.messages("route", &LocalInput::user("Is it?"));
    assert_eq!(
        msgs,
        vec![
            Message::new("system", "You answer only 'yes' or 'no'."),
            Message::new("user", "Is it?")
        ]
    );
}

#[test]
fn stages_with_and_without_defaults() {
    let stages = StageConfig::builtin();
    for stage in ["entity", "route", "section", "synthesis", "editor"] {
        let msgs = stages.messages(stage, &LocalInput::user("u"));
        assert_eq!(msgs.len(), 2, "{stage}");
        assert_eq!(msgs[0].role, "system");
    }
    for stage in ["chunk", "no-such-stage", ""] {
        let msgs = stages.messages(stage, &LocalInput::user("u"));
        assert_eq!(msgs, vec![Message::new("user", "u")], "{stage:?}");
    }
}

#[test]
fn explicit_system_overrides_and_empty_system_means_none() {
    let stages = StageConfig::builtin();
    let msgs = stages.messages("route", &LocalInput::with_system("Be brief.", "u"));
    assert_eq!(msgs[0], Message::new("system", "Be brief."));
    let msgs = stages.messages("unknown", &LocalInput::with_system("S", "u"));
    assert_eq!(msgs[0], Message::new("system", "S"));
    let msgs = stages.messages("route", &LocalInput::with_system("", "u"));
    assert_eq!(msgs, vec![Message::new("user", "u")]);
}

#[test]
fn configuration_overrides_and_rejects_unknown_keys() {
    let cfg = StageConfig::from_json(
        r#"{"route": {"system": "Say y or n."}, "chunk": {"system": "C"}, "entity": {}}"#,
    )
    .unwrap();
    let stages = StageConfig::builtin().merged(cfg);
    assert_eq!(stages.default_system("route"), Some("Say y or n."));
    assert_eq!(stages.default_system("chunk"), Some("C"));
    assert_eq!(stages.default_system("entity"), None);
    assert!(stages.default_system("editor").is_some());
    assert!(StageConfig::from_json(r#"{"route": {"sytem": "typo"}}"#).is_err());
    assert!(StageConfig::from_json(r#"["route"]"#).is_err());
    let input: LocalInput = serde_json::from_str(r#"{"user": "u"}"#).unwrap();
    assert_eq!(input, LocalInput::user("u"));
    assert!(serde_json::from_str::<LocalInput>(r#"{"user": "u", "extra": 1}"#).is_err());
}

/// Through the real template: an unknown stage renders exactly the user-only conversation,
/// and route renders its default system turn.
#[test]
fn prompts_render_the_stage_messages() {
    let prompter = Prompter::from_dir(&tokenizer_dir("gemma4")).unwrap();
    let opts = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: None,
    };
    let user_only = prompter
        .template()
        .render(&[Message::new("user", "hello")], &opts)
        .unwrap();
    let p = prompter
        .prompt("mystery", &LocalInput::user("hello"))
        .unwrap();
    assert_eq!(p.text, user_only);
    assert_eq!(p.ids, prompter.tokenizer().encode(&user_only).unwrap());
    let p = prompter
        .prompt("route", &LocalInput::user("hello"))
        .unwrap();
    assert!(p.text.contains("You answer only 'yes' or 'no'."));
    assert_eq!(p.ids.iter().filter(|&&i| i == 2).count(), 1, "one BOS");
}

/// A template that writes `<bos>` while the text already starts with one yields two BOS
/// ids; one is dropped.
#[test]
fn doubled_bos_is_reduced_to_one() {
    let (config, _) = gemma4();
    let tok = memexec::prompt::Tokenizer::from_dir(&tokenizer_dir("gemma4"), config).unwrap();
    let template = memexec::prompt::ChatTemplate::new(
        "{{ bos_token }}{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
        config.bos_token.clone(),
        config.eos_token.clone(),
    )
    .unwrap();
    let bos = tok.bos().unwrap().id;
    let prompter = Prompter::new(tok, template, StageConfig::builtin());
    let p = prompter.prompt("chunk", &LocalInput::user("hi")).unwrap();
    assert_eq!(
        prompter.tokenizer().encode(&p.text).unwrap()[..2],
        [bos, bos]
    );
    assert_eq!(p.ids[0], bos);
    assert_ne!(p.ids[1], bos);
}
