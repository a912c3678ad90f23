//! Continuous batching on the tiny Gemma-4 f32 fixture gives exactly the serial greedy tokens
//! (`generate::greedy`, itself checked against mlx-lm in model_parity): mixed prompt lengths
//! (3..300, past the 32-token sliding window), rows ending at different steps, rows joining
//! mid-decode, mixed adapters per row, a cancelled row, and through the engine. Also: many
//! small batches do not grow MLX's active memory. Every check runs with the matrices packed and
//! dense (`WeightChoice`). Needs .deps/fixtures (scripts/setup.sh).
mod model_support;

use std::collections::VecDeque;

use memexec::config::Config;
use memexec::engine::batched::{self_check, Row, Started};
use memexec::engine::scheduler::Limits;
use memexec::engine::{CallOptions, Decoder, Engine, LocalInput, RowRequest};
use memexec::lora::AdapterStack;
use memexec::model::{Model, WeightChoice};
use model_support::{assert_batches_equal, model_dir, mount_adapters, serial_ids};

const FIXTURE: &str = "tiny-gemma4-q4-f32";

/// Both forms of the matrices: the packed 4-bit kernel (mlx-lm's path) and the dense BLAS
/// path, whose kernels depend on the row count unless run in fixed 8-row calls
/// (`linear::DENSE_STEP_ROWS`).
const FORMS: [WeightChoice; 2] = [WeightChoice::Quantized, WeightChoice::Dense];

fn model(form: WeightChoice) -> Model {
    eprintln!("weights: {form:?}");
    Model::load_with(&model_dir(FIXTURE), form).expect("load tiny fixture")
}

/// Deterministic prompt ids of `len` tokens (row `r` varies the pattern).
fn ids(len: usize, r: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|t| 2 + (t * 131 + r * 17 + t * t) % 4000)
        .collect()
}

fn mixed_rows() -> Vec<RowRequest> {
    [
        (3, 9),
        (17, 4),
        (33, 12),
        (64, 6),
        (150, 10),
        (300, 7),
        (8, 1),
        (45, 11),
    ]
    .iter()
    .enumerate()
    .map(|(r, &(len, max))| RowRequest::new(ids(len, r as u32), max))
    .collect()
}

#[test]
fn mixed_batches_equal_serial_at_every_width() {
    for form in FORMS {
        let model = model(form);
        let stop = model.info().eos_token_ids.clone();
        let rows = mixed_rows();
        let want: Vec<Vec<u32>> = rows.iter().map(|r| serial_ids(&model, r, None)).collect();
        assert!(want.iter().any(|w| w.len() > 3), "the rows should generate");
        let decoder = Decoder::new(&model, &stop);
        // Width 3 makes rows join as others leave (different max_tokens end them at different steps).
        assert_batches_equal(&decoder, &rows, &want, &[1, 3, 8, 16], &format!("{form:?}"));
    }
}

/// The GPU decoder's form on the CPU: one forward per step with every quantized product cut
/// into chunks of at most 3 rows, and the older form, several forwards of at most 3 rows.
#[test]
fn row_limits_per_product_or_per_forward_equal_serial() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let rows = mixed_rows();
    let want: Vec<Vec<u32>> = rows.iter().map(|r| serial_ids(&model, r, None)).collect();
    let per_product = Decoder::new(&model, &stop).with_rows_per_product(3);
    assert_batches_equal(&per_product, &rows, &want, &[8], "3 rows per product");
    let per_forward = Decoder::new(&model, &stop).with_rows_per_forward(3);
    assert_batches_equal(&per_forward, &rows, &want, &[8], "3 rows per forward");
}

#[test]
fn a_kv_budget_still_gives_serial_tokens() {
    for form in FORMS {
        let model = model(form);
        let stop = model.info().eos_token_ids.clone();
        let rows = mixed_rows();
        let decoder = Decoder::new(&model, &stop);
        // Learn bytes per token, then allow about two rows' worth.
        let first = decoder.run_rows(
            vec![rows[0].clone()],
            Limits {
                width: 1,
                kv_budget: None,
            },
        );
        assert!(first[0].is_ok());
        let budget = decoder.bytes_per_token() * 400;
        assert!(budget > 0);
        let got = decoder.run_rows(
            rows.clone(),
            Limits {
                width: 8,
                kv_budget: Some(budget),
            },
        );
        for (i, (g, r)) in got.into_iter().zip(&rows).enumerate() {
            assert_eq!(g.expect("row").ids, serial_ids(&model, r, None), "row {i}");
        }
    }
}

