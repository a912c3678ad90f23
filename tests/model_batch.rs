//! A batched decode step (B rows, one token each, each row with its own cache) computes, for
//! every row, exactly the logits of the B = 1 step: bit for bit on the f32 fixture, with the
//! matrices packed (4-bit kernel) and dense (BLAS), and with the quantized products cut into
//! row chunks (`ForwardCtx::product_rows`, what a GPU decode step runs). Also the node counts
//! of a decode step's graph that those forms promise.
mod model_support;

use memexec::generate::{argmax_rows, decode_step_graph, prefill, PREFILL_STEP};
use memexec::mlx_ffi::GraphCensus;
use memexec::model::{ForwardCtx, Model, RowCache, WeightChoice};
use mlx_rs::Array;
use model_support::{model_dir, oracle};

fn step_tokens(ids: &[u32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[v.len() as i32, 1])
}

fn logits_rows(a: &Array) -> Vec<Vec<f32>> {
    a.eval().expect("eval");
    let v = a.dim(1) as usize;
    a.as_slice::<f32>().chunks(v).map(<[f32]>::to_vec).collect()
}

#[test]
fn batched_decode_equals_serial_bit_for_bit() {
    batched_decode_equals_serial_in(WeightChoice::Quantized, None, true);
}

/// The dense BLAS form: the row padding of dense products must make rows batch-independent.
#[test]
fn batched_decode_equals_serial_bit_for_bit_dense() {
    batched_decode_equals_serial_in(WeightChoice::Dense, None, true);
}

/// The GPU's form: quantized products over chunks of at most 2 rows (the GPU runs chunks of
/// 7), which must come back in row order, and attention one row at a time.
#[test]
fn batched_decode_in_product_row_chunks_equals_serial_bit_for_bit() {
    batched_decode_equals_serial_in(WeightChoice::Quantized, Some(2), false);
}

/// `stacked`: rows holding as many keys attend in one op (the CPU's form).
fn batched_decode_equals_serial_in(form: WeightChoice, product_rows: Option<usize>, stacked: bool) {
    let fixture = "tiny-gemma4-q4-f32";
    let model = Model::load_with(&model_dir(fixture), form).expect("load");
    let oracle = oracle(fixture);
    let ctx = ForwardCtx::default();
    // Rows at different offsets: before, at and well past the 32-token window, plus a fresh row.
    let prompts: Vec<Vec<u32>> = oracle
        .prompts
        .iter()
        .map(|p| p.prompt_ids.clone())
        .collect();
    assert!(
        prompts.iter().any(|p| p.len() > 64),
        "need a row past the window"
    );
    // Rows of equal length but other ids: they attend together in every layer (stacked), so
    // a row mix-up there changes their logits.
    let mut prompts = prompts;
    for (n, p) in prompts.clone().iter().enumerate().take(2) {
        prompts.push(p.iter().map(|&t| 2 + (t * 7 + n as u32) % 4000).collect());
    }
    assert!(
        product_rows.is_none_or(|n| prompts.len() + 1 > n),
        "need more rows than one chunk"
    );

    let mut serial: Vec<RowCache> = Vec::new();
    let mut batched: Vec<RowCache> = Vec::new();
    let mut last: Vec<u32> = Vec::new();
    for p in &prompts {
        let mut a = model.new_cache();
        let mut b = model.new_cache();
        let ta = prefill(&model, p, &mut a, PREFILL_STEP, &ctx).expect("prefill");
        let tb = prefill(&model, p, &mut b, PREFILL_STEP, &ctx).expect("prefill");
        assert_eq!(ta, tb);
        serial.push(a);
        batched.push(b);
        last.push(ta);
    }
    serial.push(model.new_cache());
    batched.push(model.new_cache());
    last.push(2);

    for step in 0..6 {
        let mut serial_rows = Vec::new();
        let mut serial_picks = Vec::new();
        for (cache, &t) in serial.iter_mut().zip(&last) {
            let l = model
                .forward(&step_tokens(&[t]), &mut [cache], &ctx)
                .expect("serial step");
            serial_rows.push(logits_rows(&l).remove(0));
            serial_picks.extend(argmax_rows(&model, &l).expect("argmax"));
            cache.eval().expect("eval");
        }
        let mut refs: Vec<&mut RowCache> = batched.iter_mut().collect();
        let chunked = ctx
            .clone()
            .with_product_rows(product_rows)
            .with_stacked_attention(stacked);
        let logits = model
            .forward(&step_tokens(&last), &mut refs, &chunked)
            .expect("batched step");
        // The batched pick (all rows at once) must be each row's one-row pick.
        let next = argmax_rows(&model, &logits).expect("argmax");
        assert_eq!(next, serial_picks, "step {step}: batched greedy picks");
        let rows = logits_rows(&logits);
        for (r, (ours, theirs)) in rows.iter().zip(&serial_rows).enumerate() {
            let same = ours
                .iter()
                .zip(theirs)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "step {step}, row {r} (offset {}): batched logits differ from B=1",
                serial[r].offset()
            );
        }
        for c in &batched {
            c.eval().expect("eval");
        }
        last = next;
    }
    let offsets: Vec<usize> = batched.iter().map(RowCache::offset).collect();
    println!("rows bit-identical over 6 steps at final offsets {offsets:?}");
    assert!(offsets.iter().any(|&o| o > 64));
}

