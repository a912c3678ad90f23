//! LoRA on the tiny Gemma-4 f32 fixture against mlx-lm (`load(model, adapter_path=...)`):
//! last-position logits and greedy ids per adapter; mounted-but-unused adapters leave the base
//! model bit-identical; rows with different adapters in one decode step equal their serial
//! runs bit for bit; malformed copies of a real adapter fail with the tensor named.
mod model_support;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use memexec::generate::{argmax_rows, greedy, prefill, GenerateOptions, PREFILL_STEP};
use memexec::lora::{Activation, AdapterId, AdapterRegistry, AdapterStack};
use memexec::model::{ForwardCtx, Model, RowCache};
use mlx_rs::Array;
use model_support::{adapter_dir, argmax, model_dir, mount_adapters, oracle};

const FIXTURE: &str = "tiny-gemma4-q4-f32";
const ADAPTERS: [&str; 3] = ["lora-default", "lora-attn-mlp", "lora-ple"];

fn mount_all(model: &Model) -> (Rc<AdapterRegistry>, Vec<AdapterId>) {
    mount_adapters(model, &ADAPTERS)
}

fn ctx_for(reg: &Rc<AdapterRegistry>, stacks: Vec<AdapterStack>) -> ForwardCtx {
    ForwardCtx::with_adapters(Activation::per_row(reg.clone(), stacks).expect("activation"))
}

fn tokens(ids: &[u32], shape: &[i32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, shape)
}

