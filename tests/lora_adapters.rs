//! Adapter reading, validation and per-row application on synthetic modules (no model
//! needed): every malformed-adapter case fails with the tensor named and the registry
//! unchanged; per-row application equals the one-row path bit for bit.
use std::path::Path;
use std::rc::Rc;

use memexec::lora::{Activation, AdapterRegistry, AdapterStack, ModuleShape};
use memexec::Error;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{matmul, subtract};
use mlx_rs::{random, Array};

const Q: &str = "language_model.model.layers.0.self_attn.q_proj";
const DOWN: &str = "language_model.model.layers.1.mlp.down_proj";

/// Two targetable modules and one that LoRA may not target.
fn modules() -> Vec<ModuleShape> {
    let m = |path: &str, in_dim, out_dim| ModuleShape {
        path: path.into(),
        in_dim,
        out_dim,
    };
    vec![
        m(Q, 8, 16),
        m(DOWN, 12, 8),
        m("language_model.model.per_layer_model_projection", 8, 24),
    ]
}

fn normal(shape: &[i32], seed: u64) -> Array {
    random::normal::<f32>(shape, None, None, &random::key(seed).unwrap()).unwrap()
}

fn write_adapter(dir: &Path, config: &str, tensors: &[(&str, Array)]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), config).unwrap();
    let pairs: Vec<(&str, &Array)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    Array::save_safetensors(pairs, None, dir.join("adapters.safetensors")).unwrap();
}

const MLX_CONFIG: &str =
    r#"{"fine_tune_type": "lora", "lora_parameters": {"rank": 2, "scale": 4.0, "dropout": 0.0}}"#;

fn good_tensors() -> Vec<(&'static str, Array)> {
    vec![
        (
            "language_model.model.layers.0.self_attn.q_proj.lora_a",
            normal(&[8, 2], 1),
        ),
        (
            "language_model.model.layers.0.self_attn.q_proj.lora_b",
            normal(&[2, 16], 2),
        ),
        ("model.layers.1.mlp.down_proj.lora_a", normal(&[12, 3], 3)),
        ("model.layers.1.mlp.down_proj.lora_b", normal(&[3, 8], 4)),
    ]
}

fn mount_err(tensors: &[(&str, Array)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bad");
    write_adapter(&dir, MLX_CONFIG, tensors);
    let mut reg = AdapterRegistry::new(modules());
    let err = reg
        .mount(&dir)
        .expect_err("a malformed adapter must not mount");
    assert!(
        reg.adapters().is_empty(),
        "registry changed by a failed mount"
    );
    assert!(matches!(err, Error::Adapter { .. }), "{err}");
    // The registry stays usable: a good adapter mounts after the failure.
    let good = tmp.path().join("good");
    write_adapter(&good, MLX_CONFIG, &good_tensors());
    reg.mount(&good).expect("good adapter after a failed one");
    err.to_string()
}

fn max_abs(a: &Array, b: &Array) -> f32 {
    let d = subtract(a, b).unwrap().abs().unwrap().max(None).unwrap();
    d.item_exact::<f32>()
}

#[test]
fn mounts_and_applies_the_mlx_lm_formula() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("memory-chunk");
    let t = good_tensors();
    write_adapter(&dir, MLX_CONFIG, &t);
    let mut reg = AdapterRegistry::new(modules());
    let id = reg.mount(&dir).unwrap();
    assert_eq!(reg.id("memory-chunk"), Some(id));
    assert_eq!(reg.info(id).unwrap().modules, 2);
    let pairs = reg.pairs(Q).unwrap();
    assert_eq!((pairs[0].1.rank(), pairs[0].1.scale()), (2, 4.0));
    assert_eq!(reg.pairs(DOWN).unwrap()[0].1.rank(), 3);

    let reg = Rc::new(reg);
    let x = normal(&[1, 5, 8], 9);
    let y = normal(&[1, 5, 16], 10);
    let act = Activation::uniform(reg.clone(), AdapterStack::single(id), 1)
        .unwrap()
        .unwrap();
    let got = act.apply(Q, &x, y.clone()).unwrap();
    // Independent composition: y + 4 * (x @ A) @ B.
    let want = y
        .add(
            matmul(matmul(&x, &t[0].1).unwrap(), &t[1].1)
                .unwrap()
                .multiply(Array::from_f32(4.0))
                .unwrap(),
        )
        .unwrap();
    assert!(max_abs(&got, &want) < 1e-5);
    // A module the adapter does not touch: the very same array back.
    let other = act.apply(
        "language_model.model.per_layer_model_projection",
        &x,
        y.clone(),
    );
    assert_eq!(max_abs(&other.unwrap(), &y), 0.0);
    // No adapter in any row: no activation at all.
    assert!(Activation::uniform(reg, AdapterStack::none(), 3)
        .unwrap()
        .is_none());
}

