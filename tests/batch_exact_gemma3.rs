//! Continuous batching on the real Gemma-3 270M (4-bit, f32 scales) gives exactly the serial
//! greedy tokens: mixed prompt lengths up to past its 512-token sliding window, rows ending at
//! different steps and joining as others leave, in the dense form (the CPU default, where
//! batching pays) and, on short prompts, the packed form (mlx-lm's numeric path; its CPU
//! kernel is slow, hence the short prompts). Needs .deps/fixtures (scripts/setup.sh).
mod model_support;

use memexec::engine::{Decoder, RowRequest};
use memexec::model::{Model, WeightChoice};
use model_support::{assert_batches_equal, model_dir, serial_ids};

const FIXTURE: &str = "gemma3-270m-q4-f32";

/// Deterministic prompt ids of `len` tokens in the ordinary-word range of the vocabulary.
fn ids(len: usize, r: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|t| 1000 + (t * 7919 + r * 104_729 + t * t * 31) % 60_000)
        .collect()
}

fn check(form: WeightChoice, shapes: &[(usize, usize)], widths: &[usize]) {
    let model = Model::load_with(&model_dir(FIXTURE), form).expect("load 270M");
    let stop = model.info().eos_token_ids.clone();
    let rows: Vec<RowRequest> = shapes
        .iter()
        .enumerate()
        .map(|(r, &(len, max))| RowRequest::new(ids(len, r as u32), max))
        .collect();
    let want: Vec<Vec<u32>> = rows.iter().map(|r| serial_ids(&model, r, None)).collect();
    assert!(
        want.iter().filter(|w| w.len() >= 3).count() >= 2,
        "rows should generate: {want:?}"
    );
    let decoder = Decoder::new(&model, &stop);
    assert_batches_equal(&decoder, &rows, &want, widths, &format!("{form:?}"));
}

#[test]
fn dense_batches_equal_serial_past_the_window() {
    // 560 > the 512-token sliding window; width 3 makes rows join as others leave.
    check(
        WeightChoice::Dense,
        &[(3, 6), (40, 9), (130, 4), (300, 8), (560, 5), (17, 7)],
        &[3, 8],
    );
}

#[test]
fn packed_batches_equal_serial() {
    check(WeightChoice::Quantized, &[(3, 4), (9, 3), (20, 5)], &[2]);
}
