//! The language model: checkpoint loading and the batched, per-row-cached forward pass.
//!
//! Load order (one fixed path): config → sanitize keys → build modules, quantized exactly
//! where the checkpoint has `.scales` → strict accounting (every tensor used or ignored).
use std::path::Path;

use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};

pub mod activation;
pub mod attention;
pub mod attention_probs;
pub mod batch_kv;
pub mod cache;
mod check_values;
pub mod config;
pub mod decode_attention;
pub mod gemma3;
pub mod gemma4;
pub mod head_norms;
pub mod linear;
pub mod linear_group;
pub mod norm;
pub mod precompiled;
pub mod quantized_row;
pub mod quantized_rows;
pub mod residual_norm;
pub mod rope;
pub mod row_kernel;
pub mod slot_attention;
pub mod trace;
pub mod values_product;
pub mod weight_form;
pub mod weights;

pub use cache::RowCache;
pub use config::{ArchConfig, ModelConfig};
pub use decode_attention::DecodeAttention;
pub use weight_form::{WeightChoice, WeightForm};

/// Whether MLX's default device (where the model will run) is the CPU.
fn on_cpu() -> bool {
    mlx_rs::Device::try_default()
        .and_then(|d| d.get_type())
        .map_or(true, |t| matches!(t, mlx_rs::DeviceType::Cpu))
}

/// Whether to read the lookup tables once on the device at load
/// ([`linear::Embedding::make_resident`]): on MLX's CUDA backend (a GPU off macOS), whose
/// arrays live in managed memory. Apple's unified memory has no pages to move.
/// `MEMEXEC_RESIDENT_TABLES=0` turns it off (for measuring what it saves).
fn resident_tables(cpu: bool) -> bool {
    !cpu && !cfg!(target_os = "macos")
        && std::env::var("MEMEXEC_RESIDENT_TABLES").map_or(true, |v| v != "0")
}

/// Options of one forward call. Every linear layer receives it.
#[derive(Debug, Clone, Default)]
pub struct ForwardCtx {
    /// The LoRA adapters of each row, or `None` for the base model on every row (then no
    /// adapter operation runs at all).
    pub adapters: Option<crate::lora::Activation>,
    /// At most this many rows per quantized product of a one-position forward (`[B, 1, in]`
    /// inputs); more rows are split into balanced chunks whose products are concatenated.
    /// Why: MLX picks a quantized product's kernel by row count (CUDA: the row-wise `qmv`, the
    /// serial path's kernel, under 8 rows; a tiled `qmm` that rounds differently from 8 on),
    /// and a batched row must get the bits of its serial step. `None`: no limit (the CPU,
    /// whose kernel computes each row alone at any count).
    pub product_rows: Option<usize>,
    /// One-position products of two or more rows run as ONE node of memexec's CUDA kernel
    /// that gives every row the bits of MLX's one-row product ([`quantized_rows`]) instead of
    /// MLX's product (or its row chunks past [`ForwardCtx::product_rows`]), where the weights
    /// suit it. Set only where [`quantized_rows::available`] says the kernel runs and matches
    /// MLX.
    pub product_kernel: bool,
    /// Which one-position products of ONE row run through memexec's CUDA kernel that gives
    /// MLX's one-row bits in less device time ([`quantized_row`]), where the weights suit it.
    /// The model sets it on every forward call from [`ModelInfo::row_kernel`]; callers leave
    /// it off.
    pub row_kernel: quantized_row::RowKernel,
    /// Rows of a one-position forward that hold the same number of keys attend in one op
    /// over their stacked keys (see [`attention::attend_rows`]) instead of one op per row.
    /// Exact only where the backend's attention treats batch entries independently: true on
    /// the CPU (checked by the batch tests), NOT on MLX CUDA (its batched matmuls change
    /// their rounding with the batch count: scripts/gpu/row_kernels.py), unverified on Metal.
    pub stacked_attention: bool,
}

impl ForwardCtx {
    /// A call whose rows run with `adapters` (`None`: the base model).
    pub fn with_adapters(adapters: Option<crate::lora::Activation>) -> ForwardCtx {
        ForwardCtx {
            adapters,
            product_rows: None,
            product_kernel: false,
            row_kernel: quantized_row::RowKernel::Off,
            stacked_attention: false,
        }
    }

