//! Checkpoint tensors: safetensors loading (single file or shards) and strict key accounting.
//!
//! Every tensor must be taken by a module or explicitly ignored; [`Weights::finish`] fails on
//! any left over, so a renamed or unexpected key can never be silently skipped.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mlx_rs::ops::dequantize;
use mlx_rs::{Array, Dtype};

use serde_json::Value;

use super::config::QuantConfig;

use crate::error::{Error, Result};

struct Entry {
    array: Array,
    file: PathBuf,
}

/// The tensors of one checkpoint, keyed by (sanitized) name.
pub struct Weights {
    dir: PathBuf,
    tensors: BTreeMap<String, Entry>,
    /// Tensors handed out so far, by name, evaluated (read from disk) together by `finish`.
    taken: BTreeMap<String, Array>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    }
}

/// The safetensors files of a model directory: the shards named by
/// `model.safetensors.index.json` when present, else every `*.safetensors` file.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
            path: index.clone(),
            source,
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Error::Config {
            path: index.clone(),
            message: e.to_string(),
        })?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::Config {
                path: index.clone(),
                message: "missing object weight_map".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::Io {
            path: dir.join("model.safetensors"),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no *.safetensors file in the model directory",
            ),
        });
    }
    Ok(files)
}

impl Weights {
    /// Loads (lazily: MLX reads the data on first evaluation) every tensor of `dir`.
    pub fn load(dir: &Path) -> Result<Weights> {
        let mut tensors = BTreeMap::new();
        for file in weight_files(dir)? {
            if !file.exists() {
                return Err(Error::Io {
                    path: file,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "weight shard not found",
                    ),
                });
            }
            let map: HashMap<String, Array> =
                Array::load_safetensors(&file).map_err(|e| io_err(&file, e))?;
            for (name, array) in map {
                if let Some(prev) = tensors.insert(
                    name.clone(),
                    Entry {
                        array,
                        file: file.clone(),
                    },
                ) {
                    return Err(Error::Tensor {
                        tensor: name,
                        file,
                        message: format!("also present in {}", prev.file.display()),
                    });
                }
            }
        }
        Ok(Weights {
            dir: dir.to_path_buf(),
            tensors,
            taken: BTreeMap::new(),
        })
    }

    /// Renames or drops tensors: `f(name)` returns the new name, or `None` to ignore it.
    /// This is the only place keys change (mlx-lm's `sanitize`).
    pub fn sanitize(&mut self, f: impl Fn(&str) -> Option<String>) -> Result<()> {
        let old = std::mem::take(&mut self.tensors);
        for (name, entry) in old {
            if let Some(new) = f(&name) {
                if self.tensors.contains_key(&new) {
                    return Err(Error::Tensor {
                        tensor: new,
                        file: entry.file,
                        message: format!("duplicate after renaming {name:?}"),
                    });
                }
                self.tensors.insert(new, entry);
            }
        }
        Ok(())
    }

    /// Whether `name` is present (and not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn missing(&self, name: &str) -> Error {
        Error::Tensor {
            tensor: name.to_string(),
            file: self.dir.clone(),
            message: "missing from the checkpoint".into(),
        }
    }

    /// Removes and returns `name` with its file, whatever its shape.
    pub fn take_raw(&mut self, name: &str) -> Result<(Array, PathBuf)> {
        match self.tensors.remove(name) {
            Some(e) => {
                self.taken.insert(name.to_string(), e.array.clone());
                Ok((e.array, e.file))
            }
            None => Err(self.missing(name)),
        }
    }

    /// Removes and returns the floating-point tensor `name`, checking its shape.
    pub fn take_float(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let (a, file) = self.take_raw(name)?;
        check_shape(name, &file, &a, shape)?;
        check_float(name, &file, &a)?;
        Ok(a)
    }

    /// Lets go of taken tensor `name`: [`Weights::finish`] will not read it. For a caller
    /// that has already evaluated what it built from the tensor and drops the original (a
    /// fused matrix): holding it until `finish` would keep both copies in memory.
    pub fn release(&mut self, name: &str) {
        self.taken.remove(name);
    }

    /// Bytes of the tensors not yet taken.
    pub fn nbytes(&self) -> usize {
        self.tensors.values().map(|e| e.array.nbytes()).sum()
    }

    /// What the dense form would look like: whether any matrix is quantized, whether all
    /// their scales are float32, and the bytes of every tensor once dequantized.
    pub fn dense_estimate(&self, quant: &QuantConfig) -> (bool, bool, u64) {
        let mut quantized = false;
        let mut f32_scales = true;
        let mut bytes = 0u64;
        for (name, e) in &self.tensors {
            let module = name.strip_suffix(".weight");
            let packed = module.and_then(|m| Some((m, self.tensors.get(&format!("{m}.scales"))?)));
            match packed {
                Some((m, scales)) => {
                    quantized = true;
                    f32_scales &= scales.array.dtype() == Dtype::Float32;
                    // Packed uint32 words hold 32 / bits values; the dense row has
                    // `words * 32 / bits` elements of the scales' dtype.
                    let elems = e.array.size() as u64 * 32;
                    let item = scales.array.item_size() as u64;
                    let bits = quant.for_module(m).map_or(4, |p| p.bits).max(1);
                    bytes += elems * item / bits as u64;
                }
                None if name.ends_with(".scales") || name.ends_with(".biases") => {}
                None => bytes += e.array.nbytes() as u64,
            }
        }
        (quantized, quantized && f32_scales, bytes)
    }

    /// Replaces every quantized matrix (`M.weight` + `M.scales` + `M.biases`) by its dense,
    /// dequantized `M.weight` in the scales' dtype (see [`super::weight_form`]). Returns how
    /// many matrices it dequantized. The values are computed lazily, with the rest of the
    /// checkpoint in [`Weights::finish`].
    pub fn dequantize(&mut self, quant: &QuantConfig) -> Result<usize> {
        let modules: Vec<String> = self
            .tensors
            .keys()
            .filter_map(|k| k.strip_suffix(".scales").map(str::to_string))
            .collect();
        for m in &modules {
            let weight_key = format!("{m}.weight");
            let Some(params) = quant.for_module(m) else {
                let file = self.tensors.get(&weight_key).map(|e| e.file.clone());
                return Err(Error::Tensor {
                    tensor: format!("{m}.scales"),
                    file: file.unwrap_or_else(|| self.dir.clone()),
                    message: "config.json gives no quantization parameters for this module, \
                              so it cannot be dequantized"
                        .into(),
                });
            };
            let (w, file) = self.remove(&weight_key)?;
            let (scales, _) = self.remove(&format!("{m}.scales"))?;
            let (biases, _) = self.remove(&format!("{m}.biases"))?;
            let dense =
                dequantize(&w, &scales, &biases, params.group_size, params.bits).map_err(|e| {
                    Error::Tensor {
                        tensor: weight_key.clone(),
                        file: file.clone(),
                        message: format!("dequantize: {e}"),
                    }
                })?;
            self.tensors
                .insert(weight_key, Entry { array: dense, file });
        }
        Ok(modules.len())
    }

    fn remove(&mut self, name: &str) -> Result<(Array, PathBuf)> {
        match self.tensors.remove(name) {
            Some(e) => Ok((e.array, e.file)),
            None => Err(self.missing(name)),
        }
    }

    /// Fails if any tensor was neither taken nor ignored; else reads every taken tensor.
    pub fn finish(self) -> Result<()> {
        match self.tensors.into_iter().next() {
            None => {
                mlx_rs::transforms::eval(self.taken.values())?;
                Ok(())
            }
            Some((name, e)) => Err(Error::Tensor {
                tensor: name,
                file: e.file,
                message: "unexpected tensor: the model has no parameter of that name".into(),
            }),
        }
    }
}

/// Fails unless `a` has exactly `shape`.
pub fn check_shape(name: &str, file: &Path, a: &Array, shape: &[i32]) -> Result<()> {
    if a.shape() != shape {
        return Err(Error::Tensor {
            tensor: name.to_string(),
            file: file.to_path_buf(),
            message: format!("shape {:?}, expected {:?}", a.shape(), shape),
        });
    }
    Ok(())
}

/// Fails unless `a` holds floating-point values.
pub fn check_float(name: &str, file: &Path, a: &Array) -> Result<()> {
    if !matches!(a.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        return Err(Error::Tensor {
            tensor: name.to_string(),
            file: file.to_path_buf(),
            message: format!("dtype {:?}, expected a floating-point type", a.dtype()),
        });
    }
    Ok(())
}
