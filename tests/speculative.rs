//! Speculative decoding with exact verification (`engine::speculative`) gives exactly the
//! serial greedy tokens (`generate::greedy`, itself checked against mlx-lm in model_parity) on
//! the tiny Gemma-4 f32 fixture, whose 32-token sliding window the prompts and outputs cross:
//! with drafts that are all right (the serial output itself: every draft accepted), partly
//! wrong (rejections mid-step), for part of the output only (the rest pipelined one-row
//! steps), found by prompt lookup (the random fixture seldom repeats
//! itself: a prompt quoting its own output makes it), at every draft count, with an adapter,
//! with a stop token inside an accepted run, and with both forms of the matrices.
//! Needs .deps/fixtures (scripts/setup.sh).
mod model_support;

use memexec::engine::speculative::{
    greedy_speculative, Drafts, SpeculateOptions, SpeculationStats, MAX_DRAFTS,
};
use memexec::generate::{greedy, GenerateOptions, StopReason};
use memexec::lora::{Activation, AdapterStack};
use memexec::model::{Model, WeightChoice};
use model_support::{model_dir, mount_adapters};

const FIXTURE: &str = "tiny-gemma4-q4-f32";

fn model(form: WeightChoice) -> Model {
    Model::load_with(&model_dir(FIXTURE), form).expect("load tiny fixture")
}

/// Deterministic prompt ids of `len` tokens; `period` > 0 repeats a pattern (lookup finds it).
fn ids(len: usize, r: u32, period: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|t| {
            let t = if period > 0 { t % period as u32 } else { t };
            2 + (t * 131 + r * 17 + t * t) % 4000
        })
        .collect()
}

fn options(max_tokens: usize, adapters: Option<Activation>) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        adapters,
        ..GenerateOptions::default()
    }
}

/// The adaptive schedule's run (the default), after checking that the fixed schedule (every
/// step up to `max_drafts` drafts) gives the same ids and stop.
fn speculate(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    drafts: Drafts,
    max_drafts: usize,
) -> (Vec<u32>, StopReason, SpeculationStats) {
    let fixed = speculate_with(
        model,
        prompt,
        opts.clone(),
        drafts.clone(),
        max_drafts,
        false,
    );
    let adaptive = speculate_with(model, prompt, opts, drafts, max_drafts, true);
    assert_eq!(
        (&fixed.0, &fixed.1),
        (&adaptive.0, &adaptive.1),
        "fixed {:?} vs adaptive {:?}",
        fixed.2,
        adaptive.2
    );
    adaptive
}

fn speculate_with(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    drafts: Drafts,
    max_drafts: usize,
    adaptive: bool,
) -> (Vec<u32>, StopReason, SpeculationStats) {
    let spec = SpeculateOptions {
        drafts,
        max_drafts,
        adaptive,
    };
    let (g, stats) = greedy_speculative(model, prompt, opts, &spec).expect("speculative");
    (g.ids, g.stop, stats)
}

#[test]
fn right_drafts_are_all_accepted_and_give_the_serial_tokens() {
    let cases = [
        (WeightChoice::Quantized, 5usize, vec![1, 3, MAX_DRAFTS]),
        (WeightChoice::Quantized, 70, vec![2, MAX_DRAFTS]),
        (WeightChoice::Dense, 30, vec![MAX_DRAFTS]),
    ];
    for (form, len, ks) in cases {
        let model = model(form);
        let prompt = ids(len, len as u32, 0);
        let want = greedy(&model, &prompt, options(48, None)).expect("serial");
        assert!(want.ids.len() > 8, "the fixture should generate");
        for k in ks {
            let (got, stop, stats) = speculate(
                &model,
                &prompt,
                options(48, None),
                Drafts::Continuation(want.ids.clone()),
                k,
            );
            let label = format!("{form:?}, prompt {len}, {k} drafts: {stats:?}");
            assert_eq!(got, want.ids, "{label}");
            assert_eq!(stop, want.stop, "{label}");
            assert_eq!(stats.accepted, stats.drafted, "{label}");
            assert!(stats.steps * 2 <= want.ids.len(), "{label}");
        }
    }
}

#[test]
fn wrong_drafts_are_rejected_and_change_nothing() {
    let model = model(WeightChoice::Quantized);
    let vocab = model.info().vocab_size as u32;
    for (r, len) in [12usize, 40].into_iter().enumerate() {
        let prompt = ids(len, r as u32 + 3, 0);
        let want = greedy(&model, &prompt, options(60, None)).expect("serial");
        // Every third token of the continuation is wrong: steps accept 0-2 drafts.
        let spoiled: Vec<u32> = want
            .ids
            .iter()
            .enumerate()
            .map(|(i, &t)| if i % 3 == 2 { (t + 1) % vocab } else { t })
            .collect();
        for k in [2, MAX_DRAFTS] {
            let (got, _, stats) = speculate(
                &model,
                &prompt,
                options(60, None),
                Drafts::Continuation(spoiled.clone()),
                k,
            );
            assert_eq!(got, want.ids, "prompt {len}, {k} drafts: {stats:?}");
            assert!(
                stats.accepted > 0 && stats.accepted < stats.drafted,
                "{stats:?}"
            );
        }
        // Drafts for the first 20 tokens only: the rest runs as pipelined one-row steps.
        let (got, stop, stats) = speculate(
            &model,
            &prompt,
            options(60, None),
            Drafts::Continuation(spoiled[..20].to_vec()),
            MAX_DRAFTS,
        );
        assert_eq!(
            got, want.ids,
            "prompt {len}, drafts for 20 tokens: {stats:?}"
        );
        assert_eq!(stop, want.stop);
        assert!(stats.steps > stats.steps_with_drafts, "{stats:?}");
    }
}