    /// This context with [`ForwardCtx::stacked_attention`] set.
    pub fn with_stacked_attention(self, stacked_attention: bool) -> ForwardCtx {
        ForwardCtx {
            stacked_attention,
            ..self
        }
    }

    /// This context with [`ForwardCtx::product_kernel`] set.
    pub fn with_product_kernel(self, product_kernel: bool) -> ForwardCtx {
        ForwardCtx {
            product_kernel,
            ..self
        }
    }

    /// This context with [`ForwardCtx::product_rows`] set.
    pub fn with_product_rows(self, product_rows: Option<usize>) -> ForwardCtx {
        ForwardCtx {
            product_rows,
            ..self
        }
    }
}

/// How [`Model::load_opts`] builds a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// The form of the quantized matrices.
    pub weights: WeightChoice,
    /// Run each layer's q/k/v projections, and its gate/up projections, as one quantized
    /// product where the parts allow it (see [`linear_group`]); the results are bit-identical
    /// either way, fusion only launches fewer kernels.
    pub fuse_projections: bool,
    /// How decode steps attend (see [`decode_attention`]); a kernel that fails its
    /// self-check at load falls back to MLX's op.
    pub decode_attention: DecodeAttention,
    /// Which one-row products run through memexec's kernel where it runs and matches MLX
    /// ([`quantized_row::RowKernel`]; off by default).
    pub row_kernel: quantized_row::RowKernel,
    /// Run each residual update of a Gemma-4 layer as one kernel node where it runs and
    /// matches MLX ([`residual_norm`]; off by default).
    pub norm_kernel: bool,
    /// Norm (and rotate) a Gemma-4 layer's query / key / value heads in one kernel node where
    /// it runs and matches MLX ([`head_norms`]; off by default).
    pub head_norm_kernel: bool,
}

impl LoadOptions {
    /// `weights`, fusing projections unless `MEMEXEC_FUSE_PROJECTIONS=0`
    /// ([`linear_group::fuse_projections_default`]), decode attention as
    /// [`DecodeAttention::from_env`] says, one-row products as
    /// [`quantized_row::RowKernel::from_env`] says, residual updates as
    /// [`residual_norm::asked`] says, head norms as [`head_norms::asked`] says.
    pub fn new(weights: WeightChoice) -> LoadOptions {
        LoadOptions {
            weights,
            fuse_projections: linear_group::fuse_projections_default(),
            decode_attention: DecodeAttention::from_env(),
            row_kernel: quantized_row::RowKernel::from_env(),
            norm_kernel: residual_norm::asked(),
            head_norm_kernel: head_norms::asked(),
        }
    }
}

/// Facts about a loaded model that callers need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// `model_type` of `config.json` (e.g. `gemma4`).
    pub model_type: String,
    /// Token ids that end a generation.
    pub eos_token_ids: Vec<u32>,
    /// Rows of the output head.
    pub vocab_size: usize,
    /// `max_position_embeddings`.
    pub max_context: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Activation dtype (that of the embeddings).
    pub dtype: Dtype,
    /// Bytes of all weights, in the form loaded.
    pub weight_bytes: usize,
    /// The form the quantized matrices were loaded in.
    pub weight_form: WeightForm,
    /// Whether MLX's default device was the CPU when the model loaded (where it runs).
    pub on_cpu: bool,
    /// Groups of projections (a layer's q/k/v, its gate/up) that run as one quantized
    /// product; 0 with fusion off or dense matrices.
    pub fused_groups: usize,
    /// How decode steps attend (serial and batched alike).
    pub decode_attention: DecodeAttention,
    /// Which one-row quantized products run through memexec's kernel: as
    /// [`LoadOptions::row_kernel`] asks (off by default) on a GPU where
    /// [`quantized_row::available`] says it runs and matches MLX, else none (see
    /// [`ForwardCtx::row_kernel`]).
    pub row_kernel: quantized_row::RowKernel,
    /// Whether a Gemma-4 layer's residual updates run as one kernel node each: as
    /// [`LoadOptions::norm_kernel`] asks (off by default) on a GPU where
    /// [`residual_norm::available`] says it runs and matches MLX.
    pub norm_kernel: bool,
    /// Whether a Gemma-4 layer's query / key / value head norms (and RoPE, see
    /// [`ModelInfo::head_norm_rope_variant`]) run as one kernel node: as
    /// [`LoadOptions::head_norm_kernel`] asks (off by default) on a GPU where
    /// [`head_norms::available`] says it runs and matches MLX.
    pub head_norm_kernel: bool,
    /// With [`ModelInfo::head_norm_kernel`], how that kernel writes the RoPE's products
    /// ([`head_norms::rope_variant`]: the first way that gives MLX's bits here), `None` where
    /// MLX's `RoPE` rotates.
    pub head_norm_rope_variant: Option<i32>,
}

