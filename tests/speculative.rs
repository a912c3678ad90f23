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

use memexec::engine::batched::Started;
use memexec::engine::scheduler::Limits;
use memexec::engine::speculative::{
    greedy_speculative, Drafts, SpeculateOptions, SpeculationStats, MAX_DRAFTS,
};
use memexec::engine::{Decoder, RowRequest};
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

/// `ids` with every third one replaced by another id of a `vocab`-token vocabulary.
fn every_third_wrong(ids: &[u32], vocab: u32) -> Vec<u32> {
    ids.iter()
        .enumerate()
        .map(|(i, &t)| if i % 3 == 2 { (t + 1) % vocab } else { t })
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
        kv_budget: None,
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
        let spoiled = every_third_wrong(&want.ids, vocab);
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

/// The batched decoder with `spec` over `reqs` at `width`: each row's ids and speculation.
fn batched(
    model: &Model,
    stop: &[u32],
    spec: SpeculateOptions,
    reqs: &[RowRequest],
    width: usize,
) -> Vec<(Vec<u32>, SpeculationStats)> {
    let decoder = Decoder::new(model, stop).with_speculation(Some(spec));
    assert!(decoder.shared_kv(), "speculation runs over the shared KV");
    let limits = Limits {
        width,
        kv_budget: None,
    };
    let out = decoder
        .run_rows(reqs.to_vec(), limits)
        .into_iter()
        .map(|o| {
            let o = o.expect("row");
            (o.ids, o.speculation.expect("speculation counts"))
        })
        .collect();
    assert_eq!(decoder.shared_kv_rows(), Some(0), "every slot freed");
    out
}

#[test]
fn a_lone_row_of_the_batched_decoder_verifies_drafts_with_the_serial_tokens() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let vocab = model.info().vocab_size as u32;
    let prompt = ids(45, 9, 0);
    let want = greedy(&model, &prompt, options(48, None)).expect("serial");
    assert!(want.ids.len() > 8, "the fixture should generate");
    let req = [RowRequest::new(prompt, 48)];
    let spec = |drafts, k| SpeculateOptions::new(drafts, k).expect("options");
    // Right drafts: all accepted, at least two tokens per step.
    let right = Drafts::Continuation(want.ids.clone());
    let [(got, stats)] = <[_; 1]>::try_from(batched(&model, &stop, spec(right, 4), &req, 4))
        .unwrap_or_else(|_| panic!("one row"));
    assert_eq!(got, want.ids, "{stats:?}");
    assert_eq!(stats.accepted, stats.drafted, "{stats:?}");
    assert!(
        stats.drafted > 0 && stats.steps * 2 <= want.ids.len(),
        "{stats:?}"
    );
    // Every third draft wrong: rejections mid-step.
    let spoiled = Drafts::Continuation(every_third_wrong(&want.ids, vocab));
    let [(got, stats)] =
        <[_; 1]>::try_from(batched(&model, &stop, spec(spoiled, MAX_DRAFTS), &req, 4))
            .unwrap_or_else(|_| panic!("one row"));
    assert_eq!(got, want.ids, "{stats:?}");
    assert!(
        stats.accepted > 0 && stats.accepted < stats.drafted,
        "{stats:?}"
    );
    // A stop token inside an accepted run ends the row there.
    let stop_at = want.ids[9];
    let stopped = greedy(
        &model,
        &req[0].prompt,
        GenerateOptions {
            stop_ids: Some(vec![stop_at]),
            ..options(48, None)
        },
    )
    .expect("serial");
    let right = Drafts::Continuation(want.ids.clone());
    let [(got, _)] = <[_; 1]>::try_from(batched(&model, &[stop_at], spec(right, 4), &req, 4))
        .unwrap_or_else(|_| panic!("one row"));
    assert_eq!(got, stopped.ids);
}

#[test]
fn batched_rows_that_come_to_run_alone_verify_drafts_with_the_serial_tokens() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    // Row 0 has the longest budget: it runs alone first (width 1), last (widths 2, 3), or
    // after the others ended. Its continuation is every row's draft source: right for row 0,
    // wrong for the others where they run alone (width 1).
    let reqs: Vec<RowRequest> = [(45usize, 9u32, 48usize), (12, 3, 10), (30, 5, 20)]
        .into_iter()
        .map(|(len, r, max)| RowRequest::new(ids(len, r, 0), max))
        .collect();
    let want: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            greedy(&model, &r.prompt, options(r.max_tokens, None))
                .expect("serial")
                .ids
        })
        .collect();
    let spec = || SpeculateOptions::new(Drafts::Continuation(want[0].clone()), 4).expect("options");
    for width in [1, 2, 3] {
        let got = batched(&model, &stop, spec(), &reqs, width);
        for (i, ((ids, stats), want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(ids, want, "width {width}, row {i}: {stats:?}");
        }
        let row0 = got[0].1;
        eprintln!("width {width}: row 0 {row0:?}");
        assert!(row0.accepted > 0, "width {width}: {row0:?}");
    }
    // A row joins a row that has just verified (no token pending), and the row left alone
    // verifies again from the pending token of their last common step.
    let decoder = Decoder::new(&model, &stop).with_speculation(Some(spec()));
    let mut running = Vec::new();
    let mut got: Vec<Option<(Vec<u32>, SpeculationStats)>> = vec![None; 2];
    for (i, req) in reqs[..2].iter().enumerate() {
        match decoder.start(i, req.clone()) {
            Ok(Started::Running(row)) => running.push(row),
            other => panic!("row {i} should run: {}", other.is_ok()),
        }
        // Row 0 steps alone for three steps before row 1 joins.
        for _ in 0..if i == 0 { 3 } else { 0 } {
            assert!(decoder.step(&mut running).expect("step").is_empty());
        }
    }
    while !running.is_empty() {
        for (i, out) in decoder.step(&mut running).expect("step") {
            got[i] = Some((out.ids, out.speculation.expect("speculation counts")));
        }
    }
    let (ids0, stats0) = got[0].clone().expect("row 0");
    assert_eq!(ids0, want[0], "{stats0:?}");
    assert_eq!(got[1].as_ref().map(|g| &g.0), Some(&want[1]));
    assert_eq!(stats0.accepted, stats0.drafted, "{stats0:?}");
    assert!(stats0.steps_with_drafts >= 2, "{stats0:?}");
    assert_eq!(decoder.shared_kv_rows(), Some(0), "every slot freed");
}

