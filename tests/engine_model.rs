//! The engine on the tiny fixture: every answer equals the Rust API's serial greedy text
//! (`Prompter::prompt_ids` + `generate::greedy` + decode, which share nothing with the engine
//! thread), batches keep order, concurrent callers get their serial answers, and the stats add
//! up. Needs .deps/fixtures (scripts/setup.sh).
use std::path::PathBuf;
use std::sync::Arc;

use memexec::config::Config;
use memexec::engine::scheduler::Limits;
use memexec::engine::{
    CallOptions, Completion, Decoder, Engine, LocalInput, ModelBackend, RowRequest,
};
use memexec::generate::{greedy, GenerateOptions};
use memexec::model::{Model, WeightChoice};
use memexec::prompt::Prompter;
use memexec::Error;

fn fixture() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".deps/fixtures/tiny-gemma4-q4-f32");
    assert!(
        dir.join("config.json").is_file(),
        "{} is missing: run scripts/setup.sh",
        dir.display()
    );
    dir
}

fn inputs() -> Vec<(&'static str, LocalInput, usize)> {
    vec![
        ("route", LocalInput::user("Is it raining?"), 5),
        (
            "chunk",
            LocalInput::with_system("Split — JSON.", "a: hi\nb: hello"),
            7,
        ),
        ("entity", LocalInput::user("Grace Hopper in Arlington"), 3),
        ("synthesis", LocalInput::with_system("", "émoji 😀 日本"), 6),
        ("no-such-stage", LocalInput::user("x"), 4),
    ]
}

/// The serial reference through the Rust API.
fn serial_texts(dir: &std::path::Path, stop_ids: &[u32]) -> Vec<String> {
    // The form the engine picks by default (`weights: "auto"`).
    let model = Model::load_with(dir, WeightChoice::Auto).unwrap();
    let prompter = Prompter::from_dir(dir).unwrap();
    inputs()
        .iter()
        .map(|(stage, input, max_tokens)| {
            let ids = prompter.prompt_ids(stage, input).unwrap();
            let opts = GenerateOptions {
                max_tokens: *max_tokens,
                stop_ids: Some(stop_ids.to_vec()),
                ..GenerateOptions::default()
            };
            let g = greedy(&model, &ids, opts).unwrap();
            prompter.tokenizer().decode(&g.ids).unwrap()
        })
        .collect()
}

/// One call with `max_tokens`, unwrapped.
fn call(engine: &Engine, stage: &str, input: LocalInput, max_tokens: usize) -> Completion {
    engine
        .call(
            stage,
            input,
            CallOptions {
                max_tokens: Some(max_tokens),
            },
        )
        .unwrap()
}

