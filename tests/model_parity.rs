//! Gemma-4 parity with mlx-lm on the tiny fixtures: last-position logits and greedy ids.
mod model_support;

use memexec::generate::{greedy, GenerateOptions, StopReason};
use memexec::model::{ForwardCtx, Model};
use mlx_rs::Array;
use model_support::{argmax, model_dir, oracle};

/// Last-position logits of a whole prompt through a fresh cache (the oracle runs the same
/// forward without a cache; a fresh cache gives the same keys and masks).
fn last_logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let tokens = Array::from_slice(&v, &[1, v.len() as i32]);
    let logits = model
        .forward(&tokens, &mut [&mut cache], &ForwardCtx::default())
        .expect("forward");
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vocab size mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Compares logits on the prompts of at most `max_len` tokens; returns the worst max |diff|.
fn check_logits(fixture: &str, tol: f32, max_len: usize) -> f32 {
    let model = Model::load(&model_dir(fixture)).expect("load");
    let oracle = oracle(fixture);
    let mut worst = 0.0f32;
    for p in oracle
        .prompts
        .iter()
        .filter(|p| p.prompt_ids.len() <= max_len)
    {
        let ours = last_logits(&model, &p.prompt_ids);
        let theirs = p.logits.as_ref().expect("tiny oracles carry full logits");
        let d = max_abs_diff(&ours, theirs);
        println!(
            "{fixture} {} ({} tokens): max |logit diff| = {d:.3e}",
            p.name,
            p.prompt_ids.len()
        );
        assert!(d <= tol, "{fixture} {}: max |diff| {d} > {tol}", p.name);
        assert_eq!(
            argmax(&ours),
            p.argmax,
            "{fixture} {}: argmax differs",
            p.name
        );
        worst = worst.max(d);
    }
    assert!(
        oracle.prompts.iter().any(|p| p.prompt_ids.len() > 32),
        "need a prompt past the window"
    );
    println!(
        "{fixture}: worst max |logit diff| = {worst:.3e} over {} prompts",
        oracle.prompts.len()
    );
    worst
}

/// Greedy ids (eos not applied) must equal the oracle's first `n`, for the prompts of at
/// most `max_len` tokens.
fn check_greedy(fixture: &str, n: usize, max_len: usize) {
    let model = Model::load(&model_dir(fixture)).expect("load");
    let oracle = oracle(fixture);
    for p in oracle
        .prompts
        .iter()
        .filter(|p| p.prompt_ids.len() <= max_len)
    {
        let opts = GenerateOptions {
            max_tokens: n,
            stop_ids: Some(vec![]),
            ..Default::default()
        };
        let g = greedy(&model, &p.prompt_ids, opts).expect("greedy");
        let agree = g
            .ids
            .iter()
            .zip(&p.greedy_ids)
            .take_while(|(a, b)| a == b)
            .count();
        println!("{fixture} {}: {agree}/{n} greedy ids agree", p.name);
        assert_eq!(
            g.ids[..],
            p.greedy_ids[..n],
            "{fixture} {}: greedy ids differ",
            p.name
        );
        assert_eq!(g.stop, StopReason::MaxTokens);
    }
}

#[test]
fn tiny_f32_logits_match_mlx_lm() {
    check_logits("tiny-gemma4-q4-f32", 1e-4, usize::MAX);
}

#[test]
fn tiny_f32_greedy_matches_mlx_lm_for_40_tokens() {
    check_greedy("tiny-gemma4-q4-f32", 40, usize::MAX);
}

