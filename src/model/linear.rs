//! Linear layers (dense or MLX affine-quantized) and the embedding table, which doubles as the
//! tied output head (`as_linear`).
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, dequantize, matmul, quantized_matmul, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::config::{QuantConfig, QuantParams};
use super::weights::{check_float, check_shape, Weights};
use super::ForwardCtx;
use crate::error::{Error, Result};

/// The stored form of a weight matrix `[out, in]` (a dense one with zero rows appended up to
/// [`padded_out_dim`]).
enum Matrix {
    Dense { weight: Array },
    Quantized(QuantizedMatrix),
}

/// An MLX affine-quantized matrix `[out, in]`: packed `uint32` words `[out, in * bits / 32]`,
/// one scale and one bias per group of `group_size` inputs (`[out, in / group_size]`).
pub(super) struct QuantizedMatrix {
    pub(super) weight: Array,
    pub(super) scales: Array,
    pub(super) biases: Array,
    pub(super) params: QuantParams,
}

impl QuantizedMatrix {
    /// `x W^T` over the last axis of `x`, through MLX's quantized kernel: the one place a
    /// packed product is built, so a lone layer and a fused group (see
    /// [`super::linear_group`]) run the very same operation. A one-position input of two or
    /// more rows runs through memexec's row-exact kernel where [`ForwardCtx::product_kernel`]
    /// allows it and the weights suit it ([`super::quantized_rows`]), one of a single row
    /// through the one-row kernel where [`ForwardCtx::row_kernel`] takes it
    /// ([`super::quantized_row`]); otherwise one of more
    /// rows than [`ForwardCtx::product_rows`] runs as balanced row chunks.
    pub(super) fn matmul(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        let rows = x.dim(0).max(1) as usize;
        let one_position = x.ndim() == 3 && x.dim(1) == 1;
        if one_position && rows == 1 && ctx.row_kernel.takes(|| self.nbytes()) {
            if let Some(y) = super::quantized_row::product(x, self)? {
                return Ok(y);
            }
        }
        // The rows kernel also below MLX's own row limit, where MLX's `qmv` would give the same
        // bits: `qmv` runs one row per block and so reads the weights once per row, the kernel
        // once per eight rows. H200, session 21: a verification step of 5 rows waited 13.2 ->
        // 5.6 ms for the device (right drafts 198 -> 230 tok/s), EXTRACT at width 4 3605 /
        // 3710 -> 2925 / 3343 ms; width 2 unchanged (4701 / 5070 vs 5285 / 4934 ms).
        if one_position && rows > 1 && ctx.product_kernel {
            if let Some(y) = super::quantized_rows::product(x, self)? {
                return Ok(y);
            }
        }
        match ctx.product_rows {
            Some(max) if one_position && rows > max.max(1) => {
                let chunks = rows.div_ceil(max.max(1));
                let bounds: Vec<i32> = (1..chunks).map(|i| (i * rows / chunks) as i32).collect();
                let parts = x
                    .split_at_indices(&bounds, 0)?
                    .iter()
                    .map(|part| self.product(part))
                    .collect::<Result<Vec<_>>>()?;
                Ok(concatenate(&parts, 0)?)
            }
            _ => self.product(x),
        }
    }

    /// `w` (`[out, in]`) quantized by MLX (affine, `group_size` inputs per scale and bias,
    /// `bits` bits): how the product kernels' self-checks and tests make their matrices.
    pub(super) fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<QuantizedMatrix> {
        let (weight, scales, biases) = mlx_rs::ops::quantize(w, group_size, bits)?;
        Ok(QuantizedMatrix {
            weight,
            scales,
            biases,
            params: QuantParams { group_size, bits },
        })
    }

    /// MLX's quantized product of `x` (whatever kernel MLX picks for its row count).
    pub(super) fn product(&self, x: &Array) -> Result<Array> {
        // transpose = true: mlx-rs defaults to false, unlike Python's nn.QuantizedLinear.
        Ok(quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            &self.biases,
            true,
            self.params.group_size,
            self.params.bits,
        )?)
    }

    /// Bytes held by the packed words, scales and biases.
    pub(super) fn nbytes(&self) -> usize {
        self.weight.nbytes() + self.scales.nbytes() + self.biases.nbytes()
    }
}

/// A linear module's path and shape: what LoRA validation checks adapters against
/// (`Model::linear_modules`), whether the module runs alone or inside a fused group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearShape<'a> {
    /// The module path (see [`Linear::path`]).
    pub path: &'a str,
    /// Input features.
    pub in_dim: i32,
    /// Output features.
    pub out_dim: i32,
}

/// A bias-free linear layer `y = x W^T`, dense or quantized, that knows its module path.
pub struct Linear {
    path: String,
    in_dim: i32,
    out_dim: i32,
    matrix: Matrix,
}