#[test]
fn engine_answers_equal_serial_greedy_in_every_mode_of_calling() {
    let dir = fixture();
    let config = Config::for_model(&dir);
    let stop_ids = ModelBackend::load(&config).unwrap().stop_ids().to_vec();
    let want = serial_texts(&dir, &stop_ids);
    let engine = Arc::new(Engine::new(config).unwrap());

    for ((stage, input, max_tokens), want) in inputs().into_iter().zip(&want) {
        let got = call(&engine, stage, input, max_tokens);
        assert_eq!(&got.text, want, "stage {stage}");
        assert!(got.ids.len() <= max_tokens);
    }

    // A batch of one stage keeps order.
    let batch: Vec<LocalInput> = inputs().into_iter().map(|(_, i, _)| i).collect();
    let got = engine
        .batch(
            "entity",
            batch.clone(),
            CallOptions {
                max_tokens: Some(3),
            },
        )
        .unwrap();
    let one_by_one: Vec<String> = batch
        .into_iter()
        .map(|i| call(&engine, "entity", i, 3).text)
        .collect();
    assert_eq!(
        got.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
        one_by_one
    );

    // Concurrent callers each get their serial answer.
    let threads: Vec<_> = inputs()
        .into_iter()
        .zip(want.clone())
        .map(|((stage, input, max_tokens), want)| {
            let e = engine.clone();
            std::thread::spawn(move || {
                assert_eq!(call(&e, stage, input, max_tokens).text, want);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = engine.stats();
    assert_eq!(
        stats.completed as usize,
        2 * inputs().len() + 2 * inputs().len()
    );
    assert!(stats.tokens_in > 0 && stats.tokens_out > 0 && stats.peak_memory_bytes > 0);
}

#[test]
fn prompt_limits_and_load_errors() {
    let dir = fixture();
    let mut config = Config::for_model(&dir);
    config.limits.max_prompt_tokens = Some(8);
    let engine = Engine::new(config).unwrap();
    let err = engine
        .call(
            "route",
            LocalInput::user("a prompt longer than eight tokens, surely"),
            CallOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::PromptTooLong { limit: 8, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("limits.max_prompt_tokens"),
        "{err}"
    );

    let missing = Engine::new(Config::for_model("/nonexistent/memexec-model"))
        .err()
        .unwrap();
    assert!(matches!(missing, Error::Load(_)), "{missing}");
    assert!(
        missing.to_string().contains("/nonexistent/memexec-model"),
        "{missing}"
    );

    let mut with_adapter = Config::for_model(&dir);
    with_adapter
        .adapters
        .insert("memory-chunk".into(), "/nonexistent/adapter".into());
    let bad = Engine::new(with_adapter).err().unwrap();
    assert!(bad.to_string().contains("/nonexistent/adapter"), "{bad}");
}

#[test]
fn a_stage_runs_with_exactly_its_adapter() {
    let dir = fixture();
    let adapter =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".deps/fixtures/adapters/lora-default");
    assert!(
        adapter.is_dir(),
        "{} is missing: run scripts/setup.sh",
        adapter.display()
    );
    let base = Engine::new(Config::for_model(&dir)).unwrap();
    let mut config = Config::for_model(&dir);
    config.adapters.insert("memory-chunk".into(), adapter);
    config.stages.insert(
        "chunk".into(),
        memexec::config::StageSpec {
            adapter: Some("memory-chunk".into()),
            system: None,
        },
    );
    let tuned = Engine::new(config).unwrap();
    let opts = CallOptions {
        max_tokens: Some(8),
    };
    let input = LocalInput::with_system("Split the transcript.", "a: hi\nb: hello there");
    // `chunk` differs from the base model; `route` (no adapter) is the base model exactly.
    let with = tuned.call("chunk", input.clone(), opts).unwrap();
    let without = base.call("chunk", input.clone(), opts).unwrap();
    assert_ne!(with.ids, without.ids, "the adapter changed nothing");
    assert_eq!(
        tuned.call("route", input.clone(), opts).unwrap().ids,
        base.call("route", input, opts).unwrap().ids
    );
}

/// An engine made from `config` answers every input as the default load's serial greedy
/// decoding of `dir` does.
fn assert_answers_as_serial(dir: &std::path::Path, config: Config, stop_ids: &[u32]) {
    let want = serial_texts(dir, stop_ids);
    let engine = Engine::new(config).unwrap();
    for ((stage, input, max_tokens), want) in inputs().into_iter().zip(&want) {
        let opts = CallOptions {
            max_tokens: Some(max_tokens),
        };
        assert_eq!(
            &engine.call(stage, input, opts).unwrap().text,
            want,
            "{stage}"
        );
    }
}

/// `row_kernel: "all"` where MLX has no CUDA (this CPU build): the model keeps MLX's product
/// (the kernel's self-check fails at load) and answers as the default does.
#[test]
fn row_kernel_falls_back_where_mlx_has_no_cuda() {
    let dir = fixture();
    let mut config = Config::for_model(&dir);
    config.row_kernel = Some(memexec::model::quantized_row::RowKernel::All);
    let backend = ModelBackend::load(&config).unwrap();
    assert_eq!(
        backend.model().info().row_kernel,
        memexec::model::quantized_row::RowKernel::Off
    );
    let stop_ids = backend.stop_ids().to_vec();
    drop(backend);
    assert_answers_as_serial(&dir, config, &stop_ids);
}

/// `decode_attention: "kernel"` where MLX has no CUDA (this CPU build): the model loads with
/// MLX's op instead (the kernel's load-time self-check fails) and answers as the default does.
#[test]
fn kernel_decode_attention_falls_back_where_mlx_has_no_cuda() {
    let dir = fixture();
    let mut config = Config::for_model(&dir);
    config.decode_attention = Some(memexec::model::DecodeAttention::Kernel);
    let backend = ModelBackend::load(&config).unwrap();
    assert_eq!(
        backend.model().info().decode_attention,
        memexec::model::DecodeAttention::Mlx
    );
    let stop_ids = backend.stop_ids().to_vec();
    drop(backend);
    assert_answers_as_serial(&dir, config, &stop_ids);
}

#[test]
fn speculative_calls_answer_as_serial_greedy_and_count_their_drafts() {
    let dir = fixture();
    let config = Config::for_model(&dir);
    let stop_ids = ModelBackend::load(&config).unwrap().stop_ids().to_vec();
    let want = serial_texts(&dir, &stop_ids);
    // A longer answer (pipelined stretches; the random fixture's output rarely repeats a
    // token, so drafting itself is covered by tests/speculative.rs).
    let long = LocalInput::user(
        (0..160)
            .map(|i| format!("w{}", i * 7 % 61))
            .collect::<Vec<_>>()
            .join(" "),
    );
    let model = Model::load_with(&dir, WeightChoice::Auto).unwrap();
    let prompter = Prompter::from_dir(&dir).unwrap();
    let opts = GenerateOptions {
        max_tokens: 48,
        stop_ids: Some(stop_ids.clone()),
        ..GenerateOptions::default()
    };
    let ids = prompter.prompt_ids("entity", &long).unwrap();
    let serial = greedy(&model, &ids, opts.clone()).unwrap();
    // Serial engines verify drafts for every call; batched ones for a call running alone.
    for (width, mode) in [
        (1, "serial, speculative k4"),
        (8, "batched, speculative k4 (rows alone)"),
    ] {
        let mut config = config.clone();
        config.batch_width = width;
        // One-token n-grams: the random fixture seldom repeats longer ones.
        config.speculate = Some(memexec::config::Speculate {
            max_drafts: 4,
            ngram: 1,
        });
        config.validate().unwrap();
        let engine = Engine::new(config).unwrap();
        for ((stage, input, max_tokens), want) in inputs().into_iter().zip(&want) {
            let got = call(&engine, stage, input, max_tokens);
            assert_eq!(&got.text, want, "width {width}, stage {stage}");
        }
        let got = call(&engine, "entity", long.clone(), 48);
        assert_eq!(got.ids, serial.ids, "width {width}");
        // Calls at once: the batch's rows step together, and the last ones run alone.
        let batch: Vec<LocalInput> = inputs()
            .into_iter()
            .map(|(_, input, _)| input)
            .chain([long.clone()])
            .collect();
        let got = engine
            .batch(
                "entity",
                batch.clone(),
                CallOptions {
                    max_tokens: Some(24),
                },
            )
            .expect("batch")
            .into_iter()
            .map(|c| c.ids)
            .collect::<Vec<_>>();
        let want_ids: Vec<Vec<u32>> = batch
            .iter()
            .map(|input| {
                let ids = prompter.prompt_ids("entity", input).unwrap();
                let opts = GenerateOptions {
                    max_tokens: 24,
                    ..opts.clone()
                };
                greedy(&model, &ids, opts).unwrap().ids
            })
            .collect();
        assert_eq!(got, want_ids, "width {width}");
        let stats = engine.stats();
        assert_eq!(stats.mode, mode);
        let s = stats.speculation.expect("speculation counts");
        eprintln!("width {width}: {s:?}");
        assert!(s.steps > 0 && s.accepted <= s.drafted, "{s:?}");
        let json = serde_json::to_value(&stats).unwrap();
        assert_eq!(json["speculation"]["steps"], s.steps);
    }
}

/// Queued calls under a KV budget that lets one row run at a time (each waiting call's prompt
/// rendered once, before it is admitted): each answers its serial text, in any order of
/// arrival, and a prompt over the limit fails alone with its own error.
#[test]
fn calls_queued_under_a_tight_kv_budget_answer_alone_and_fail_alone() {
    let dir = fixture();
    let mut config = Config::for_model(&dir);
    config.limits.max_kv_bytes = Some(1);
    config.limits.max_prompt_tokens = Some(120);
    let stop_ids = ModelBackend::load(&config).unwrap().stop_ids().to_vec();
    let want = serial_texts(&dir, &stop_ids);
    let engine = Engine::new(config).unwrap();
    let long = LocalInput::user("a prompt far longer than the limit ".repeat(30));
    let mut tickets = Vec::new();
    for (i, (stage, input, max_tokens)) in inputs().into_iter().enumerate() {
        if i == 2 {
            let opts = CallOptions {
                max_tokens: Some(4),
            };
            tickets.push((None, engine.submit("route", long.clone(), opts).unwrap()));
        }
        let opts = CallOptions {
            max_tokens: Some(max_tokens),
        };
        tickets.push((Some(i), engine.submit(stage, input, opts).unwrap()));
    }
    for (i, ticket) in tickets {
        let got = ticket.wait();
        match i {
            Some(i) => assert_eq!(got.unwrap()[0].text, want[i], "input {i}"),
            None => {
                let err = got.unwrap_err();
                assert!(
                    matches!(err, Error::PromptTooLong { limit: 120, .. }),
                    "{err}"
                );
            }
        }
    }
    assert_eq!(engine.stats().failed, 1);
}

/// A batch call takes the decode steps of `Decoder::run_rows` starting every row before the
/// first step, under the default KV budget and under one that holds every row (the engine's
/// own admission path: before any prefill has measured the KV bytes per position it starts
/// one row, and the rest once that prefill has measured them), and more steps under a budget
/// that holds one row at a time; the same texts each way. Serial mode reports no steps.
#[test]
fn a_batch_call_starts_every_row_its_kv_budget_holds_before_the_first_step() {
    let dir = fixture();
    let (stage, max_tokens) = ("entity", 6);
    let inputs: Vec<LocalInput> = ["Grace Hopper", "Ada Lovelace in London", "Alan Turing", "x"]
        .into_iter()
        .map(LocalInput::user)
        .collect();
    // The reference: the decoder alone, no budget, all four rows admitted at once.
    let want_steps = {
        let backend = ModelBackend::load(&Config::for_model(&dir)).unwrap();
        let reqs: Vec<RowRequest> = inputs
            .iter()
            .map(|i| {
                let ids = backend.prompter().prompt_ids(stage, i).unwrap();
                RowRequest::new(ids, max_tokens)
            })
            .collect();
        let decoder = Decoder::new(backend.model(), backend.stop_ids());
        let limits = Limits {
            width: 4,
            kv_budget: None,
        };
        for row in decoder.run_rows(reqs, limits) {
            row.unwrap();
        }
        decoder.profile().steps as u64
    };
    let run = |width: usize, max_kv_bytes: Option<u64>| {
        let mut config = Config::for_model(&dir);
        config.batch_width = width;
        config.limits.max_kv_bytes = max_kv_bytes;
        let engine = Engine::new(config).unwrap();
        let before = engine.stats().batched_steps;
        let opts = CallOptions {
            max_tokens: Some(max_tokens),
        };
        let got = engine.batch(stage, inputs.clone(), opts).unwrap();
        let texts: Vec<String> = got.into_iter().map(|c| c.text).collect();
        (texts, before, engine.stats().batched_steps)
    };
    let (want, before, none) = run(1, None);
    assert_eq!((before, none), (None, None), "serial mode");
    for budget in [None, Some(1 << 40)] {
        let (texts, before, steps) = run(4, budget);
        assert_eq!(texts, want, "budget {budget:?}");
        assert_eq!(before, Some(0), "budget {budget:?}");
        assert_eq!(steps, Some(want_steps), "budget {budget:?}");
    }
    let (texts, _, steps) = run(4, Some(1));
    assert_eq!(texts, want, "one row at a time");
    assert!(steps.unwrap() > want_steps, "one row at a time: {steps:?}");
}