#[test]
fn batch_rejects_multi_token_rows_and_cache_mismatch() {
    let model = Model::load(&model_dir("tiny-gemma4-q4-f32")).expect("load");
    let ctx = ForwardCtx::default();
    let mut a = model.new_cache();
    let mut b = model.new_cache();
    let two_by_two = Array::from_slice(&[2i32, 3, 4, 5], &[2, 2]);
    assert!(model
        .forward(&two_by_two, &mut [&mut a, &mut b], &ctx)
        .is_err());
    let one = Array::from_slice(&[2i32], &[1, 1]);
    assert!(
        model.forward(&one, &mut [&mut a, &mut b], &ctx).is_err(),
        "rows != caches"
    );
    let out_of_vocab = Array::from_slice(&[4096i32], &[1, 1]);
    assert!(model.forward(&out_of_vocab, &mut [&mut a], &ctx).is_err());
    let negative = Array::from_slice(&[-1i32], &[1, 1]);
    assert!(model.forward(&negative, &mut [&mut a], &ctx).is_err());
    assert_eq!(a.offset(), 0, "a rejected call leaves the cache untouched");
}

/// What a decode step's graph holds, per the MLX graph census: one `SliceUpdate` per key /
/// value write (no reshapes around it; with a shared batch KV one `Scatter` per layer and
/// tensor for all rows), with stacked attention one attention for rows holding
/// as many keys, else one per row (on the CPU MLX decomposes attention, one `Softmax` each),
/// and with `product_rows` each quantized
/// product split into row chunks (5 rows, at most 2 per product: 3 where B = 1 has one).
#[test]
fn decode_step_graph_has_one_write_per_cache_and_chunked_products() {
    let model =
        Model::load_with(&model_dir("tiny-gemma4-q4-f32"), WeightChoice::Quantized).expect("load");
    let prompt: Vec<u32> = (0..40).map(|t| 2 + (t * 37) % 500).collect();
    let ctx = ForwardCtx::default().with_stacked_attention(true);
    let census = |rows: usize, ctx: &ForwardCtx| {
        GraphCensus::from_text(
            &decode_step_graph(&model, &prompt, rows, ctx, false).expect("graph"),
        )
    };
    let one = census(1, &ctx);
    let five = census(5, &ctx);
    let per_row = census(5, &ForwardCtx::default());
    // Five rows at the same position attend in one op per layer, as one row does.
    assert_eq!(five.count("Softmax"), one.count("Softmax"), "{five:?}");
    assert!(one.count("Softmax") > 0, "{one:?}");
    assert_eq!(
        per_row.count("Softmax"),
        5 * one.count("Softmax"),
        "{per_row:?}"
    );
    let chunked = census(5, &ctx.clone().with_product_rows(Some(2)));
    let caches = model.new_cache().len();
    assert_eq!(one.count("SliceUpdate"), 2 * caches, "{one:?}");
    assert_eq!(five.count("SliceUpdate"), 5 * 2 * caches, "{five:?}");
    // A shared batch KV: one scatter per layer and tensor for all rows, no per-row writes.
    let shared = GraphCensus::from_text(
        &decode_step_graph(&model, &prompt, 5, &ctx, true).expect("shared graph"),
    );
    assert_eq!(shared.count("Scatter"), 2 * caches, "{shared:?}");
    assert_eq!(shared.count("SliceUpdate"), 0, "{shared:?}");
    assert!(
        shared.nodes < five.nodes + 2 * caches,
        "{shared:?} vs {five:?}"
    );
    let qmm = one.count("QuantizedMatmul");
    assert!(qmm > 0, "{one:?}");
    assert_eq!(five.count("QuantizedMatmul"), qmm, "{five:?}");
    assert_eq!(chunked.count("QuantizedMatmul"), 3 * qmm, "{chunked:?}");
    // The row-exact product kernel (MLX CUDA's batched decoder turns it on) is CUDA-only: a
    // context that asks for it on an MLX without CUDA fails with MLX's error, no wrong tokens.
    let forced = ctx
        .clone()
        .with_product_rows(Some(2))
        .with_product_kernel(true);
    let err = decode_step_graph(&model, &prompt, 5, &forced, false).expect_err("no CUDA here");
    assert!(err.to_string().contains("cuda kernel"), "{err}");
}