impl Linear {
    /// The arrays that hold the matrix (dense weight, or packed words, scales and biases).
    fn arrays(&self) -> Vec<&Array> {
        match &self.matrix {
            Matrix::Dense { weight } => vec![weight],
            Matrix::Quantized(q) => vec![&q.weight, &q.scales, &q.biases],
        }
    }

    /// Takes `{path}.weight` (and `.scales` / `.biases` when quantized) out of `w`.
    ///
    /// Quantized exactly where the checkpoint has `{path}.scales`; bits and group size come
    /// from the config (per-module override, else default) or, absent both, from the shapes.
    pub fn load(
        w: &mut Weights,
        quant: &QuantConfig,
        path: &str,
        in_dim: i32,
        out_dim: i32,
    ) -> Result<Linear> {
        let scales_key = format!("{path}.scales");
        let weight_key = format!("{path}.weight");
        let matrix = if w.contains(&scales_key) {
            let (weight, file) = w.take_raw(&weight_key)?;
            let (scales, sfile) = w.take_raw(&scales_key)?;
            let biases_key = format!("{path}.biases");
            let (biases, bfile) = w.take_raw(&biases_key)?;
            let tensor_err =
                |tensor: &str, file: &std::path::Path, message: String| Error::Tensor {
                    tensor: tensor.to_string(),
                    file: file.to_path_buf(),
                    message,
                };
            if weight.dtype() != Dtype::Uint32 || weight.ndim() != 2 {
                return Err(tensor_err(
                    &weight_key,
                    &file,
                    format!(
                        "quantized weight must be 2-D uint32, got {:?} {:?}",
                        weight.dtype(),
                        weight.shape()
                    ),
                ));
            }
            let params = match quant.overrides.get(path) {
                Some(None) => {
                    return Err(tensor_err(
                        &scales_key,
                        &sfile,
                        "config.json marks this module unquantized (false) but it has scales".into(),
                    ))
                }
                Some(Some(p)) => *p,
                None => match quant.default {
                    Some(p) => p,
                    None => infer_params(&weight, &scales, in_dim).ok_or_else(|| {
                        tensor_err(
                            &weight_key,
                            &file,
                            format!(
                                "cannot infer bits / group size from shapes {:?} and {:?} for {in_dim} inputs",
                                weight.shape(),
                                scales.shape()
                            ),
                        )
                    })?,
                },
            };
            if in_dim % params.group_size != 0 || (in_dim * params.bits) % 32 != 0 {
                return Err(tensor_err(
                    &weight_key,
                    &file,
                    format!(
                        "{in_dim} inputs do not fit {}-bit groups of {}",
                        params.bits, params.group_size
                    ),
                ));
            }
            let groups = in_dim / params.group_size;
            check_shape(
                &weight_key,
                &file,
                &weight,
                &[out_dim, in_dim * params.bits / 32],
            )?;
            check_shape(&scales_key, &sfile, &scales, &[out_dim, groups])?;
            check_float(&scales_key, &sfile, &scales)?;
            check_shape(&biases_key, &bfile, &biases, &[out_dim, groups])?;
            check_float(&biases_key, &bfile, &biases)?;
            Matrix::Quantized(QuantizedMatrix {
                weight,
                scales,
                biases,
                params,
            })
        } else {
            Matrix::Dense {
                weight: pad_outputs(w.take_float(&weight_key, &[out_dim, in_dim])?)?,
            }
        };
        Ok(Linear {
            path: path.to_string(),
            in_dim,
            out_dim,
            matrix,
        })
    }

    /// The module path, e.g. `language_model.model.layers.3.self_attn.q_proj` (adapters are
    /// matched on it).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Input features.
    pub fn in_dim(&self) -> i32 {
        self.in_dim
    }

    /// Output features.
    pub fn out_dim(&self) -> i32 {
        self.out_dim
    }