/// Whether an opt-in Gemma-4 kernel that load was `asked` for runs: only where MLX runs on a GPU
/// and the kernel's `available` check passes, and then `turn_on` tells the model. Logged as
/// `{what}: {on}`, or why not on the CPU (a failed check logs itself).
fn opt_in_kernel(
    arch: &mut Arch,
    asked: bool,
    on_cpu: bool,
    (what, on): (&str, &str),
    available: fn() -> bool,
    turn_on: fn(&mut gemma4::Gemma4),
) -> bool {
    let Arch::Gemma4(m) = arch else {
        return false;
    };
    if !asked {
        return false;
    }
    if on_cpu {
        tracing::info!("{what}: the kernel is CUDA's, MLX runs on the CPU");
        return false;
    }
    if !available() {
        return false;
    }
    turn_on(m);
    tracing::info!("{what}: {on}");
    true
}

enum Arch {
    Gemma4(Box<gemma4::Gemma4>),
    Gemma3(Box<gemma3::Gemma3>),
}

/// A loaded model; immutable after load (all per-sequence state lives in [`RowCache`]s).
pub struct Model {
    arch: Arch,
    info: ModelInfo,
    /// Per-layer caches in a [`RowCache`] of this model.
    cache_layers: usize,
}

impl Model {
    /// Loads an MLX model directory (`config.json` + `*.safetensors`) as stored: quantized
    /// matrices stay packed (mlx-lm's numeric path).
    pub fn load(dir: &Path) -> Result<Model> {
        Model::load_with(dir, WeightChoice::Quantized)
    }

    /// Loads a model directory in the form `weights` asks for (see [`weight_form`]).
    pub fn load_with(dir: &Path, weights: WeightChoice) -> Result<Model> {
        Model::load_opts(dir, LoadOptions::new(weights))
    }

