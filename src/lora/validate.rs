//! Checking every LoRA pair of an adapter against the base model's modules, before anything
//! is mounted: all problems are collected and reported together, each naming the tensor.
use std::collections::{BTreeMap, HashMap};

use mlx_rs::{Array, Dtype};

use super::adapter::AdapterFiles;
use super::names::{canonical_module, is_target, parse_tensor_name, Factor, Layout, TARGETS};
use crate::error::{Error, Result};

/// A linear module of the base model, as LoRA sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleShape {
    /// The model's own module path (what `Linear::path` returns).
    pub path: String,
    /// Input features.
    pub in_dim: i32,
    /// Output features.
    pub out_dim: i32,
}

/// The base model's linear modules, indexed by canonical path.
#[derive(Debug, Clone, Default)]
pub struct ModuleTable {
    by_canonical: HashMap<String, ModuleShape>,
}

impl ModuleTable {
    /// Indexes `modules`; later duplicates of a canonical path are ignored (a model has none).
    pub fn new(modules: impl IntoIterator<Item = ModuleShape>) -> ModuleTable {
        let mut by_canonical = HashMap::new();
        for m in modules {
            by_canonical
                .entry(canonical_module(&m.path).to_string())
                .or_insert(m);
        }
        ModuleTable { by_canonical }
    }

    /// The module with canonical path `canonical`.
    pub fn get(&self, canonical: &str) -> Option<&ModuleShape> {
        self.by_canonical.get(canonical)
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.by_canonical.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.by_canonical.is_empty()
    }
}

/// A checked pair, in mlx-lm's orientation, ready to mount on `module`.
#[derive(Debug, Clone)]
pub struct ValidPair {
    /// The base module's own path.
    pub module: String,
    /// `[in, r]`.
    pub a: Array,
    /// `[r, out]`.
    pub b: Array,
    /// `r`.
    pub rank: i32,
}

struct Found<'a> {
    name: &'a str,
    array: &'a Array,
    layout: Layout,
}

#[derive(Default)]
struct PairSlots<'a> {
    a: Option<Found<'a>>,
    b: Option<Found<'a>>,
}

/// The shape a factor should have in the file's own layout.
fn file_shape(layout: Layout, factor: Factor, rank: i32, m: &ModuleShape) -> [i32; 2] {
    match (layout, factor) {
        (Layout::Mlx, Factor::A) => [m.in_dim, rank],
        (Layout::Mlx, Factor::B) => [rank, m.out_dim],
        (Layout::Peft, Factor::A) => [rank, m.in_dim],
        (Layout::Peft, Factor::B) => [m.out_dim, rank],
    }
}

/// The rank a factor's shape implies in its layout (`None` unless it is 2-D).
fn rank_of(f: &Found, factor: Factor) -> Option<i32> {
    let &[r0, r1] = f.array.shape() else {
        return None;
    };
    Some(match (f.layout, factor) {
        (Layout::Mlx, Factor::A) | (Layout::Peft, Factor::B) => r1,
        (Layout::Mlx, Factor::B) | (Layout::Peft, Factor::A) => r0,
    })
}