/// Stop handling against the oracle sequence: stopping on a token the oracle generates must
/// end at its first occurrence and leave it out.
#[test]
fn tiny_f32_stops_on_stop_ids() {
    let fixture = "tiny-gemma4-q4-f32";
    let model = Model::load(&model_dir(fixture)).expect("load");
    let oracle = oracle(fixture);
    assert_eq!(
        model.info().eos_token_ids,
        oracle.eos_token_ids,
        "eos ids from config"
    );
    let p = &oracle.prompts[0];
    let stop = p.greedy_ids[12];
    let first = p
        .greedy_ids
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let opts = GenerateOptions {
        max_tokens: 40,
        stop_ids: Some(vec![stop]),
        ..Default::default()
    };
    let g = greedy(&model, &p.prompt_ids, opts).expect("greedy");
    assert_eq!(g.ids, p.greedy_ids[..first]);
    assert_eq!(g.stop, StopReason::Eos(stop));
    // And the config's eos set: the oracle records where (if anywhere) it first appears.
    for p in &oracle.prompts {
        let g = greedy(
            &model,
            &p.prompt_ids,
            GenerateOptions {
                max_tokens: 40,
                ..Default::default()
            },
        )
        .expect("greedy");
        match p.first_eos_index {
            Some(i) => assert_eq!(g.ids, p.greedy_ids[..i]),
            None => assert_eq!(g.ids, p.greedy_ids),
        }
    }
}

/// Chunked prefill (chunks smaller than the window, so the ring wraps between chunks) gives
/// the same greedy ids as the oracle's single-chunk prefill.
#[test]
fn tiny_f32_chunked_prefill_matches() {
    let fixture = "tiny-gemma4-q4-f32";
    let model = Model::load(&model_dir(fixture)).expect("load");
    let oracle = oracle(fixture);
    let p = oracle
        .prompts
        .iter()
        .max_by_key(|p| p.prompt_ids.len())
        .expect("prompts");
    let opts = GenerateOptions {
        max_tokens: 16,
        prefill_step: 20,
        stop_ids: Some(vec![]),
        ..Default::default()
    };
    let g = greedy(&model, &p.prompt_ids, opts).expect("greedy");
    assert_eq!(
        g.ids[..],
        p.greedy_ids[..16],
        "{}: chunked prefill diverged",
        p.name
    );
}

/// bf16 activations (~3 significant digits, softcapped logits within ±30): tolerance 0.05
/// (a couple of bf16 ulps at |logit| ~ 8) plus identical argmax, and the first 8 greedy ids.
/// bf16 is ~5x slower on the CPU backend, so only the prompts up to 45 tokens (one of them
/// past the window) run here.
const BF16_TOL: f32 = 0.05;
const BF16_MAX_LEN: usize = 45;

#[test]
fn tiny_bf16_q4_matches_mlx_lm() {
    check_logits("tiny-gemma4-q4", BF16_TOL, BF16_MAX_LEN);
    check_greedy("tiny-gemma4-q4", 8, BF16_MAX_LEN);
}

#[test]
fn tiny_bf16_mixed48_matches_mlx_lm() {
    check_logits("tiny-gemma4-mixed48", BF16_TOL, BF16_MAX_LEN);
    check_greedy("tiny-gemma4-mixed48", 8, BF16_MAX_LEN);
}

/// The unpipelined step-by-step path behind `memexec generate --logprobs-out` gives the
/// oracle's greedy ids, and each id is the argmax of the log-probabilities it returns.
#[test]
fn tiny_f32_step_logprobs_give_the_greedy_ids() {
    let fixture = "tiny-gemma4-q4-f32";
    let model = Model::load(&model_dir(fixture)).expect("load");
    let oracle = oracle(fixture);
    for p in oracle.prompts.iter().take(3) {
        let n = 12.min(p.greedy_ids.len());
        let steps =
            memexec::generate::greedy_logprobs(&model, &p.prompt_ids, n, &ForwardCtx::default())
                .expect("steps");
        let ids: Vec<u32> = steps.iter().map(|s| s.id).collect();
        assert_eq!(ids, p.greedy_ids[..n], "{}", p.name);
        for s in &steps {
            assert_eq!(s.logprobs.len(), model.info().vocab_size);
            assert_eq!(argmax(&s.logprobs), s.id, "{}", p.name);
        }
    }
}
