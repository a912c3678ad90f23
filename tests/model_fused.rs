//! Fused projections (`model::linear_group`: a layer's q/k/v, and its gate/up, as one quantized
//! product whose output is split per part) give exactly the numbers of the unfused model: the
//! MLX quantized kernel's slices against separate products over many shapes, then every
//! quantized fixture loaded fused and unfused (greedy ids and every step's logits, bit for bit,
//! serial and batched, prompts of 1, 20 and 60 tokens: past the tiny fixtures' 32-token window),
//! LoRA adapters on fused parts, groups whose parts cannot fuse, and the
//! `MEMEXEC_FUSE_PROJECTIONS=0` switch of the CLI. Needs .deps/fixtures (scripts/setup.sh).
mod model_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;

use memexec::lora::{Activation, AdapterRegistry, AdapterStack};
use memexec::model::{ForwardCtx, LoadOptions, Model, RowCache, WeightChoice};
use mlx_rs::ops::{concatenate, dequantize, quantize, quantized_matmul};
use mlx_rs::{Array, Dtype};
use model_support::{argmax, model_dir, mount_adapters};

/// The quantized fixtures and how many groups fuse in each: Gemma-4 tiny has 12 layers, 7 of
/// them with their own keys / values (q/k/v + gate/up) and 5 KV-shared (gate/up only); the
/// Gemma-3 270M has 18 layers, each with both groups.
const FIXTURES: [(&str, usize); 4] = [
    ("tiny-gemma4-q4-f32", 19),
    ("tiny-gemma4-q4", 19),
    ("tiny-gemma4-mixed48", 19),
    ("gemma3-270m-q4-f32", 36),
];

/// Prompt lengths: one token, inside the sliding window, past it.
const LENGTHS: [usize; 3] = [1, 20, 60];

fn load(dir: &Path, fuse: bool) -> Model {
    let opts = LoadOptions {
        weights: WeightChoice::Quantized,
        fuse_projections: fuse,
        ..LoadOptions::new(WeightChoice::Quantized)
    };
    Model::load_opts(dir, opts).expect("load")
}

/// Deterministic prompt ids of `len` tokens, `<bos>` first (row `r` varies the pattern).
fn prompt(len: usize, r: u32) -> Vec<u32> {
    std::iter::once(2)
        .chain((1..len as u32).map(|t| 3 + (t * 131 + r * 17 + t * t) % 3990))
        .collect()
}

/// `ids` as `[rows, ids.len() / rows]` int32.
fn tokens(ids: &[u32], rows: usize) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[rows as i32, (v.len() / rows) as i32])
}

/// The rows of `[B, vocab]` f32 logits.
fn logit_rows(a: &Array) -> Vec<Vec<f32>> {
    a.eval().expect("eval");
    let v = a.dim(1) as usize;
    a.as_slice::<f32>().chunks(v).map(<[f32]>::to_vec).collect()
}

/// Fails unless `a` and `b` hold the same bits, naming the largest difference.
fn assert_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()) {
        return;
    }
    let (i, d) = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    panic!(
        "{what}: fused and unfused differ, max |diff| {d:e} at {i} ({} vs {})",
        a[i], b[i]
    );
}

/// What a run saw: every forward call's logits (one row each) and the greedy ids.
struct Run {
    logits: Vec<Vec<f32>>,
    ids: Vec<u32>,
}

fn ctx_for(reg: Option<&Rc<AdapterRegistry>>, stacks: &[AdapterStack]) -> ForwardCtx {
    let adapters = reg.and_then(|r| Activation::per_row(r.clone(), stacks.to_vec()).expect("ids"));
    ForwardCtx::with_adapters(adapters)
}

/// B = 1: the whole prompt in one forward call (L = its length), then `steps` greedy steps.
fn serial(
    model: &Model,
    prompt: &[u32],
    steps: usize,
    reg: Option<&Rc<AdapterRegistry>>,
    stack: &AdapterStack,
) -> Run {
    let ctx = ctx_for(reg, std::slice::from_ref(stack));
    let mut cache = model.new_cache();
    let mut run = Run {
        logits: Vec::new(),
        ids: Vec::new(),
    };
    let mut input = prompt.to_vec();
    for _ in 0..=steps {
        let l = model
            .forward(&tokens(&input, 1), &mut [&mut cache], &ctx)
            .expect("forward");
        let row = logit_rows(&l).remove(0);
        let id = argmax(&row);
        cache.eval().expect("eval cache");
        run.logits.push(row);
        run.ids.push(id);
        input = vec![id];
    }
    run
}