/// Checks every tensor of `files` against `table`; returns the pairs sorted by module path.
///
/// Errors (all listed, one per line): a tensor that is not a LoRA factor, an unknown module, a
/// module LoRA may not target, a missing `lora_a` / `lora_b`, a factor spelled twice, a
/// non-float or non-2-D factor, a rank that differs between A and B, input / output features
/// that differ from the module's, and an adapter with no pair at all.
pub fn validate(files: &AdapterFiles, table: &ModuleTable) -> Result<Vec<ValidPair>> {
    let mut errors: Vec<String> = Vec::new();
    // Canonical module -> its two factors; BTreeMap for a stable error and mount order.
    let mut pairs: BTreeMap<String, PairSlots> = BTreeMap::new();
    let mut tensors: Vec<(&String, &Array)> = files.tensors.iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(b.0));
    for (name, array) in tensors {
        let Some(t) = parse_tensor_name(name) else {
            errors.push(format!(
                "tensor {name}: not a LoRA factor (expected <module>.lora_a / .lora_b, \
                 or peft's .lora_A.weight / .lora_B.weight)"
            ));
            continue;
        };
        let canonical = canonical_module(&t.module).to_string();
        let slots = pairs.entry(canonical).or_default();
        let slot = match t.factor {
            Factor::A => &mut slots.a,
            Factor::B => &mut slots.b,
        };
        if let Some(prev) = slot {
            errors.push(format!(
                "tensor {name}: same factor of the same module as tensor {}",
                prev.name
            ));
            continue;
        }
        *slot = Some(Found {
            name,
            array,
            layout: t.layout,
        });
    }

    let mut valid = Vec::with_capacity(pairs.len());
    for (canonical, slots) in &pairs {
        let any = slots.a.as_ref().or(slots.b.as_ref());
        let Some(any) = any else { continue };
        let Some(module) = table.get(canonical) else {
            errors.push(format!(
                "tensor {}: unknown module {canonical:?}: the base model has no such linear layer",
                any.name
            ));
            continue;
        };
        if !is_target(canonical) {
            errors.push(format!(
                "tensor {}: module {canonical:?} cannot carry LoRA (targets: layers.<n>.{{{}}})",
                any.name,
                TARGETS.join(", ")
            ));
            continue;
        }
        let (Some(a), Some(b)) = (&slots.a, &slots.b) else {
            let (have, missing) = match &slots.a {
                Some(a) => (a.name, "lora_b"),
                None => (any.name, "lora_a"),
            };
            errors.push(format!(
                "tensor {have}: its pair's {missing} is missing (module {canonical:?})"
            ));
            continue;
        };
        let mut ok = true;
        for (f, factor) in [(a, Factor::A), (b, Factor::B)] {
            if !matches!(
                f.array.dtype(),
                Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
            ) {
                errors.push(format!(
                    "tensor {}: dtype {:?}, expected a floating-point type",
                    f.name,
                    f.array.dtype()
                ));
                ok = false;
            } else if rank_of(f, factor).is_none() {
                errors.push(format!(
                    "tensor {}: shape {:?}, expected a 2-D matrix",
                    f.name,
                    f.array.shape()
                ));
                ok = false;
            }
        }
        if !ok {
            continue;
        }
        let (Some(ra), Some(rb)) = (rank_of(a, Factor::A), rank_of(b, Factor::B)) else {
            continue;
        };
        if ra < 1 {
            errors.push(format!(
                "tensor {}: shape {:?} gives rank {ra}",
                a.name,
                a.array.shape()
            ));
            continue;
        }
        if ra != rb {
            errors.push(format!(
                "tensor {}: shape {:?}, expected {:?}: rank {rb} but its lora_a {} has rank {ra}",
                b.name,
                b.array.shape(),
                file_shape(b.layout, Factor::B, ra, module),
                a.name
            ));
            continue;
        }
        for (f, factor) in [(a, Factor::A), (b, Factor::B)] {
            let want = file_shape(f.layout, factor, ra, module);
            if f.array.shape() != want {
                errors.push(format!(
                    "tensor {}: shape {:?}, expected {:?} (module {} has {} inputs, {} outputs)",
                    f.name,
                    f.array.shape(),
                    want,
                    module.path,
                    module.in_dim,
                    module.out_dim
                ));
                ok = false;
            }
        }
        if !ok {
            continue;
        }
        let orient = |f: &Found| -> Result<Array> {
            Ok(match f.layout {
                Layout::Mlx => f.array.clone(),
                Layout::Peft => f.array.t(),
            })
        };
        valid.push(ValidPair {
            module: module.path.clone(),
            a: orient(a)?,
            b: orient(b)?,
            rank: ra,
        });
    }
    if errors.is_empty() && valid.is_empty() {
        errors.push(format!(
            "{} has no LoRA pair for this model",
            files.weights_file.display()
        ));
    }
    if !errors.is_empty() {
        return Err(Error::Adapter {
            dir: files.dir.clone(),
            message: errors.join("\n"),
        });
    }
    Ok(valid)
}