/// Runs `reqs` through `decoder` as `Decoder::run_rows` does (`Decoder::admit` in
/// `Decoder::admission_passes`, then one step of the running rows): each row's ids, the rows
/// of the first step and the most rows that ran together.
fn run_admitting(
    decoder: &Decoder<'_>,
    reqs: &[RowRequest],
    limits: Limits,
) -> (Vec<Vec<u32>>, usize, usize) {
    let need = |r: &RowRequest| decoder.kv_need(r.prompt.len(), r.max_tokens);
    let mut waiting: VecDeque<usize> = (0..reqs.len()).collect();
    let mut running: Vec<Row<usize>> = Vec::new();
    let mut got: Vec<Option<Vec<u32>>> = vec![None; reqs.len()];
    let (mut first, mut together) = (None, 0);
    while !(waiting.is_empty() && running.is_empty()) {
        decoder.admission_passes(|| {
            let running_need: Vec<u64> = running.iter().map(|r| need(&reqs[*r.tag()])).collect();
            let waiting_need: Vec<u64> = waiting.iter().map(|&i| need(&reqs[i])).collect();
            for _ in 0..decoder.admit(limits, &running_need, &waiting_need) {
                let i = waiting.pop_front().expect("admitted from the waiting rows");
                match decoder.start(i, reqs[i].clone()) {
                    Ok(Started::Running(row)) => running.push(row),
                    Ok(Started::Done(i, out)) => got[i] = Some(out.ids),
                    Err(e) => panic!("start {i}: {}", e.error),
                }
            }
        });
        together = together.max(running.len());
        if !running.is_empty() {
            first.get_or_insert(running.len());
            for (i, out) in decoder.step(&mut running).expect("step") {
                got[i] = Some(out.ids);
            }
        }
    }
    let got = got.into_iter().map(|g| g.expect("every row ran")).collect();
    (got, first.unwrap_or(0), together)
}

/// A KV budget holds from a decoder's first admission: before any prefill has measured the
/// bytes per position (every need reads 0) it starts one row, and once that row's prefill has
/// measured them, as many more as the budget holds, before the first step; in both KV layouts,
/// always the serial tokens.
#[test]
fn a_kv_budget_holds_from_the_first_admission() {
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let reqs: Vec<RowRequest> = (0..4)
        .map(|r| RowRequest::new(ids(20, 200 + r), 6))
        .collect();
    let want: Vec<Vec<u32>> = reqs.iter().map(|r| serial_ids(&model, r, None)).collect();
    // What one of these rows needs, as a decoder estimates it once it has prefilled one.
    let one = {
        let decoder = Decoder::new(&model, &stop);
        assert_eq!(decoder.kv_need(20, 6), 0, "nothing measured yet");
        let lone = Limits {
            width: 1,
            kv_budget: None,
        };
        assert!(decoder.run_rows(vec![reqs[0].clone()], lone)[0].is_ok());
        decoder.kv_need(20, 6)
    };
    assert!(one > 0);
    for shared in [false, true] {
        // Decode steps of `run_rows` itself: as many under a budget that holds every row as
        // without one (all rows start before the first step), more one row at a time.
        let steps = |kv_budget| {
            let decoder = Decoder::new(&model, &stop).with_shared_kv(shared);
            let limits = Limits {
                width: 4,
                kv_budget,
            };
            let rows = decoder.run_rows(reqs.clone(), limits);
            let rows: Vec<Vec<u32>> = rows.into_iter().map(|r| r.expect("row").ids).collect();
            assert_eq!(
                rows, want,
                "shared KV {shared}, budget {kv_budget:?}: run_rows"
            );
            decoder.profile().steps
        };
        let free = steps(None);
        assert_eq!(steps(Some(4 * one)), free, "shared KV {shared}");
        assert!(steps(Some(1)) > free, "shared KV {shared}");
        for (kv_budget, most) in [
            (None, 4),
            (Some(1), 1),
            (Some(2 * one), 2),
            (Some(4 * one), 4),
        ] {
            let decoder = Decoder::new(&model, &stop).with_shared_kv(shared);
            let limits = Limits {
                width: 4,
                kv_budget,
            };
            let (got, first, together) = run_admitting(&decoder, &reqs, limits);
            let case = format!("shared KV {shared}, budget {kv_budget:?}");
            assert_eq!(got, want, "{case}");
            assert_eq!((first, together), (most, most), "{case}");
        }
    }
}