/// Each prompt prefilled alone (as the engine does), then `steps` decode steps with every row
/// in one forward call: the logits of each step, row after row.
fn batched(
    model: &Model,
    prompts: &[Vec<u32>],
    steps: usize,
    reg: Option<&Rc<AdapterRegistry>>,
    stacks: &[AdapterStack],
) -> Run {
    let mut caches: Vec<RowCache> = Vec::new();
    let mut last = Vec::new();
    for (p, stack) in prompts.iter().zip(stacks) {
        let mut c = model.new_cache();
        let ctx = ctx_for(reg, std::slice::from_ref(stack));
        let l = model
            .forward(&tokens(p, 1), &mut [&mut c], &ctx)
            .expect("prefill");
        last.push(argmax(&logit_rows(&l)[0]));
        c.eval().expect("eval cache");
        caches.push(c);
    }
    let ctx = ctx_for(reg, stacks);
    let mut run = Run {
        logits: Vec::new(),
        ids: last.clone(),
    };
    for _ in 0..steps {
        let mut refs: Vec<&mut RowCache> = caches.iter_mut().collect();
        let l = model
            .forward(&tokens(&last, prompts.len()), &mut refs, &ctx)
            .expect("batched step");
        let rows = logit_rows(&l);
        last = rows.iter().map(|r| argmax(r)).collect();
        run.ids.extend(&last);
        run.logits.extend(rows);
        for c in &caches {
            c.eval().expect("eval cache");
        }
    }
    run
}

fn assert_runs_equal(fused: &Run, plain: &Run, what: &str) {
    assert_eq!(fused.ids, plain.ids, "{what}: greedy ids");
    assert_eq!(fused.logits.len(), plain.logits.len());
    for (i, (a, b)) in fused.logits.iter().zip(&plain.logits).enumerate() {
        assert_bits(a, b, &format!("{what}, logits {i}"));
    }
}