fn last_logits(model: &Model, ids: &[u32], ctx: &ForwardCtx) -> Vec<f32> {
    let mut cache = model.new_cache();
    let logits = model
        .forward(&tokens(ids, &[1, ids.len() as i32]), &mut [&mut cache], ctx)
        .expect("forward");
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

fn rows_of(a: &Array) -> Vec<Vec<f32>> {
    a.eval().expect("eval");
    let v = a.dim(1) as usize;
    a.as_slice::<f32>().chunks(v).map(<[f32]>::to_vec).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vocab size mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn adapter_logits_match_mlx_lm() {
    let model = Model::load(&model_dir(FIXTURE)).expect("load");
    let (reg, ids) = mount_all(&model);
    for (name, id) in ADAPTERS.iter().zip(ids) {
        let oracle = oracle(&format!("{FIXTURE}+{name}"));
        let ctx = ctx_for(&reg, vec![AdapterStack::single(id)]);
        let mut worst = 0.0f32;
        for p in &oracle.prompts {
            let ours = last_logits(&model, &p.prompt_ids, &ctx);
            let theirs = p.logits.as_ref().expect("tiny oracles carry full logits");
            let d = max_abs_diff(&ours, theirs);
            println!("{name} {}: max |logit diff| = {d:.3e}", p.name);
            assert!(d <= 1e-4, "{name} {}: max |diff| {d} > 1e-4", p.name);
            assert_eq!(argmax(&ours), p.argmax, "{name} {}: argmax", p.name);
            worst = worst.max(d);
        }
        println!(
            "{name}: worst {worst:.3e} over {} prompts",
            oracle.prompts.len()
        );
    }
}

#[test]
fn adapter_greedy_matches_mlx_lm_for_40_tokens() {
    let model = Model::load(&model_dir(FIXTURE)).expect("load");
    let (reg, ids) = mount_all(&model);
    for (name, id) in ADAPTERS.iter().zip(ids) {
        let oracle = oracle(&format!("{FIXTURE}+{name}"));
        for p in &oracle.prompts {
            let n = p.greedy_ids.len();
            assert!(n >= 32, "oracle {name} has only {n} greedy ids");
            let opts = GenerateOptions {
                max_tokens: n,
                stop_ids: Some(vec![]),
                adapters: Activation::uniform(reg.clone(), AdapterStack::single(id), 1)
                    .expect("activation"),
                ..Default::default()
            };
            let g = greedy(&model, &p.prompt_ids, opts).expect("greedy");
            let agree = g
                .ids
                .iter()
                .zip(&p.greedy_ids)
                .take_while(|(a, b)| a == b)
                .count();
            println!("{name} {}: {agree}/{n} greedy ids agree", p.name);
            assert_eq!(g.ids, p.greedy_ids, "{name} {}: greedy ids differ", p.name);
        }
    }
}

/// Base logits before any adapter exists, then with all adapters mounted (unused), then
/// after adapter calls: bit for bit the same; and the adapters do change the logits.
#[test]
fn mounted_but_unused_adapters_leave_the_base_model_bit_identical() {
    let model = Model::load(&model_dir(FIXTURE)).expect("load");
    let base_oracle = oracle(FIXTURE);
    let prompts: Vec<&[u32]> = base_oracle
        .prompts
        .iter()
        .map(|p| &p.prompt_ids[..])
        .collect();
    let before: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| last_logits(&model, p, &ForwardCtx::default()))
        .collect();
    let (reg, ids) = mount_all(&model);
    // Every row on the base model: no activation is made at all.
    assert!(
        Activation::per_row(reg.clone(), vec![AdapterStack::none(); 2])
            .expect("activation")
            .is_none()
    );
    for (p, base) in prompts.iter().zip(&before) {
        let with = last_logits(
            &model,
            p,
            &ctx_for(&reg, vec![AdapterStack::single(ids[0])]),
        );
        assert!(
            max_abs_diff(&with, base) > 1e-2,
            "the adapter does not change the logits"
        );
        let again = last_logits(&model, p, &ForwardCtx::default());
        assert_eq!(
            bits(&again),
            bits(base),
            "base logits changed after mounting"
        );
    }
}

/// One decode step with rows on different adapters (and stacks, and none) equals each row's
/// own B = 1 step bit for bit, over several steps.
#[test]
fn rows_with_different_adapters_equal_their_serial_runs_bit_for_bit() {
    let model = Model::load(&model_dir(FIXTURE)).expect("load");
    let (reg, ids) = mount_all(&model);
    let o = oracle(FIXTURE);
    let stacks = vec![
        AdapterStack::none(),
        AdapterStack::single(ids[0]),
        AdapterStack::single(ids[2]),
        AdapterStack::new(vec![ids[1], ids[2]]),
        AdapterStack::none(),
    ];
    let mut serial: Vec<RowCache> = Vec::new();
    let mut batched: Vec<RowCache> = Vec::new();
    let mut last: Vec<u32> = Vec::new();
    for (r, stack) in stacks.iter().enumerate() {
        let p = &o.prompts[r % o.prompts.len()].prompt_ids;
        let ctx = ctx_for(&reg, vec![stack.clone()]);
        let mut a = model.new_cache();
        let mut b = model.new_cache();
        let ta = prefill(&model, p, &mut a, PREFILL_STEP, &ctx).expect("prefill");
        let tb = prefill(&model, p, &mut b, PREFILL_STEP, &ctx).expect("prefill");
        assert_eq!(ta, tb);
        serial.push(a);
        batched.push(b);
        last.push(ta);
    }
    let batch_ctx = ctx_for(&reg, stacks.clone());
    for step in 0..4 {
        let mut want = Vec::new();
        for ((cache, &t), stack) in serial.iter_mut().zip(&last).zip(&stacks) {
            let ctx = ctx_for(&reg, vec![stack.clone()]);
            let l = model
                .forward(&tokens(&[t], &[1, 1]), &mut [cache], &ctx)
                .expect("serial step");
            want.push(rows_of(&l).remove(0));
            cache.eval().expect("eval");
        }
        let mut refs: Vec<&mut RowCache> = batched.iter_mut().collect();
        let n = last.len() as i32;
        let logits = model
            .forward(&tokens(&last, &[n, 1]), &mut refs, &batch_ctx)
            .expect("batched step");
        for (r, (got, want)) in rows_of(&logits).iter().zip(&want).enumerate() {
            assert_eq!(bits(got), bits(want), "step {step}, row {r}");
        }
        last = argmax_rows(&model, &logits).expect("argmax");
        for c in &batched {
            c.eval().expect("eval");
        }
    }
}

/// A copy of `lora-default` with `edit` applied to its tensors.
fn broken_copy(root: &Path, name: &str, edit: impl FnOnce(&mut Vec<(String, Array)>)) -> PathBuf {
    let src = adapter_dir("lora-default");
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(
        src.join("adapter_config.json"),
        dir.join("adapter_config.json"),
    )
    .expect("copy config");
    let mut t: Vec<(String, Array)> = Array::load_safetensors(src.join("adapters.safetensors"))
        .expect("read adapter")
        .into_iter()
        .collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut t);
    Array::save_safetensors(
        t.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        dir.join("adapters.safetensors"),
    )
    .expect("write adapter");
    dir
}

