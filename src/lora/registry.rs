//! The adapters mounted on one model: read and validated once at start-up, immutable after
//! (shared through an `Rc` by every forward call that uses them).
//!
//! `Rc`, not `Arc`: MLX arrays are `Send` but not `Sync`, so the registry (itself `Send`)
//! lives on the thread that runs the model; build it there, or move it there, then wrap it.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::ops::matmul;
use mlx_rs::Array;

use super::adapter::AdapterFiles;
use super::validate::{validate, ModuleShape, ModuleTable};
use crate::error::{Error, Result};

/// A mounted adapter, by position in its registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub(crate) u32);

impl AdapterId {
    /// The index of the adapter in [`AdapterRegistry::adapters`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a mounted adapter is.
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    /// Its id.
    pub id: AdapterId,
    /// The name generations select it by (e.g. `memory-chunk`).
    pub name: String,
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Modules it changes.
    pub modules: usize,
    /// Bytes of its tensors.
    pub bytes: usize,
}

/// One module's low-rank update: `cast(scale * ((x @ a) @ b), x.dtype)`.
#[derive(Debug, Clone)]
pub struct LoraPair {
    a: Array,
    b: Array,
    scale: f32,
    rank: i32,
}

impl LoraPair {
    /// The delta this pair adds to the module's output for input `x`, op for op as mlx-lm's
    /// `LoRALinear`: the scale is a weak scalar (cast to the product's dtype, like a Python
    /// float), and the result is cast back to the activation dtype.
    pub fn delta(&self, x: &Array) -> Result<Array> {
        let z = matmul(matmul(x, &self.a)?, &self.b)?;
        let s = Array::from_f32(self.scale).as_dtype(z.dtype())?;
        Ok(s.multiply(&z)?.as_dtype(x.dtype())?)
    }

    /// The scale applied (after any rsLoRA / alpha rule).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The rank.
    pub fn rank(&self) -> i32 {
        self.rank
    }
}

/// All adapters mounted on one model, and per module the pairs that target it.
#[derive(Debug)]
pub struct AdapterRegistry {
    table: ModuleTable,
    adapters: Vec<AdapterInfo>,
    /// Model module path -> (adapter, pair), in mount order.
    modules: HashMap<String, Vec<(AdapterId, LoraPair)>>,
}

impl AdapterRegistry {
    /// An empty registry for a model with these linear modules.
    pub fn new(modules: impl IntoIterator<Item = ModuleShape>) -> AdapterRegistry {
        AdapterRegistry {
            table: ModuleTable::new(modules),
            adapters: Vec::new(),
            modules: HashMap::new(),
        }
    }

    /// Mounts the adapter in `dir` under its directory name.
    pub fn mount(&mut self, dir: &Path) -> Result<AdapterId> {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::Adapter {
                dir: dir.to_path_buf(),
                message: "cannot name the adapter after this directory; give a name".into(),
            })?
            .to_string();
        self.mount_named(&name, dir)
    }

    /// Reads `dir`, checks every pair against the model and only then mounts it as `name`.
    /// On any error the registry is unchanged (other adapters, and the base model, stay
    /// usable).
    pub fn mount_named(&mut self, name: &str, dir: &Path) -> Result<AdapterId> {
        let err = |message: String| Error::Adapter {
            dir: dir.to_path_buf(),
            message,
        };
        if name.is_empty() {
            return Err(err("empty adapter name".into()));
        }
        if self.id(name).is_some() {
            return Err(err(format!("an adapter named {name:?} is already mounted")));
        }
        let id = AdapterId(
            u32::try_from(self.adapters.len()).map_err(|_| err("too many adapters".into()))?,
        );
        let files = AdapterFiles::read(dir)?;
        let pairs = validate(&files, &self.table)?;
        // Read the tensors now: a truncated file fails here, not in the middle of a generation.
        mlx_rs::transforms::eval(pairs.iter().flat_map(|p| [&p.a, &p.b])).map_err(|e| {
            Error::InvalidFile {
                path: files.weights_file.clone(),
                reason: e.to_string(),
            }
        })?;
        let bytes = pairs.iter().map(|p| p.a.nbytes() + p.b.nbytes()).sum();
        let modules = pairs.len();
        for p in pairs {
            let pair = LoraPair {
                scale: files.scale.for_rank(p.rank),
                a: p.a,
                b: p.b,
                rank: p.rank,
            };
            self.modules.entry(p.module).or_default().push((id, pair));
        }
        self.adapters.push(AdapterInfo {
            id,
            name: name.to_string(),
            dir: dir.to_path_buf(),
            modules,
            bytes,
        });
        Ok(id)
    }

    /// The adapter mounted as `name`.
    pub fn id(&self, name: &str) -> Option<AdapterId> {
        self.adapters.iter().find(|a| a.name == name).map(|a| a.id)
    }

    /// Every mounted adapter, in mount order (index = [`AdapterId::index`]).
    pub fn adapters(&self) -> &[AdapterInfo] {
        &self.adapters
    }

    /// The adapter `id`.
    pub fn info(&self, id: AdapterId) -> Option<&AdapterInfo> {
        self.adapters.get(id.index())
    }

    /// The pairs on the model module `path`, in mount order.
    pub fn pairs(&self, path: &str) -> Option<&[(AdapterId, LoraPair)]> {
        self.modules.get(path).map(Vec::as_slice)
    }
}