/// Shared batch KV (one buffer per layer for every row, written by one scatter per layer):
/// the serial tokens, with prompts whose sliding ring wraps while decoding (28 + 12 > 32), that
/// fill it exactly (32), are trimmed to it (300), or cross a full layer's 256-position growth
/// (250 + 12), and at width 3 rows leaving and others taking their slots.
#[test]
fn a_shared_batch_kv_equals_serial() {
    // The KV layout is independent of the weights' form (the dense form runs above, per-row).
    let model = model(WeightChoice::Quantized);
    let stop = model.info().eos_token_ids.clone();
    let mut rows = mixed_rows();
    rows.extend(
        [(28, 12), (250, 12), (32, 12), (31, 12)]
            .iter()
            .enumerate()
            .map(|(r, &(len, max))| RowRequest::new(ids(len, 50 + r as u32), max)),
    );
    let want: Vec<Vec<u32>> = rows.iter().map(|r| serial_ids(&model, r, None)).collect();
    let decoder = Decoder::new(&model, &stop).with_shared_kv(true);
    assert_batches_equal(&decoder, &rows, &want, &[3, 16], "shared KV");
    assert_eq!(decoder.shared_kv_rows(), Some(0), "every slot freed");
}

#[test]
fn rows_joining_mid_decode_and_a_dropped_row_leave_the_others_exact() {
    // The KV layout is independent of the weights' form: the shared one runs with one.
    let cases = FORMS.into_iter().map(|f| (f, false));
    for (form, shared) in cases.chain([(WeightChoice::Quantized, true)]) {
        let model = model(form);
        let stop = model.info().eos_token_ids.clone();
        eprintln!("shared KV: {shared}");
        let decoder = Decoder::new(&model, &stop).with_shared_kv(shared);
        let reqs: Vec<RowRequest> = [(40, 10), (5, 10), (90, 10), (12, 10)]
            .iter()
            .enumerate()
            .map(|(r, &(len, max))| RowRequest::new(ids(len, 100 + r as u32), max))
            .collect();
        let want: Vec<Vec<u32>> = reqs.iter().map(|r| serial_ids(&model, r, None)).collect();
        let mut running = Vec::new();
        let mut got: Vec<Option<Vec<u32>>> = vec![None; reqs.len()];
        let start = |i: usize, running: &mut Vec<Row<usize>>, got: &mut Vec<Option<Vec<u32>>>| {
            match decoder.start(i, reqs[i].clone()) {
                Ok(Started::Running(row)) => running.push(row),
                Ok(Started::Done(i, out)) => got[i] = Some(out.ids),
                Err(e) => panic!("start {i}: {}", e.error),
            }
        };
        start(0, &mut running, &mut got);
        start(1, &mut running, &mut got);
        for step in 0..12 {
            if step == 2 {
                start(2, &mut running, &mut got);
            }
            if step == 3 {
                // Row 1 is "cancelled": it leaves the running set with its cache.
                running.retain(|r| *r.tag() != 1);
            }
            if step == 4 {
                start(3, &mut running, &mut got);
            }
            for (i, out) in decoder.step(&mut running).expect("step") {
                got[i] = Some(out.ids);
            }
            if step == 4 {
                // The rows really run on shared buffers (and the dropped row's slot is free).
                let want = shared.then_some(running.len());
                assert_eq!(decoder.shared_kv_rows(), want);
            }
        }
        while !running.is_empty() {
            for (i, out) in decoder.step(&mut running).expect("step") {
                got[i] = Some(out.ids);
            }
        }
        for i in [0, 2, 3] {
            assert_eq!(got[i].as_ref(), Some(&want[i]), "row {i}");
        }
        assert_eq!(got[1], None, "the dropped row must not finish");
    }
}