    /// Loads a model directory as `opts` says.
    pub fn load_opts(dir: &Path, opts: LoadOptions) -> Result<Model> {
        let LoadOptions {
            weights,
            fuse_projections: fuse,
            decode_attention,
            row_kernel,
            norm_kernel,
            head_norm_kernel,
        } = opts;
        let cfg = ModelConfig::load(dir)?;
        let mut w = weights::Weights::load(dir)?;
        let wrapped = matches!(cfg.model_type.as_str(), "gemma4" | "gemma3");
        match &cfg.arch {
            ArchConfig::Gemma4(c) => w.sanitize(|k| gemma4::sanitize_key(c, wrapped, k))?,
            ArchConfig::Gemma3(_) => w.sanitize(|k| gemma3::sanitize_key(wrapped, k))?,
        }
        let (quantized, f32_scales, dense_bytes) = w.dense_estimate(&cfg.quant);
        let facts = weight_form::AutoFacts {
            cpu: on_cpu(),
            f32_scales,
            quantized,
            dense_bytes,
            memory_bytes: weight_form::physical_memory(),
        };
        let (weight_form, why) = weights.resolve(&facts);
        if weight_form == WeightForm::Dense {
            let n = w.dequantize(&cfg.quant)?;
            tracing::info!(
                matrices = n,
                dense_mib = dense_bytes >> 20,
                "weights: dense ({why})"
            );
        } else {
            tracing::info!("weights: quantized ({why})");
        }
        // After sanitize every remaining tensor must be used (checked by `finish`).
        let weight_bytes = w.nbytes();
        let mut arch = match &cfg.arch {
            ArchConfig::Gemma4(c) => {
                let m = gemma4::Gemma4::load(c.clone(), &cfg.quant, &mut w, wrapped, fuse)?;
                Arch::Gemma4(Box::new(m))
            }
            ArchConfig::Gemma3(c) => {
                let m = gemma3::Gemma3::load(c.clone(), &cfg.quant, &mut w, wrapped, fuse)?;
                Arch::Gemma3(Box::new(m))
            }
        };
        w.finish()?;
        if resident_tables(facts.cpu) {
            let tables = match &arch {
                Arch::Gemma4(m) => m.lookup_tables(),
                Arch::Gemma3(m) => m.lookup_tables(),
            };
            for table in tables {
                table.make_resident()?;
            }
        }
        let (dtype, fused_groups) = match &arch {
            Arch::Gemma4(m) => (m.dtype(), m.fused_groups()),
            Arch::Gemma3(m) => (m.dtype(), m.fused_groups()),
        };
        if fused_groups > 0 {
            tracing::info!(groups = fused_groups, "projections: fused");
        }
        let decode_attention = decode_attention.checked(facts.cpu);
        match decode_attention {
            DecodeAttention::Kernel => tracing::info!("decode attention: one-node kernel"),
            DecodeAttention::Probs => {
                tracing::info!("decode attention: MLX's numbers, probabilities kernel")
            }
            DecodeAttention::Mlx => {}
        }
        let row_kernel = match row_kernel {
            quantized_row::RowKernel::Off => quantized_row::RowKernel::Off,
            _ if facts.cpu => {
                tracing::info!("one-row products: the kernel is CUDA's, MLX runs on the CPU");
                quantized_row::RowKernel::Off
            }
            _ if !quantized_row::available() => quantized_row::RowKernel::Off,
            asked => {
                tracing::info!(products = ?asked, "one-row products: memexec's kernel");
                asked
            }
        };
        let norm_kernel = opt_in_kernel(
            &mut arch,
            norm_kernel,
            facts.cpu,
            ("residual updates", "one kernel node each"),
            residual_norm::available,
            gemma4::Gemma4::use_norm_kernel,
        );
        let head_norm_kernel = opt_in_kernel(
            &mut arch,
            head_norm_kernel,
            facts.cpu,
            ("head norms", "one kernel node per layer"),
            head_norms::available,
            gemma4::Gemma4::use_head_norm_kernel,
        );
        // The rotation's check compiles and runs up to four kernel variants: at load, not in the
        // first forward (where it would land in a timed prefill).
        let head_norm_rope_variant = if head_norm_kernel {
            head_norms::rope_variant()
        } else {
            None
        };
        let info = ModelInfo {
            model_type: cfg.model_type.clone(),
            eos_token_ids: cfg.eos_token_ids.clone(),
            vocab_size: cfg.arch.vocab_size() as usize,
            max_context: cfg.arch.max_position_embeddings(),
            num_layers: cfg.arch.num_layers(),
            dtype,
            weight_bytes,
            weight_form,
            on_cpu: facts.cpu,
            fused_groups,
            decode_attention,
            row_kernel,
            norm_kernel,
            head_norm_kernel,
            head_norm_rope_variant,
        };
        let mut model = Model {
            arch,
            info,
            cache_layers: 0,
        };
        model.cache_layers = model.new_cache().len();
        Ok(model)
    }