#[test]
fn peft_layout_is_transposed_and_alpha_scaled() {
    let tmp = tempfile::tempdir().unwrap();
    let t = good_tensors();
    let mlx = tmp.path().join("mlx");
    write_adapter(&mlx, MLX_CONFIG, &t[..2]);
    let peft = tmp.path().join("peft");
    std::fs::create_dir_all(&peft).unwrap();
    // peft: nn.Linear weights [out, in]; scale = lora_alpha / r = 8 / 2 = 4, as above.
    std::fs::write(
        peft.join("adapter_config.json"),
        r#"{"r": 2, "lora_alpha": 8}"#,
    )
    .unwrap();
    let a_t = t[0].1.t();
    let b_t = t[1].1.t();
    Array::save_safetensors(
        [
            (
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                &a_t,
            ),
            (
                "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                &b_t,
            ),
        ],
        None,
        peft.join("adapter_model.safetensors"),
    )
    .unwrap();
    let mut reg = AdapterRegistry::new(modules());
    let a = reg.mount(&mlx).unwrap();
    let b = reg.mount(&peft).unwrap();
    let reg = Rc::new(reg);
    let x = normal(&[1, 3, 8], 5);
    let y = normal(&[1, 3, 16], 6);
    let run = |id| {
        Activation::uniform(reg.clone(), AdapterStack::single(id), 1)
            .unwrap()
            .unwrap()
            .apply(Q, &x, y.clone())
            .unwrap()
    };
    assert_eq!(max_abs(&run(a), &run(b)), 0.0);
}

#[test]
fn per_row_adapters_equal_the_one_row_path_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut reg = AdapterRegistry::new(modules());
    let one = tmp.path().join("one");
    write_adapter(&one, MLX_CONFIG, &good_tensors());
    let two = tmp.path().join("two");
    let t2 = vec![
        (
            "language_model.model.layers.0.self_attn.q_proj.lora_a",
            normal(&[8, 4], 11),
        ),
        (
            "language_model.model.layers.0.self_attn.q_proj.lora_b",
            normal(&[4, 16], 12),
        ),
    ];
    write_adapter(&two, MLX_CONFIG, &t2);
    let a = reg.mount(&one).unwrap();
    let b = reg.mount(&two).unwrap();
    let reg = Rc::new(reg);
    let stacks = vec![
        AdapterStack::none(),
        AdapterStack::single(a),
        AdapterStack::single(b),
        AdapterStack::new(vec![a, b]),
        AdapterStack::new(vec![b, a]),
    ];
    let x = normal(&[5, 1, 8], 20);
    let y = normal(&[5, 1, 16], 21);
    let batched = Activation::per_row(reg.clone(), stacks.clone())
        .unwrap()
        .unwrap()
        .apply(Q, &x, y.clone())
        .unwrap();
    batched.eval().unwrap();
    for (r, stack) in stacks.into_iter().enumerate() {
        let r = r as i32;
        let (xr, yr) = (
            x.try_index(r..r + 1).unwrap(),
            y.try_index(r..r + 1).unwrap(),
        );
        let serial = match Activation::uniform(reg.clone(), stack, 1).unwrap() {
            Some(act) => act.apply(Q, &xr, yr).unwrap(),
            None => yr,
        };
        serial.eval().unwrap();
        let got = batched.try_index(r..r + 1).unwrap();
        got.eval().unwrap();
        let bits = |a: &Array| {
            a.as_slice::<f32>()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got), bits(&serial), "row {r}");
    }
}

#[test]
fn missing_lora_b() {
    let mut t = good_tensors();
    t.remove(1);
    let e = mount_err(&t);
    assert!(
        e.contains("language_model.model.layers.0.self_attn.q_proj.lora_a")
            && e.contains("lora_b is missing"),
        "{e}"
    );
}