    /// Path and shape together.
    pub fn shape(&self) -> LinearShape<'_> {
        LinearShape {
            path: &self.path,
            in_dim: self.in_dim,
            out_dim: self.out_dim,
        }
    }

    /// The packed matrix, when this layer is quantized.
    pub(super) fn quantized(&self) -> Option<&QuantizedMatrix> {
        match &self.matrix {
            Matrix::Quantized(q) => Some(q),
            Matrix::Dense { .. } => None,
        }
    }

    /// The checkpoint tensors [`Linear::load`] took for `path`, quantized or not.
    pub(super) fn tensor_names(&self) -> Vec<String> {
        let suffixes: &[&str] = match self.matrix {
            Matrix::Quantized(_) => &["weight", "scales", "biases"],
            Matrix::Dense { .. } => &["weight"],
        };
        suffixes
            .iter()
            .map(|s| format!("{}.{s}", self.path))
            .collect()
    }

    /// The dtype of the values this layer produces from a same-dtype input.
    pub fn dtype(&self) -> Dtype {
        match &self.matrix {
            Matrix::Dense { weight } => weight.dtype(),
            Matrix::Quantized(q) => q.scales.dtype(),
        }
    }

    /// Bytes held by this layer's tensors.
    pub fn nbytes(&self) -> usize {
        match &self.matrix {
            Matrix::Dense { weight } => weight.nbytes(),
            Matrix::Quantized(q) => q.nbytes(),
        }
    }

    /// `x W^T` over the last axis of `x`.
    /// Rows with LoRA adapters on this module get their deltas added (see [`crate::lora`]).
    pub fn forward(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        with_adapters(&self.path, x, self.forward_base(x, ctx)?, ctx)
    }

    fn forward_base(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        Ok(match &self.matrix {
            Matrix::Dense { weight } => dense_matmul(x, weight, self.out_dim)?,
            Matrix::Quantized(q) => q.matmul(x, ctx)?,
        })
    }

    /// Rows `ids` of the (dequantized) matrix: `[..ids.shape, in]`.
    fn rows(&self, ids: &Array) -> Result<Array> {
        Ok(match &self.matrix {
            Matrix::Dense { weight } => weight.take_axis(ids, 0)?,
            Matrix::Quantized(q) => dequantize(
                q.weight.take_axis(ids, 0)?,
                q.scales.take_axis(ids, 0)?,
                &q.biases.take_axis(ids, 0)?,
                q.params.group_size,
                q.params.bits,
            )?,
        })
    }

    fn forward_head(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        self.forward_base(x, ctx)
    }
}

/// `y`, the base output of module `path` for input `x`, plus the LoRA deltas `ctx` gives that
/// module's rows. The one place adapters meet a linear layer, so a lone layer and a part of a
/// fused group (see [`super::linear_group`]) add them identically.
pub(super) fn with_adapters(path: &str, x: &Array, y: Array, ctx: &ForwardCtx) -> Result<Array> {
    match &ctx.adapters {
        Some(adapters) => adapters.apply(path, x, y),
        None => Ok(y),
    }
}

/// Rows of every dense product in a one-position forward (a decode step, `[B, 1, in]`):
/// more rows run as several products of this many, fewer are padded with zero rows.
///
/// Why: MLX runs dense f32 products through the BLAS, and OpenBLAS picks its kernel path by
/// size, so a row's bits can depend on how many rows share the call (serial vs batched
/// decode) and on its position among them. On Zen 1 (OpenBLAS 0.3.21's Haswell kernels) a
/// row's output changes between 12 and 13 rows, 24 and 32, 40 and 48, and inside a 16-row
/// product rows 7, 8 and 15 differ from row 0. With exactly eight rows every row got its
/// one-row bits at every position, whatever the other rows held, over 14 shapes, 9 OpenBLAS
/// core types and 1-16 threads (`scripts/bench/blas_row_invariance.py`). A batch of 16
/// rows reads the weights twice; still eight rows per read.
pub const DENSE_STEP_ROWS: i32 = 8;

/// Output features a dense `[out, in]` matrix is stored with: zero rows are appended at load
/// until a [`DENSE_STEP_ROWS`]-row product does at least 2^21 multiply-adds.
///
/// Why: OpenBLAS builds for AVX-512 CPUs take "small matrix" kernels under ~10^6
/// multiply-adds, whose summation order differs from the GEMM's; a small layer's decode
/// product must not flip to them. The product's extra outputs are sliced off.
pub fn padded_out_dim(out_dim: i32, in_dim: i32) -> i32 {
    const MIN_MULTIPLY_ADDS: i64 = 1 << 21;
    let per_output = DENSE_STEP_ROWS as i64 * in_dim.max(1) as i64;
    let floor = (MIN_MULTIPLY_ADDS + per_output - 1) / per_output;
    (out_dim as i64).max(floor) as i32
}

/// `weight` `[out, in]` with zero rows appended up to [`padded_out_dim`].
fn pad_outputs(weight: Array) -> Result<Array> {
    let (out_dim, in_dim) = (weight.dim(0), weight.dim(1));
    let padded = padded_out_dim(out_dim, in_dim);
    if padded == out_dim {
        return Ok(weight);
    }
    let pad = zeros_dtype(&[padded - out_dim, in_dim], weight.dtype())?;
    Ok(concatenate(&[weight, pad], 0)?)
}