/// On the CPU the batched decoder never asks for the CUDA product kernel.
#[test]
fn the_cpu_decoder_keeps_mlx_products() {
    let model =
        Model::load_with(&model_dir("tiny-gemma4-q4-f32"), WeightChoice::Quantized).expect("load");
    let decoder = memexec::engine::Decoder::new(&model, &[]);
    assert!(!decoder.product_kernel());
    assert!(!decoder.base_ctx().product_kernel);
}

/// A decode step fed the previous step's uint32 picks as they are (serial and batched decoding
/// feed them back uncast) computes the logits of the same ids given as int32, bit for bit; other
/// dtypes are refused.
#[test]
fn uint32_tokens_give_the_int32_logits() {
    let fixture = "tiny-gemma4-q4-f32";
    let model = Model::load_with(&model_dir(fixture), WeightChoice::Quantized).expect("load");
    let ctx = ForwardCtx::default();
    let prompt = oracle(fixture).prompts[0].prompt_ids.clone();
    let ids = [prompt[1], prompt[prompt.len() / 2]];
    let step = |tokens: &Array| {
        let mut caches: Vec<RowCache> = (0..2).map(|_| model.new_cache()).collect();
        for cache in caches.iter_mut() {
            prefill(&model, &prompt, cache, PREFILL_STEP, &ctx).expect("prefill");
        }
        let mut refs: Vec<&mut RowCache> = caches.iter_mut().collect();
        model.forward_own_tokens(tokens, &mut refs, &ctx)
    };
    let int32 = logits_rows(&step(&step_tokens(&ids)).expect("int32 step"));
    let uint32 = logits_rows(&step(&Array::from_slice(&ids, &[2, 1])).expect("uint32 step"));
    assert_eq!(int32, uint32);
    let floats = Array::from_slice(&[1.0f32, 2.0], &[2, 1]);
    let err = step(&floats).expect_err("float tokens must be refused");
    assert!(err.to_string().contains("int32 or uint32"), "{err}");
}