#[test]
fn rank_mismatch_between_a_and_b() {
    let mut t = good_tensors();
    t[1].1 = normal(&[3, 16], 7);
    let e = mount_err(&t);
    assert!(
        e.contains("self_attn.q_proj.lora_b") && e.contains("[3, 16]") && e.contains("[2, 16]"),
        "{e}"
    );
}

#[test]
fn wrong_in_and_out_features() {
    let mut t = good_tensors();
    t[0].1 = normal(&[9, 2], 7);
    t[3].1 = normal(&[3, 7], 8);
    let e = mount_err(&t);
    assert!(
        e.contains("q_proj.lora_a: shape [9, 2], expected [8, 2]")
            && e.contains("down_proj.lora_b: shape [3, 7], expected [3, 8]"),
        "{e}"
    );
}

#[test]
fn unknown_and_untargetable_modules() {
    let mut t = good_tensors();
    t.push(("model.layers.7.mlp.up_proj.lora_a", normal(&[8, 2], 1)));
    t.push(("model.layers.7.mlp.up_proj.lora_b", normal(&[2, 8], 1)));
    let e = mount_err(&t);
    assert!(
        e.contains("model.layers.7.mlp.up_proj.lora_a: unknown module"),
        "{e}"
    );
    let mut t = good_tensors();
    t.push((
        "model.per_layer_model_projection.lora_a",
        normal(&[8, 2], 1),
    ));
    t.push((
        "model.per_layer_model_projection.lora_b",
        normal(&[2, 24], 1),
    ));
    let e = mount_err(&t);
    assert!(
        e.contains("per_layer_model_projection") && e.contains("cannot carry LoRA"),
        "{e}"
    );
}

#[test]
fn not_lora_tensors_and_empty_adapters() {
    let mut t = good_tensors();
    t.push(("model.layers.0.self_attn.q_proj.m", normal(&[16], 1)));
    let e = mount_err(&t);
    assert!(e.contains("q_proj.m: not a LoRA factor"), "{e}");
    let e = mount_err(&[("model.layers.0.self_attn.q_proj.scales", normal(&[2], 1))]);
    assert!(e.contains("not a LoRA factor"), "{e}");
}

#[test]
fn config_and_file_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let mut reg = AdapterRegistry::new(modules());
    let no_scale = tmp.path().join("no-scale");
    write_adapter(
        &no_scale,
        r#"{"lora_parameters": {"rank": 2}}"#,
        &good_tensors(),
    );
    let e = reg.mount(&no_scale).unwrap_err().to_string();
    assert!(
        e.contains("adapter_config.json") && e.contains("no LoRA scale"),
        "{e}"
    );
    let e = reg
        .mount(&tmp.path().join("absent"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent"), "{e}");
    let no_weights = tmp.path().join("no-weights");
    std::fs::create_dir_all(&no_weights).unwrap();
    std::fs::write(no_weights.join("adapter_config.json"), MLX_CONFIG).unwrap();
    let e = reg.mount(&no_weights).unwrap_err().to_string();
    assert!(e.contains("adapters.safetensors"), "{e}");
    // The fine-tuner's own config name, with rsLoRA: 16 / sqrt(4) = 8.
    let optiq = tmp.path().join("optiq");
    std::fs::create_dir_all(&optiq).unwrap();
    std::fs::write(
        optiq.join("optiq_lora_config.json"),
        r#"{"lora_parameters": {"rank": 4, "scale": 16.0, "rs_lora": true}}"#,
    )
    .unwrap();
    let t = [
        ("model.layers.0.self_attn.q_proj.lora_a", normal(&[8, 4], 1)),
        (
            "model.layers.0.self_attn.q_proj.lora_b",
            normal(&[4, 16], 2),
        ),
    ];
    let pairs: Vec<(&str, &Array)> = t.iter().map(|(k, v)| (*k, v)).collect();
    Array::save_safetensors(pairs, None, optiq.join("adapters.safetensors")).unwrap();
    let id = reg.mount(&optiq).unwrap();
    assert_eq!(reg.pairs(Q).unwrap()[0].1.scale(), 8.0);
    // Same name twice.
    let e = reg.mount_named("optiq", &optiq).unwrap_err().to_string();
    assert!(e.contains("already mounted"), "{e}");
    assert_eq!(reg.adapters().len(), 1);
    assert_eq!(reg.adapters()[0].id, id);
}