#[test]
fn a_lone_row_of_the_batched_decoder_verifies_drafts_with_its_adapter() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let (registry, adapters) = mount_adapters(&model, &["lora-default"]);
    let stack = AdapterStack::single(adapters[0]);
    let activation =
        Activation::per_row(registry.clone(), vec![stack.clone()]).expect("activation");
    let prompt = ids(36, 5, 0);
    let want = greedy(&model, &prompt, options(40, activation)).expect("serial");
    let base = greedy(&model, &prompt, options(40, None)).expect("serial base");
    assert_ne!(want.ids, base.ids, "the adapter should change the output");
    let spec =
        SpeculateOptions::new(Drafts::Continuation(want.ids.clone()), MAX_DRAFTS).expect("options");
    let decoder = Decoder::new(&model, &stop)
        .with_registry(registry)
        .with_speculation(Some(spec));
    let req = RowRequest {
        adapters: stack,
        ..RowRequest::new(prompt, 40)
    };
    let limits = Limits {
        width: 2,
        kv_budget: None,
    };
    let out = decoder
        .run_rows(vec![req], limits)
        .pop()
        .expect("one row")
        .expect("row");
    let stats = out.speculation.expect("speculation counts");
    assert_eq!(out.ids, want.ids, "{stats:?}");
    assert!(
        stats.drafted > 0 && stats.accepted == stats.drafted,
        "{stats:?}"
    );
}

/// Runs `req` alone through a speculating decoder under `kv_budget`, step by step: its ids,
/// speculation, and the most bytes the shared buffers held after any step.
fn alone_under_budget(
    model: &Model,
    stop: &[u32],
    spec: SpeculateOptions,
    req: &RowRequest,
    kv_budget: Option<u64>,
) -> (Vec<u32>, SpeculationStats, u64) {
    let decoder = Decoder::new(model, stop).with_speculation(Some(spec.within(kv_budget)));
    let mut running = match decoder.start(0, req.clone()) {
        Ok(Started::Running(row)) => vec![row],
        other => panic!("the row should run: {}", other.is_ok()),
    };
    let mut held = 0;
    loop {
        let b = decoder.shared_buffers();
        held = held.max(b.slots as u64 * b.slot_bytes);
        if let Some((_, out)) = decoder.step(&mut running).expect("step").pop() {
            return (out.ids, out.speculation.expect("speculation counts"), held);
        }
    }
}

#[test]
fn a_lone_row_verifies_no_more_drafts_than_the_kv_budget_holds() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let prompt = ids(45, 9, 0);
    let want = greedy(&model, &prompt, options(48, None)).expect("serial");
    let req = RowRequest::new(prompt, 48);
    let spec = || {
        SpeculateOptions::new(Drafts::Continuation(want.ids.clone()), 4)
            .expect("options")
            .adaptive(false)
    };
    let (got, free, held) = alone_under_budget(&model, &stop, spec(), &req, None);
    assert_eq!(got, want.ids, "{free:?}");
    // Unbounded, right drafts come four at a time: five slots of the row's size.
    assert!(free.drafted > 2 * free.steps_with_drafts, "{free:?}");
    let slot = held / 5;
    assert!(slot > 0, "{held}");
    // Room for three slots: two drafts a step at most, and the buffers stay within it.
    let (got, three, held) = alone_under_budget(&model, &stop, spec(), &req, Some(3 * slot));
    assert_eq!(got, want.ids, "{three:?}");
    assert!(three.drafted > 0, "{three:?}");
    assert!(three.drafted <= 2 * three.steps_with_drafts, "{three:?}");
    assert!(held <= 3 * slot, "{held} > {}", 3 * slot);
    // A row over the budget by itself verifies nothing: plain steps, the same ids.
    let (got, none, held) = alone_under_budget(&model, &stop, spec(), &req, Some(slot / 2));
    assert_eq!(got, want.ids, "{none:?}");
    assert_eq!(none.drafted, 0, "{none:?}");
    assert!(held <= slot, "{held}");
    // The serial loop's verification steps are bounded the same way.
    for (budget, most) in [(3 * slot, 2), (slot / 2, 0)] {
        let bounded = spec().within(Some(budget));
        let (g, stats) =
            greedy_speculative(&model, &req.prompt, options(48, None), &bounded).expect("serial");
        assert_eq!(g.ids, want.ids, "{stats:?}");
        assert!(stats.drafted <= most * stats.steps_with_drafts, "{stats:?}");
        assert_eq!(stats.drafted > 0, most > 0, "{stats:?}");
    }
}