fn zeros(shape: &[i32]) -> Array {
    mlx_rs::ops::zeros::<f32>(shape).expect("zeros")
}

#[test]
fn malformed_adapters_fail_clearly_and_the_model_stays_usable() {
    let model = Model::load(&model_dir(FIXTURE)).expect("load");
    let tmp = tempfile::tempdir().expect("tempdir");
    const QB: &str = "language_model.model.layers.6.self_attn.q_proj.lora_b";
    const QA: &str = "language_model.model.layers.6.self_attn.q_proj.lora_a";
    let set = |t: &mut Vec<(String, Array)>, key: &str, a: Array| {
        let slot = t
            .iter_mut()
            .find(|(k, _)| k == key)
            .expect("key in fixture");
        slot.1 = a;
    };
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            broken_copy(tmp.path(), "missing-b", |t| t.retain(|(k, _)| k != QB)),
            vec![QA, "lora_b is missing"],
        ),
        (
            // q_proj of a sliding layer: 8 heads x 64 = 512 outputs, rank 4.
            broken_copy(tmp.path(), "wrong-rank", |t| set(t, QB, zeros(&[5, 512]))),
            vec![QB, "[5, 512]", "expected [4, 512]"],
        ),
        (
            broken_copy(tmp.path(), "wrong-in", |t| set(t, QA, zeros(&[255, 4]))),
            vec![QA, "shape [255, 4], expected [256, 4]"],
        ),
        (
            broken_copy(tmp.path(), "wrong-out", |t| set(t, QB, zeros(&[4, 256]))),
            vec![QB, "shape [4, 256], expected [4, 512]"],
        ),
        (
            // Layer 7 shares layer 6's keys / values: it has no k_proj.
            broken_copy(tmp.path(), "unknown-module", |t| {
                t.push((
                    "language_model.model.layers.7.self_attn.k_proj.lora_a".into(),
                    zeros(&[256, 4]),
                ));
                t.push((
                    "language_model.model.layers.7.self_attn.k_proj.lora_b".into(),
                    zeros(&[4, 128]),
                ));
            }),
            vec!["layers.7.self_attn.k_proj.lora_a", "unknown module"],
        ),
        (
            broken_copy(tmp.path(), "untargetable", |t| {
                t.push((
                    "language_model.model.per_layer_model_projection.lora_a".into(),
                    zeros(&[256, 4]),
                ));
                t.push((
                    "language_model.model.per_layer_model_projection.lora_b".into(),
                    zeros(&[4, 768]),
                ));
            }),
            vec!["per_layer_model_projection.lora_a", "cannot carry LoRA"],
        ),
    ];
    let mut reg = AdapterRegistry::new(model.linear_modules());
    for (dir, needles) in &cases {
        let err = reg
            .mount(dir)
            .expect_err("a malformed adapter must not mount")
            .to_string();
        println!("{err}");
        for n in needles {
            assert!(err.contains(n), "{}: {err:?} lacks {n:?}", dir.display());
        }
        assert!(
            reg.adapters().is_empty(),
            "a failed mount changed the registry"
        );
    }
    // Still usable: the real adapter mounts after the failures and matches mlx-lm.
    let id = reg.mount(&adapter_dir("lora-default")).expect("mount");
    let reg = Rc::new(reg);
    let o = oracle(&format!("{FIXTURE}+lora-default"));
    let p = &o.prompts[0];
    let ours = last_logits(
        &model,
        &p.prompt_ids,
        &ctx_for(&reg, vec![AdapterStack::single(id)]),
    );
    let d = max_abs_diff(&ours, p.logits.as_ref().expect("logits"));
    assert!(d <= 1e-4, "after failed mounts: max |diff| {d}");
}