#[test]
fn mixed_adapters_in_one_batch_equal_their_serial_runs() {
    for form in FORMS {
        let model = model(form);
        let stop = model.info().eos_token_ids.clone();
        let (reg, ids_of) = mount_adapters(&model, &["lora-default", "lora-attn-mlp", "lora-ple"]);
        let stacks = [
            AdapterStack::none(),
            AdapterStack::single(ids_of[0]),
            AdapterStack::single(ids_of[1]),
            AdapterStack::new(vec![ids_of[2], ids_of[0]]),
            AdapterStack::none(),
        ];
        let rows: Vec<RowRequest> = stacks
            .iter()
            .enumerate()
            .map(|(r, s)| RowRequest {
                prompt: ids(10 + 23 * r, 200 + r as u32),
                max_tokens: 5 + r,
                adapters: s.clone(),
            })
            .collect();
        let want: Vec<Vec<u32>> = rows
            .iter()
            .map(|r| serial_ids(&model, r, Some(&reg)))
            .collect();
        let decoder = Decoder::new(&model, &stop).with_registry(reg.clone());
        let got = decoder.run_rows(
            rows,
            Limits {
                width: 4,
                kv_budget: None,
            },
        );
        for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
            assert_eq!(&g.expect("row").ids, w, "row {i}");
        }
    }
}

#[test]
fn the_self_check_passes_on_the_fixture() {
    for form in FORMS {
        let model = model(form);
        let stop = model.info().eos_token_ids.clone();
        assert_eq!(self_check(&model, &stop, 4, None), None);
    }
}

fn engine(width: usize, form: WeightChoice) -> Engine {
    let mut config = Config::for_model(model_dir(FIXTURE));
    config.batch_width = width;
    config.weights = form;
    Engine::new(config).expect("engine")
}

fn inputs() -> Vec<LocalInput> {
    (0..6)
        .map(|i| {
            LocalInput::user(format!(
                "Note {i}: {}",
                "the deadline moved. ".repeat(i * 5)
            ))
        })
        .collect()
}

#[test]
fn the_engine_batches_exactly_and_reports_its_mode() {
    let opts = CallOptions {
        max_tokens: Some(6),
    };
    for form in FORMS {
        let serial = engine(1, form);
        assert_eq!(serial.stats().mode, "serial");
        let want: Vec<Vec<u32>> = inputs()
            .into_iter()
            .map(|x| serial.call("entity", x, opts).expect("serial call").ids)
            .collect();
        drop(serial);

        let batched = engine(4, form);
        assert_eq!(batched.stats().mode, "batched");
        // Two submissions: the second joins while the first decodes; one of a third is cancelled.
        let first = batched
            .submit_batch("entity", inputs()[..4].to_vec(), opts)
            .expect("submit");
        let second = batched
            .submit_batch("entity", inputs()[4..].to_vec(), opts)
            .expect("submit");
        let doomed = batched
            .submit(
                "entity",
                LocalInput::user("cancel me"),
                CallOptions {
                    max_tokens: Some(50),
                },
            )
            .expect("submit");
        doomed.cancel();
        let mut got = first.wait().expect("first batch");
        got.extend(second.wait().expect("second batch"));
        let got: Vec<Vec<u32>> = got.into_iter().map(|c| c.ids).collect();
        assert_eq!(got, want);
        assert!(matches!(doomed.wait(), Err(memexec::Error::Cancelled)));
        let stats = batched.stats();
        assert_eq!(stats.completed, 6);
        assert_eq!(stats.cancelled, 1);
        let want_form = if form == WeightChoice::Dense {
            "dense"
        } else {
            "quantized"
        };
        assert_eq!(stats.weights, want_form);
    }
}

#[test]
fn many_small_batches_do_not_grow_active_memory() {
    // The default CPU form (dense); both forms would double a slow test.
    const BATCHES: u32 = 250;
    let model = model(WeightChoice::Dense);
    let stop = model.info().eos_token_ids.clone();
    let decoder = Decoder::new(&model, &stop);
    let batch = |k: u32| {
        vec![
            RowRequest::new(ids(6 + (k % 5) as usize, k), 3),
            RowRequest::new(ids(20, k + 1), 2),
        ]
    };
    let limits = Limits {
        width: 2,
        kv_budget: None,
    };
    for k in 0..20 {
        assert!(decoder.run_rows(batch(k), limits).iter().all(Result::is_ok));
    }
    let before = mlx_rs::memory::active_memory().expect("active memory");
    for k in 0..BATCHES {
        assert!(decoder.run_rows(batch(k), limits).iter().all(Result::is_ok));
    }
    let after = mlx_rs::memory::active_memory().expect("active memory");
    eprintln!("active memory {before} -> {after} bytes over {BATCHES} batches");
    // One row's KV on this model is a few kB and its logits 16 kB: a batch leaking anything of
    // a row's (>= 256 bytes per batch, as the earlier 1000 batches against 256 kB) shows here.
    assert!(
        after <= before + 256 * BATCHES as usize,
        "active memory grew from {before} to {after} bytes over {BATCHES} batches"
    );
}