/// MLX's quantized kernel: the column slices of one product over concatenated matrices equal
/// the separate products bit for bit, whatever the row count (1 = decode, more = prefill or a
/// batch), bits, group size and dtype, including part widths that are not multiples of 8.
#[test]
fn quantized_kernel_slices_equal_separate_products() {
    let key = mlx_rs::random::key(7).expect("key");
    let mut cases = 0;
    for dtype in [Dtype::Float32, Dtype::Bfloat16] {
        for (bits, group) in [(4, 64), (4, 32), (8, 64), (8, 128)] {
            for (k, outs) in [
                (256, &[512, 128, 128][..]),
                (640, &[1024, 256, 256][..]),
                (256, &[512, 512][..]),
                (384, &[72, 40, 8][..]),
            ] {
                let parts: Vec<(Array, Array, Array)> = outs
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| {
                        let wkey = mlx_rs::random::key(100 + i as u64).expect("key");
                        let w = mlx_rs::random::normal::<f32>(&[o, k], None, None, &wkey)
                            .expect("normal")
                            .multiply(Array::from_f32(0.05 * (i + 1) as f32))
                            .expect("scale")
                            .as_dtype(dtype)
                            .expect("dtype");
                        quantize(&w, group, bits).expect("quantize")
                    })
                    .collect();
                let cat = |f: fn(&(Array, Array, Array)) -> &Array| {
                    let v: Vec<Array> = parts.iter().map(|p| f(p).clone()).collect();
                    concatenate(&v, 0).expect("concatenate")
                };
                let (fw, fs, fb) = (cat(|p| &p.0), cat(|p| &p.1), cat(|p| &p.2));
                let mut split_at = Vec::new();
                let mut end = 0;
                for &o in &outs[..outs.len() - 1] {
                    end += o;
                    split_at.push(end);
                }
                for rows in [1, 2, 3, 8, 20, 60] {
                    let x = mlx_rs::random::normal::<f32>(&[1, rows, k], None, None, &key)
                        .expect("x")
                        .as_dtype(dtype)
                        .expect("dtype");
                    let fused = quantized_matmul(&x, &fw, &fs, &fb, true, group, bits)
                        .expect("fused")
                        .split_at_indices(&split_at, -1)
                        .expect("split");
                    for (i, ((w, s, b), f)) in parts.iter().zip(&fused).enumerate() {
                        let alone = quantized_matmul(&x, w, s, b, true, group, bits)
                            .expect("alone")
                            .as_dtype(Dtype::Float32)
                            .expect("f32");
                        // A slice is a strided view: copy it out (exactly) to read it.
                        let f = f
                            .as_dtype(Dtype::Float32)
                            .and_then(|f| f.contiguous())
                            .expect("f32");
                        assert_eq!(f.shape(), alone.shape());
                        alone.eval().expect("eval");
                        f.eval().expect("eval");
                        assert_bits(
                            f.as_slice::<f32>(),
                            alone.as_slice::<f32>(),
                            &format!("{dtype:?} {bits}-bit gs{group} K {k} outs {outs:?} rows {rows} part {i}"),
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    println!("{cases} part products bit-identical");
}

#[test]
fn fused_models_equal_unfused_serial() {
    for (fixture, groups) in FIXTURES {
        let dir = model_dir(fixture);
        let (fused, plain) = (load(&dir, true), load(&dir, false));
        assert_eq!(fused.info().fused_groups, groups, "{fixture}: fused groups");
        assert_eq!(plain.info().fused_groups, 0, "{fixture}: fusion off");
        assert_eq!(
            fused.linear_modules(),
            plain.linear_modules(),
            "{fixture}: every module keeps its path and shape"
        );
        let steps = if fixture.starts_with("gemma3") { 6 } else { 12 };
        for (r, len) in LENGTHS.into_iter().enumerate() {
            let p = prompt(len, r as u32);
            let none = AdapterStack::none();
            let a = serial(&fused, &p, steps, None, &none);
            let b = serial(&plain, &p, steps, None, &none);
            assert_runs_equal(&a, &b, &format!("{fixture}, {len}-token prompt"));
        }
        println!("{fixture}: {groups} fused groups, serial runs bit-identical");
    }
}

#[test]
fn fused_models_equal_unfused_batched() {
    for (fixture, _) in FIXTURES {
        let dir = model_dir(fixture);
        let (fused, plain) = (load(&dir, true), load(&dir, false));
        let prompts: Vec<Vec<u32>> = LENGTHS
            .iter()
            .enumerate()
            .map(|(r, &len)| prompt(len, 10 + r as u32))
            .collect();
        let stacks = vec![AdapterStack::none(); prompts.len()];
        let steps = if fixture.starts_with("gemma3") { 4 } else { 8 };
        let a = batched(&fused, &prompts, steps, None, &stacks);
        let b = batched(&plain, &prompts, steps, None, &stacks);
        assert_runs_equal(&a, &b, &format!("{fixture}, batch of {}", prompts.len()));
    }
}

/// Adapters on q/k/v and gate/up (layers 6-11, k/v where they exist) add their deltas to the
/// fused parts' slices exactly as to the separate products: alone, stacked, and in a batch
/// that mixes them with base rows.
#[test]
fn lora_on_fused_parts_equals_unfused() {
    let dir = model_dir("tiny-gemma4-q4-f32");
    let (fused, plain) = (load(&dir, true), load(&dir, false));
    assert!(fused.info().fused_groups > 0);
    let names = ["lora-default", "lora-attn-mlp", "lora-ple"];
    let (freg, fids) = mount_adapters(&fused, &names);
    let (preg, pids) = mount_adapters(&plain, &names);
    assert_eq!(fids, pids);
    let stacks = [
        AdapterStack::single(fids[0]),
        AdapterStack::single(fids[1]),
        AdapterStack::new(vec![fids[2], fids[0]]),
        AdapterStack::none(),
    ];
    for (r, stack) in stacks.iter().enumerate() {
        let p = prompt(LENGTHS[r % LENGTHS.len()], 20 + r as u32);
        let a = serial(&fused, &p, 8, Some(&freg), stack);
        let b = serial(&plain, &p, 8, Some(&preg), stack);
        assert_runs_equal(&a, &b, &format!("adapters {:?}", stack.ids()));
    }
    let prompts: Vec<Vec<u32>> = (0..stacks.len())
        .map(|r| prompt(LENGTHS[r % LENGTHS.len()], 30 + r as u32))
        .collect();
    let a = batched(&fused, &prompts, 6, Some(&freg), &stacks);
    let b = batched(&plain, &prompts, 6, Some(&preg), &stacks);
    assert_runs_equal(&a, &b, "mixed adapters in one batch");
}

/// Copies `tiny-gemma4-q4-f32` to `out` with three groups made unfusable: layer 2's up_proj
/// re-quantized at 8 bits (gate_proj stays 4-bit), layer 4's k_proj at group size 32, and
/// layer 3's v_proj dense float32 (marked `false` in the config, as mlx-lm writes it).
fn write_mixed_checkpoint(out: &Path) {
    let src = model_dir("tiny-gemma4-q4-f32");
    let mut tensors: HashMap<String, Array> =
        Array::load_safetensors(src.join("model.safetensors")).expect("load fixture");
    let p = "language_model.model.layers";
    let take = |t: &mut HashMap<String, Array>, m: &str| -> Array {
        let w = t.remove(&format!("{m}.weight")).expect("weight");
        let s = t.remove(&format!("{m}.scales")).expect("scales");
        let b = t.remove(&format!("{m}.biases")).expect("biases");
        dequantize(&w, &s, &b, 64, 4).expect("dequantize")
    };
    let mut overrides = serde_json::Map::new();
    for (m, bits, group) in [
        (format!("{p}.2.mlp.up_proj"), 8, 64),
        (format!("{p}.4.self_attn.k_proj"), 4, 32),
    ] {
        let dense = take(&mut tensors, &m);
        let (w, s, b) = quantize(&dense, group, bits).expect("quantize");
        tensors.insert(format!("{m}.weight"), w);
        tensors.insert(format!("{m}.scales"), s);
        tensors.insert(format!("{m}.biases"), b);
        overrides.insert(
            m,
            serde_json::json!({ "group_size": group, "bits": bits, "mode": "affine" }),
        );
    }
    let v = format!("{p}.3.self_attn.v_proj");
    let dense = take(&mut tensors, &v);
    tensors.insert(format!("{v}.weight"), dense);
    overrides.insert(v, serde_json::Value::Bool(false));
    Array::save_safetensors(&tensors, None, out.join("model.safetensors")).expect("save");

    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("config json");
    let quant = config["quantization"]
        .as_object_mut()
        .expect("quantization block");
    quant.extend(overrides);
    std::fs::write(out.join("config.json"), config.to_string()).expect("write config");
}

#[test]
fn unfusable_groups_stay_separate_and_exact() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_mixed_checkpoint(tmp.path());
    let (fused, plain) = (load(tmp.path(), true), load(tmp.path(), false));
    // 19 groups, minus layer 2's gate/up, layer 3's q/k/v and layer 4's q/k/v.
    assert_eq!(fused.info().fused_groups, 16);
    assert_eq!(fused.linear_modules(), plain.linear_modules());
    for (r, len) in LENGTHS.into_iter().enumerate() {
        let p = prompt(len, 40 + r as u32);
        let none = AdapterStack::none();
        let a = serial(&fused, &p, 8, None, &none);
        let b = serial(&plain, &p, 8, None, &none);
        assert_runs_equal(&a, &b, &format!("mixed checkpoint, {len}-token prompt"));
    }
}

/// Runs `memexec generate --json` (and --logprobs-out) with `MEMEXEC_FUSE_PROJECTIONS` set to
/// `fuse` or unset; returns the JSON line and the logprobs document.
fn cli_run(dir: &Path, ids: &str, fuse: Option<&str>) -> (serde_json::Value, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let lp = tmp.path().join("logprobs.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memexec"));
    cmd.args(["generate", "--model"])
        .arg(dir)
        .args([
            "--prompt-ids",
            ids,
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--json",
        ])
        .arg("--logprobs-out")
        .arg(&lp);
    match fuse {
        Some(v) => cmd.env("MEMEXEC_FUSE_PROJECTIONS", v),
        None => cmd.env_remove("MEMEXEC_FUSE_PROJECTIONS"),
    };
    let out = cmd.output().expect("run memexec");
    assert!(
        out.status.success(),
        "memexec generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let doc = serde_json::from_str(line.trim()).expect("json line");
    (doc, std::fs::read_to_string(&lp).expect("logprobs"))
}

/// The measuring switch: `MEMEXEC_FUSE_PROJECTIONS=0` loads unfused, and the generation's ids
/// and per-step log-probabilities are unchanged.
#[test]
fn the_env_switch_turns_fusion_off_with_the_same_output() {
    let dir = model_dir("tiny-gemma4-q4-f32");
    let ids: Vec<String> = prompt(40, 50).iter().map(u32::to_string).collect();
    let ids = ids.join(",");
    let (on, on_lp) = cli_run(&dir, &ids, None);
    let (off, off_lp) = cli_run(&dir, &ids, Some("0"));
    assert_eq!(on["fused_projections"], 19);
    assert_eq!(off["fused_projections"], 0);
    assert_eq!(on["ids"], off["ids"]);
    assert_eq!(on_lp, off_lp, "per-step log-probabilities");
}