#[test]
fn drafts_that_always_miss_are_paused_by_the_adaptive_schedule() {
    let model = model(WeightChoice::Quantized);
    let vocab = model.info().vocab_size as u32;
    let prompt = ids(30, 11, 0);
    let want = greedy(&model, &prompt, options(80, None)).expect("serial");
    let wrong: Vec<u32> = want.ids.iter().map(|&t| (t + 1) % vocab).collect();
    let run = |adaptive| {
        speculate_with(
            &model,
            &prompt,
            options(80, None),
            Drafts::Continuation(wrong.clone()),
            MAX_DRAFTS,
            adaptive,
        )
    };
    let (fixed_ids, _, fixed) = run(false);
    let (adaptive_ids, _, adaptive) = run(true);
    assert_eq!(fixed_ids, want.ids, "{fixed:?}");
    assert_eq!(adaptive_ids, want.ids, "{adaptive:?}");
    assert_eq!(fixed.accepted, 0);
    assert_eq!(adaptive.accepted, 0);
    // Fixed: every step verifies MAX_DRAFTS wrong drafts. Adaptive: MAX_DRAFTS once, then one
    // per step, with pauses of 4, 8, 16, 32 plain steps between (80 tokens: 6 drafted steps).
    // (The last step has no budget for drafts.)
    assert_eq!(fixed.steps_with_drafts + 1, fixed.steps, "{fixed:?}");
    assert!(adaptive.steps_with_drafts <= 6, "{adaptive:?}");
    assert!(adaptive.drafted < MAX_DRAFTS + 6, "{adaptive:?}");
    assert_eq!(adaptive.steps, fixed.steps, "one token per step either way");
    // Every step without drafts but the last (no budget left for drafts) ran paused.
    assert_eq!(fixed.paused_steps, 0, "{fixed:?}");
    let plain = adaptive.steps - adaptive.steps_with_drafts;
    assert!(
        adaptive.paused_steps <= plain && adaptive.paused_steps + 1 >= plain,
        "{adaptive:?}"
    );
}

#[test]
fn lookup_drafts_give_the_serial_tokens() {
    let model = model(WeightChoice::Quantized);
    for (r, (len, period)) in [(40usize, 7usize), (64, 0), (90, 20)]
        .into_iter()
        .enumerate()
    {
        let prompt = ids(len, r as u32, period);
        let want = greedy(&model, &prompt, options(64, None)).expect("serial");
        let (got, stop, stats) = speculate(
            &model,
            &prompt,
            options(64, None),
            Drafts::Lookup { ngram: 3 },
            4,
        );
        assert_eq!(got, want.ids, "prompt {len} / period {period}: {stats:?}");
        assert_eq!(stop, want.stop);
        eprintln!("prompt {len} / period {period}: {stats:?}");
    }
    // A prompt that quotes the model's own continuation of its head, then the head and the
    // start of that continuation again: text repeats, so lookup drafts (the random fixture
    // seldom follows a quote, and drafts are looked for only where a no-draft stretch ends).
    let head = ids(24, 0, 0);
    let own = greedy(&model, &head, options(40, None))
        .expect("serial")
        .ids;
    let prompt: Vec<u32> = [&head[..], &own[..], &head[..], &own[..8]].concat();
    let want = greedy(&model, &prompt, options(48, None)).expect("serial");
    let (got, _, stats) = speculate(
        &model,
        &prompt,
        options(48, None),
        Drafts::Lookup { ngram: 3 },
        4,
    );
    eprintln!("quoting prompt: {stats:?}");
    assert_eq!(got, want.ids, "quoting prompt: {stats:?}");
    assert!(
        stats.drafted > 0,
        "lookup should find the quoted text: {stats:?}"
    );
}

#[test]
fn an_adapter_runs_on_every_row_of_a_step() {
    let model = model(WeightChoice::Quantized);
    let (registry, adapters) = mount_adapters(&model, &["lora-default"]);
    let activation = || {
        Activation::per_row(registry.clone(), vec![AdapterStack::single(adapters[0])])
            .expect("activation")
    };
    let prompt = ids(36, 5, 0);
    let want = greedy(&model, &prompt, options(40, activation())).expect("serial");
    let base = greedy(&model, &prompt, options(40, None)).expect("serial base");
    assert_ne!(want.ids, base.ids, "the adapter should change the output");
    let (got, _, stats) = speculate(
        &model,
        &prompt,
        options(40, activation()),
        Drafts::Continuation(want.ids.clone()),
        MAX_DRAFTS,
    );
    assert_eq!(got, want.ids, "{stats:?}");
    assert_eq!(stats.accepted, stats.drafted);
}

#[test]
fn a_stop_token_inside_an_accepted_run_ends_there() {
    let model = model(WeightChoice::Quantized);
    let prompt = ids(20, 8, 0);
    let free = greedy(&model, &prompt, options(40, None)).expect("serial");
    // Stop at the token serial produces 10th (its first occurrence ends the output).
    let stop_at = free.ids[9];
    let opts = || GenerateOptions {
        stop_ids: Some(vec![stop_at]),
        ..options(40, None)
    };
    let want = greedy(&model, &prompt, opts()).expect("serial");
    assert_eq!(want.stop, StopReason::Eos(stop_at));
    let (got, stop, _) = speculate(
        &model,
        &prompt,
        opts(),
        Drafts::Continuation(free.ids.clone()),
        MAX_DRAFTS,
    );
    assert_eq!((got, stop), (want.ids, want.stop));
}