/// `x W^T` for a dense `W` stored `[padded_out_dim(out), in]`, giving `out_dim` outputs.
///
/// A one-position input runs as products of exactly [`DENSE_STEP_ROWS`] rows (see there);
/// any other (a prefill chunk of one sequence) as one product with the unpadded matrix:
/// prefill needs no row independence, serial and batched paths prefill every sequence alone
/// in the same chunks.
fn dense_matmul(x: &Array, weight: &Array, out_dim: i32) -> Result<Array> {
    let shape = x.shape().to_vec();
    let in_dim = weight.dim(1);
    let rows: i32 = shape[..shape.len().saturating_sub(1)].iter().product();
    let one_position = x.ndim() == 3 && x.dim(1) == 1;
    let flat = x.reshape(&[rows, in_dim])?;
    let mut y = if one_position {
        let chunks = (rows + DENSE_STEP_ROWS - 1) / DENSE_STEP_ROWS;
        let padded = chunks * DENSE_STEP_ROWS;
        let flat = if padded > rows {
            let pad = zeros_dtype(&[padded - rows, in_dim], x.dtype())?;
            concatenate(&[flat, pad], 0)?
        } else {
            flat
        };
        let y = if chunks == 1 {
            matmul(&flat, weight.t())?
        } else {
            let parts = (0..chunks)
                .map(|c| {
                    let part = flat.try_index(c * DENSE_STEP_ROWS..(c + 1) * DENSE_STEP_ROWS)?;
                    Ok(matmul(&part, weight.t())?)
                })
                .collect::<Result<Vec<_>>>()?;
            concatenate(&parts, 0)?
        };
        if padded > rows {
            y.try_index(..rows)?
        } else {
            y
        }
    } else {
        // The padded outputs would only cost here (up to 16x for the smallest layers).
        let weight = if weight.dim(0) > out_dim {
            weight.try_index(..out_dim)?
        } else {
            weight.clone()
        };
        matmul(&flat, weight.t())?
    };
    if y.dim(-1) > out_dim {
        y = y.try_index((.., ..out_dim))?;
    }
    let mut out_shape = shape;
    if let Some(last) = out_shape.last_mut() {
        *last = out_dim;
    }
    Ok(y.reshape(&out_shape)?)
}

/// Bits and group size implied by packed shapes: weight `[out, in*bits/32]`, scales `[out, in/gs]`.
fn infer_params(weight: &Array, scales: &Array, in_dim: i32) -> Option<QuantParams> {
    let packed = *weight.shape().get(1)?;
    let groups = *scales.shape().get(1)?;
    if in_dim <= 0 || groups <= 0 || (packed * 32) % in_dim != 0 || in_dim % groups != 0 {
        return None;
    }
    Some(QuantParams {
        bits: packed * 32 / in_dim,
        group_size: in_dim / groups,
    })
}

/// A token embedding table `[vocab, dim]` (dense or quantized).
pub struct Embedding {
    table: Linear,
}

impl Embedding {
    /// Takes `{path}.weight` (+ `.scales`, `.biases`) out of `w`.
    pub fn load(
        w: &mut Weights,
        quant: &QuantConfig,
        path: &str,
        vocab: i32,
        dim: i32,
    ) -> Result<Embedding> {
        Ok(Embedding {
            table: Linear::load(w, quant, path, dim, vocab)?,
        })
    }

    /// The embeddings of `ids` (any shape, int32): `[..ids.shape, dim]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        self.table.rows(ids)
    }

    /// The table used as an output head (tied embeddings): `x E^T`.
    /// LoRA adapters never apply to it; `ctx` only bounds its rows per product.
    pub fn as_linear(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        self.table.forward_head(x, ctx)
    }

    /// The dtype of the embeddings (the model's activation dtype).
    pub fn dtype(&self) -> Dtype {
        self.table.dtype()
    }

    /// Rows of the table.
    pub fn vocab_size(&self) -> i32 {
        self.table.out_dim
    }

    /// Bytes held by the table.
    pub fn nbytes(&self) -> usize {
        self.table.nbytes()
    }

    /// Reads every byte of the table once on the default device (one reduction per array).
    ///
    /// Why: MLX's CUDA backend keeps every array in managed memory and loading writes it
    /// from the host, so a page lives in host memory until a GPU kernel first touches it.
    /// Products touch all of their weights on the first step, but a table that decoding
    /// only gathers rows from (the per-layer embeddings; an untied input table) would move
    /// one page to the device on nearly every step's lookup — tens of microseconds each,
    /// for the whole life of the model. Touching it all once at load moves it up front.
    pub fn make_resident(&self) -> Result<()> {
        let reads = self
            .table
            .arrays()
            .into_iter()
            .map(|a| a.max(None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        mlx_rs::transforms::eval(&reads)?;
        Ok(())
    }
}