    /// Every linear module (path and shape), for mounting LoRA adapters; the tied output head
    /// is not among them (it is the embedding table). Parts of a fused group are listed each
    /// under its own path: adapters apply per module whether or not it was fused.
    pub fn linear_modules(&self) -> Vec<crate::lora::ModuleShape> {
        let mut out = Vec::new();
        let mut visit = |l: linear::LinearShape<'_>| {
            out.push(crate::lora::ModuleShape {
                path: l.path.to_string(),
                in_dim: l.in_dim,
                out_dim: l.out_dim,
            })
        };
        match &self.arch {
            Arch::Gemma4(m) => m.visit_linears(&mut visit),
            Arch::Gemma3(m) => m.visit_linears(&mut visit),
        }
        out
    }

    /// Facts about the model.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Empty caches for one new sequence.
    pub fn new_cache(&self) -> RowCache {
        match &self.arch {
            Arch::Gemma4(m) => m.new_cache(),
            Arch::Gemma3(m) => m.new_cache(),
        }
    }

    /// Logits of the LAST position of each row, `[B, vocab]`, float32.
    ///
    /// `tokens` is `[B, L]` int32 (or uint32) with one cache per row. B = 1: any L (prefill or
    /// a serial step). B > 1: L must be 1 (a batched decode step); each row attends over its
    /// own cache at its own offset, so its logits equal the B = 1 ones bit for bit.
    pub fn forward(
        &self,
        tokens: &Array,
        caches: &mut [&mut RowCache],
        ctx: &ForwardCtx,
    ) -> Result<Array> {
        self.check_tokens(tokens, caches)?;
        self.check_ids_of(tokens)?;
        self.forward_unchecked_ids(tokens, caches, ctx)
    }

    /// [`Model::forward`] for tokens this model picked itself (argmax over its own
    /// vocabulary: in range by construction). Their values are not read, so they may still be
    /// lazy: a decode step can be queued on the previous step's picks before those are
    /// computed (mlx-lm's pipelining). Shapes and dtype are still checked.
    pub fn forward_own_tokens(
        &self,
        tokens: &Array,
        caches: &mut [&mut RowCache],
        ctx: &ForwardCtx,
    ) -> Result<Array> {
        self.check_tokens(tokens, caches)?;
        self.forward_unchecked_ids(tokens, caches, ctx)
    }

    /// Fails unless every id of `ids` is in the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.info.vocab_size as u64;
        match ids.iter().find(|&&t| t as u64 >= vocab) {
            Some(t) => Err(Error::InvalidArgument(format!(
                "token id {t} outside the vocabulary (size {vocab})"
            ))),
            None => Ok(()),
        }
    }

    fn forward_unchecked_ids(
        &self,
        tokens: &Array,
        caches: &mut [&mut RowCache],
        ctx: &ForwardCtx,
    ) -> Result<Array> {
        let with_row_kernel;
        let ctx = if self.info.row_kernel != ctx.row_kernel {
            with_row_kernel = ForwardCtx {
                row_kernel: self.info.row_kernel,
                ..ctx.clone()
            };
            &with_row_kernel
        } else {
            ctx
        };
        let logits = match &self.arch {
            Arch::Gemma4(m) => m.forward(tokens, caches, ctx, self.info.decode_attention)?,
            Arch::Gemma3(m) => m.forward(tokens, caches, ctx, self.info.decode_attention)?,
        };
        Ok(logits.as_dtype(Dtype::Float32)?)
    }

    fn check_tokens(&self, tokens: &Array, caches: &[&mut RowCache]) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        let &[b, l] = tokens.shape() else {
            return bad(format!(
                "tokens must be [B, L], got shape {:?}",
                tokens.shape()
            ));
        };
        if !matches!(tokens.dtype(), Dtype::Int32 | Dtype::Uint32) {
            return bad(format!(
                "tokens must be int32 or uint32, got {:?}",
                tokens.dtype()
            ));
        }
        if b < 1 || l < 1 {
            return bad(format!("empty token batch {:?}", tokens.shape()));
        }
        if b as usize != caches.len() {
            return bad(format!("{b} rows of tokens but {} caches", caches.len()));
        }
        if b > 1 && l != 1 {
            return bad(format!(
                "a batch of {b} rows must have one token per row, got {l}"
            ));
        }
        let expected = self.cache_layers;
        if let Some(c) = caches.iter().find(|c| c.len() != expected) {
            return bad(format!(
                "a cache has {} layers, this model needs {expected}",
                c.len()
            ));
        }
        Ok(())
    }

    /// Reads `tokens` (evaluating them) and fails on an id outside the vocabulary.
    fn check_ids_of(&self, tokens: &Array) -> Result<()> {
        tokens.eval()?;
        let ids = tokens
            .try_as_slice::<i32>()
            .map_err(|e| Error::InvalidArgument(format!("tokens: {e}")))?;
        let ids = ids
            .iter()
            .map(|&t| {
                u32::try_from(t).map_err(|_| {
                    Error::InvalidArgument(format!("token id {t} outside the vocabulary"))
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        self.check_ids(&ids)
    }
}
