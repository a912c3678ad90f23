//! The Gemma-4 text model (mlx-lm `gemma4_text.py`): per-layer inputs, KV sharing,
//! proportional RoPE on full layers, weightless `v_norm`, `layer_scalar`, final softcap.
use mlx_rs::ops::broadcast_to;
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use super::activation::{cached_scalar, geglu, gelu_approx, softcap};
use super::attention::{attend_rows, merge_heads, AttentionForm, RowKv, RowOffsets};
use super::cache::{missing_layer, KvCache, LayerCache, Mask, RotatingKvCache, RowCache};
use super::config::{Gemma4Config, LayerType, QuantConfig};
use super::decode_attention::DecodeAttention;
use super::head_norms::{norm_rotate_heads, HeadNorms};
use super::linear::{Embedding, Linear, LinearShape};
use super::linear_group::LinearGroup;
use super::norm::RmsNorm;
use super::residual_norm::add_normed;
use super::rope::Rope;
use super::trace::Trace;
use super::weights::Weights;
use super::ForwardCtx;
use crate::error::{Error, Result};

/// The input projections of an attention block.
enum QkvProjections {
    /// A KV-shared layer: queries only (keys and values come from its `kv_source`).
    Queries(Linear),
    /// A layer that computes its own keys and values: `q_proj`, `k_proj`, `v_proj`, one
    /// quantized product when fused.
    Own {
        qkv: LinearGroup<3>,
        k_norm: RmsNorm,
        v_norm: RmsNorm,
    },
}

struct Attention {
    proj: QkvProjections,
    o_proj: Linear,
    q_norm: RmsNorm,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
}

struct Mlp {
    /// `gate_proj`, `up_proj` (one quantized product when fused).
    gate_up: LinearGroup<2>,
    down_proj: Linear,
}

impl Mlp {
    fn load(
        w: &mut Weights,
        q: &QuantConfig,
        p: &str,
        dim: i32,
        hidden: i32,
        fuse: bool,
    ) -> Result<Mlp> {
        let (gate, up) = (format!("{p}.gate_proj"), format!("{p}.up_proj"));
        Ok(Mlp {
            gate_up: LinearGroup::load(w, q, [(&gate, hidden), (&up, hidden)], dim, fuse)?,
            down_proj: Linear::load(w, q, &format!("{p}.down_proj"), hidden, dim)?,
        })
    }

    fn forward(&self, x: &Array, ctx: &ForwardCtx) -> Result<Array> {
        let [gate, up] = self.gate_up.forward(x, ctx)?;
        self.down_proj.forward(&geglu(&gate, &up)?, ctx)
    }
}

/// The per-layer-input branch of a decoder layer.
struct PerLayerBranch {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

struct DecoderLayer {
    layer_type: LayerType,
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    per_layer: Option<PerLayerBranch>,
    layer_scalar: Array,
    /// The layer whose keys / values (and RoPE offset) this one attends over: itself, or the
    /// last non-shared layer of the same type.
    kv_source: usize,
}

/// The model-level per-layer-input tables.
struct PerLayerInputs {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    dim: i32,
}

/// A loaded Gemma-4 text model.
pub struct Gemma4 {
    cfg: Gemma4Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    per_layer_inputs: Option<PerLayerInputs>,
    lm_head: Option<Linear>,
    dtype: Dtype,
    /// Residual updates as one kernel node each ([`super::residual_norm`]).
    norm_kernel: bool,
    /// A layer's q/k/v head norms and RoPE as one kernel node ([`super::head_norms`]).
    head_norm_kernel: bool,
}

/// The prefix of model tensors and the output head key, by checkpoint layout.
pub fn key_layout(wrapped: bool) -> (&'static str, &'static str) {
    if wrapped {
        ("language_model.model.", "language_model.lm_head")
    } else {
        ("model.", "lm_head")
    }
}

/// mlx-lm's `sanitize` (wrapper + text model): returns the key to load, or `None` to ignore
/// it (vision / audio towers, rotary buffers, clipping ranges, KV-shared layers' k/v).
pub fn sanitize_key(cfg: &Gemma4Config, wrapped: bool, key: &str) -> Option<String> {
    let mut k = key.to_string();
    if wrapped {
        let starts_with_model = k.starts_with("model.");
        if starts_with_model {
            k = k["model.".len()..].to_string();
        }
        const TOWERS: [&str; 6] = [
            "vision_tower",
            "multi_modal_projector",
            "audio_tower",
            "embed_audio",
            "embed_vision",
            "vision_embedder",
        ];
        if TOWERS.iter().any(|t| k.starts_with(t)) {
            return None;
        }
        if starts_with_model && k.starts_with("language_model") {
            k = k.replacen("language_model.", "language_model.model.", 1);
        }
    }
    const DROPPED: [&str; 5] = [
        "self_attn.rotary_emb",
        "input_max",
        "input_min",
        "output_max",
        "output_min",
    ];
    if DROPPED.iter().any(|s| k.contains(s)) {
        return None;
    }
    if [
        ".self_attn.k_proj",
        ".self_attn.v_proj",
        ".self_attn.k_norm",
    ]
    .iter()
    .any(|s| k.contains(s))
    {
        let layer = k
            .split("layers.")
            .nth(1)
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        if layer.is_some_and(|i| i >= cfg.first_kv_shared_layer()) {
            return None;
        }
    }
    Some(k)
}

impl Gemma4 {
    /// Builds the model from sanitized weights (`wrapped`: keys under `language_model.`);
    /// `fuse`: run q/k/v and gate/up as one quantized product each where they can (see
    /// [`super::linear_group`]).
    pub fn load(
        cfg: Gemma4Config,
        quant: &QuantConfig,
        w: &mut Weights,
        wrapped: bool,
        fuse: bool,
    ) -> Result<Gemma4> {
        let (p, head_key) = key_layout(wrapped);
        let d = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let embed_tokens =
            Embedding::load(w, quant, &format!("{p}embed_tokens"), cfg.vocab_size, d)?;
        let n = cfg.num_hidden_layers;
        let first_shared = cfg.first_kv_shared_layer();

        let per_layer_inputs = if cfg.hidden_size_per_layer_input > 0 {
            let ple = cfg.hidden_size_per_layer_input;
            Some(PerLayerInputs {
                embed_tokens_per_layer: Embedding::load(
                    w,
                    quant,
                    &format!("{p}embed_tokens_per_layer"),
                    cfg.vocab_size_per_layer_input,
                    n as i32 * ple,
                )?,
                per_layer_model_projection: Linear::load(
                    w,
                    quant,
                    &format!("{p}per_layer_model_projection"),
                    d,
                    n as i32 * ple,
                )?,
                per_layer_projection_norm: RmsNorm::load(
                    w,
                    &format!("{p}per_layer_projection_norm"),
                    ple,
                    eps,
                )?,
                dim: ple,
            })
        } else {
            None
        };

        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let lp = format!("{p}layers.{i}");
            let layer_type = cfg.layer_types[i];
            let (head_dim, rope_params) = match layer_type {
                LayerType::Full => (cfg.global_head_dim, &cfg.rope_full),
                LayerType::Sliding => (cfg.head_dim, &cfg.rope_sliding),
            };
            let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
            let ap = format!("{lp}.self_attn");
            let q_path = format!("{ap}.q_proj");
            let proj = if i < first_shared {
                let (k_path, v_path) = (format!("{ap}.k_proj"), format!("{ap}.v_proj"));
                let parts = [
                    (q_path.as_str(), nh * head_dim),
                    (k_path.as_str(), nkv * head_dim),
                    (v_path.as_str(), nkv * head_dim),
                ];
                QkvProjections::Own {
                    qkv: LinearGroup::load(w, quant, parts, d, fuse)?,
                    k_norm: RmsNorm::load(w, &format!("{ap}.k_norm"), head_dim, eps)?,
                    v_norm: RmsNorm::without_weight(eps),
                }
            } else {
                QkvProjections::Queries(Linear::load(w, quant, &q_path, d, nh * head_dim)?)
            };
            let self_attn = Attention {
                proj,
                o_proj: Linear::load(w, quant, &format!("{ap}.o_proj"), nh * head_dim, d)?,
                q_norm: RmsNorm::load(w, &format!("{ap}.q_norm"), head_dim, eps)?,
                rope: Rope::new(head_dim, cfg.rope_traditional, rope_params)?,
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim,
            };
            let wide = cfg.use_double_wide_mlp && first_shared > 0 && i >= first_shared;
            let mlp_hidden = cfg.intermediate_size * if wide { 2 } else { 1 };
            let per_layer = if cfg.hidden_size_per_layer_input > 0 {
                let ple = cfg.hidden_size_per_layer_input;
                Some(PerLayerBranch {
                    per_layer_input_gate: Linear::load(
                        w,
                        quant,
                        &format!("{lp}.per_layer_input_gate"),
                        d,
                        ple,
                    )?,
                    per_layer_projection: Linear::load(
                        w,
                        quant,
                        &format!("{lp}.per_layer_projection"),
                        ple,
                        d,
                    )?,
                    post_per_layer_input_norm: RmsNorm::load(
                        w,
                        &format!("{lp}.post_per_layer_input_norm"),
                        d,
                        eps,
                    )?,
                })
            } else {
                None
            };
            let kv_source = if i < first_shared {
                i
            } else {
                // The last non-shared layer of the same type (validated in config).
                (0..first_shared)
                    .rev()
                    .find(|&j| cfg.layer_types[j] == layer_type)
                    .unwrap_or(i)
            };
            layers.push(DecoderLayer {
                layer_type,
                self_attn,
                mlp: Mlp::load(w, quant, &format!("{lp}.mlp"), d, mlp_hidden, fuse)?,
                input_layernorm: RmsNorm::load(w, &format!("{lp}.input_layernorm"), d, eps)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
                pre_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.pre_feedforward_layernorm"),
                    d,
                    eps,
                )?,
                post_feedforward_layernorm: RmsNorm::load(
                    w,
                    &format!("{lp}.post_feedforward_layernorm"),
                    d,
                    eps,
                )?,
                per_layer,
                layer_scalar: one_position_scalar(
                    w.take_float(&format!("{lp}.layer_scalar"), &[1])?,
                    d,
                )?,
                kv_source,
            });
        }
        let norm = RmsNorm::load(w, &format!("{p}norm"), d, eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(w, quant, head_key, d, cfg.vocab_size)?)
        };
        let dtype = embed_tokens.dtype();
        Ok(Gemma4 {
            cfg,
            embed_tokens,
            layers,
            norm,
            per_layer_inputs,
            lm_head,
            dtype,
            norm_kernel: false,
            head_norm_kernel: false,
        })
    }

    /// Runs every residual update (norm, add, layer scalar, the next block's norm) as one
    /// kernel node: for a model on MLX CUDA whose [`super::residual_norm::available`] said yes
    /// on the thread that will run it.
    pub fn use_norm_kernel(&mut self) {
        self.norm_kernel = true;
    }

    /// Norms (and, where [`super::head_norms::rope_variant`] found a way, rotates) each layer's
    /// query / key / value heads in one kernel node: for a model on MLX CUDA whose
    /// [`super::head_norms::available`] said yes on the thread that will run it.
    pub fn use_head_norm_kernel(&mut self) {
        self.head_norm_kernel = true;
    }

    /// Calls `f` on every linear module (not the tied head), in checkpoint order; the parts
    /// of a fused group each on their own.
    pub fn visit_linears(&self, f: &mut dyn FnMut(LinearShape<'_>)) {
        if let Some(pl) = &self.per_layer_inputs {
            f(pl.per_layer_model_projection.shape());
        }
        for layer in &self.layers {
            let a = &layer.self_attn;
            match &a.proj {
                QkvProjections::Queries(q_proj) => f(q_proj.shape()),
                QkvProjections::Own { qkv, .. } => qkv.visit(f),
            }
            f(a.o_proj.shape());
            layer.mlp.gate_up.visit(f);
            f(layer.mlp.down_proj.shape());
            if let Some(br) = &layer.per_layer {
                f(br.per_layer_input_gate.shape());
                f(br.per_layer_projection.shape());
            }
        }
        if let Some(head) = &self.lm_head {
            f(head.shape());
        }
    }

    /// Groups of projections that run as one quantized product.
    pub fn fused_groups(&self) -> usize {
        self.layers
            .iter()
            .map(|layer| {
                let qkv = match &layer.self_attn.proj {
                    QkvProjections::Own { qkv, .. } => qkv.is_fused(),
                    QkvProjections::Queries(_) => false,
                };
                usize::from(qkv) + usize::from(layer.mlp.gate_up.is_fused())
            })
            .sum()
    }

    /// The tables decoding gathers rows from: the token embeddings and, where the model has
    /// them, the per-layer embeddings.
    pub fn lookup_tables(&self) -> Vec<&Embedding> {
        let mut tables = vec![&self.embed_tokens];
        if let Some(pl) = &self.per_layer_inputs {
            tables.push(&pl.embed_tokens_per_layer);
        }
        tables
    }

    /// The activation dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Gemma4Config {
        &self.cfg
    }

    /// Fresh caches for one sequence: one per non-shared layer.
    pub fn new_cache(&self) -> RowCache {
        let layers = self.cfg.layer_types[..self.cfg.first_kv_shared_layer()]
            .iter()
            .map(|t| match t {
                LayerType::Full => LayerCache::Full(KvCache::default()),
                LayerType::Sliding => {
                    LayerCache::Rotating(RotatingKvCache::new(self.cfg.sliding_window))
                }
            })
            .collect();
        RowCache::new(layers)
    }

    /// Last-position logits `[B, vocab]` (model dtype) of `tokens` `[B, L]`; decode rows
    /// attend as `decode` says.
    pub fn forward(
        &self,
        tokens: &Array,
        caches: &mut [&mut RowCache],
        ctx: &ForwardCtx,
        decode: DecodeAttention,
    ) -> Result<Array> {
        let (b, l) = (tokens.dim(0), tokens.dim(1));
        let dt = self.dtype;
        let n = self.layers.len() as i32;
        let mut trace = Trace::start(b);
        let form = AttentionForm {
            stack: ctx.stacked_attention,
            decode,
        };
        let mut h = self.embed_tokens.forward(tokens)?;
        h = h.multiply(cached_scalar((self.cfg.hidden_size as f64).sqrt(), dt)?)?;

        let per_layer_in = match &self.per_layer_inputs {
            Some(pl) => {
                let tok = pl
                    .embed_tokens_per_layer
                    .forward(tokens)?
                    .multiply(cached_scalar((pl.dim as f64).sqrt(), dt)?)?
                    .reshape(&[b, l, n, pl.dim])?;
                let prj = pl
                    .per_layer_model_projection
                    .forward(&h, ctx)?
                    .multiply(cached_scalar((self.cfg.hidden_size as f64).powf(-0.5), dt)?)?
                    .reshape(&[b, l, n, pl.dim])?;
                let prj = pl.per_layer_projection_norm.forward(&prj)?;
                Some(
                    prj.add(&tok)?
                        .multiply(cached_scalar(2f64.powf(-0.5), dt)?)?,
                )
            }
            None => None,
        };

        // One mask per layer type and row, from the first cache of that type (as mlx-lm).
        let window = self.cfg.sliding_window;
        let first_of = |t: LayerType| self.cfg.layer_types.iter().position(|&x| x == t);
        let mut masks: Vec<[Mask; 2]> = Vec::with_capacity(caches.len());
        for c in caches.iter() {
            let mut m = [Mask::None, Mask::None];
            for (slot, t) in [LayerType::Full, LayerType::Sliding]
                .into_iter()
                .enumerate()
            {
                if let Some(i) = first_of(t) {
                    m[slot] = match c.layer(i) {
                        Some(lc) => lc.make_mask(l, window),
                        None => return Err(missing_layer(i)),
                    };
                }
            }
            masks.push(m);
        }
        let mask_slot = |t: LayerType| match t {
            LayerType::Full => 0,
            LayerType::Sliding => 1,
        };

        // Per layer that owns keys / values: what each row attended over (with the stacks
        // built for it) and each row's RoPE offset, for the layers sharing them.
        let mut kvs: Vec<Option<(RowKv, Vec<i32>)>> = Vec::with_capacity(self.layers.len());
        let mut row_offsets: Option<RowOffsets> = None;
        // The next layer's input norm, computed with the residual update that ends a layer.
        let mut normed: Option<Array> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let a = &layer.self_attn;
            let x = match normed.take() {
                Some(x) => x,
                None => layer.input_layernorm.forward(&h)?,
            };
            // Each row's RoPE offset: its cache's, or that of the layer it shares keys with.
            let own_kv = matches!(a.proj, QkvProjections::Own { .. });
            let offsets: Vec<i32> = if own_kv {
                caches
                    .iter()
                    .map(|c| {
                        c.layer(i)
                            .map(|lc| lc.offset())
                            .ok_or_else(|| missing_layer(i))
                    })
                    .collect::<Result<_>>()?
            } else {
                kvs.get(layer.kv_source)
                    .and_then(Option::as_ref)
                    .map(|(_, offsets)| offsets.clone())
                    .ok_or_else(|| missing_layer(layer.kv_source))?
            };
            let offsets = RowOffsets::reuse(&mut row_offsets, offsets);
            // Queries (and keys and values) split into heads, normed, rotated.
            let heads = |kv| HeadNorms {
                heads: a.n_heads,
                kv_heads: a.n_kv_heads,
                head_dim: a.head_dim,
                q: &a.q_norm,
                kv,
            };
            let head_kernel = self.head_norm_kernel;
            let (q, new_kv) = match &a.proj {
                QkvProjections::Queries(q_proj) => {
                    let q = q_proj.forward(&x, ctx)?;
                    norm_rotate_heads(&q, None, &heads(None), &a.rope, offsets, head_kernel)?
                }
                QkvProjections::Own {
                    qkv,
                    k_norm,
                    v_norm,
                } => {
                    let [q, k, v] = qkv.forward(&x, ctx)?;
                    let n = heads(Some((k_norm, v_norm)));
                    norm_rotate_heads(&q, Some((&k, &v)), &n, &a.rope, offsets, head_kernel)?
                }
            };
            let row_masks: Vec<&Mask> = masks
                .iter()
                .map(|m| &m[mask_slot(layer.layer_type)])
                .collect();
            let o = match new_kv {
                Some((k, v)) => {
                    let used: Vec<i32> = (0..caches.len()).map(|r| offsets.of(r)).collect();
                    let mut row_kv = RowKv::update(caches, i, &k, &v)?;
                    let o = attend_rows(&q, &mut row_kv, &row_masks, 1.0, form)?;
                    kvs.push(Some((row_kv, used)));
                    o
                }
                None => {
                    let (row_kv, _) = kvs
                        .get_mut(layer.kv_source)
                        .and_then(Option::as_mut)
                        .ok_or_else(|| missing_layer(layer.kv_source))?;
                    let o = attend_rows(&q, row_kv, &row_masks, 1.0, form)?;
                    kvs.push(None);
                    o
                }
            };
            if let Some(t) = trace.as_mut() {
                // What this layer attended over: its own keys (`kv_source == i`) or shared ones.
                if let Some(Some((row_kv, _))) = kvs.get_mut(layer.kv_source) {
                    for r in 0..row_kv.len() {
                        let (keys, values) = row_kv.row(r)?;
                        t.record(format!("k.{i}"), keys);
                        t.record(format!("v.{i}"), values);
                    }
                }
                t.record(format!("q.{i}"), &q);
                t.record(format!("o.{i}"), &o);
            }
            let attn = a.o_proj.forward(&merge_heads(&o)?, ctx)?;
            let fused = self.norm_kernel;
            let (h1, x2) = add_normed(
                &h,
                &attn,
                &layer.post_attention_layernorm,
                None,
                Some(&layer.pre_feedforward_layernorm),
                fused,
            )?;
            let x2 = x2.ok_or_else(|| Error::Internal("residual norm: no next norm".into()))?;
            let m = layer.mlp.forward(&x2, ctx)?;

            // The update that ends the layer also scales by the layer scalar and norms for the
            // next layer (or, for a one-position forward's last layer, for the output head).
            let next_norm = match self.layers.get(i + 1) {
                Some(next) => Some(&next.input_layernorm),
                None if l == 1 => Some(&self.norm),
                None => None,
            };
            let scalar = Some(&layer.layer_scalar);
            (h, normed) = match (&layer.per_layer, &per_layer_in) {
                (Some(br), Some(pin)) => {
                    let (h2, _) = add_normed(
                        &h1,
                        &m,
                        &layer.post_feedforward_layernorm,
                        None,
                        None,
                        fused,
                    )?;
                    let g = gelu_approx(&br.per_layer_input_gate.forward(&h2, ctx)?)?;
                    let g = g.multiply(pin.try_index((.., .., i as i32, ..))?)?;
                    let g = br.per_layer_projection.forward(&g, ctx)?;
                    add_normed(
                        &h2,
                        &g,
                        &br.post_per_layer_input_norm,
                        scalar,
                        next_norm,
                        fused,
                    )?
                }
                _ => add_normed(
                    &h1,
                    &m,
                    &layer.post_feedforward_layernorm,
                    scalar,
                    next_norm,
                    fused,
                )?,
            };
            if let Some(t) = trace.as_mut() {
                t.record(format!("h.{i}"), &h);
            }
        }

        // Only the last position's logits are needed: norm and head are row-wise.
        let last = match normed {
            Some(last) => last,
            None if l > 1 => self.norm.forward(&h.try_index((.., l - 1.., ..))?)?,
            None => self.norm.forward(&h)?,
        };
        let mut logits = match &self.lm_head {
            Some(head) => head.forward(&last, ctx)?,
            None => self.embed_tokens.as_linear(&last, ctx)?,
        };
        if let Some(cap) = self.cfg.final_logit_softcapping {
            logits = softcap(&logits, cap)?;
        }
        if let Some(mut t) = trace {
            t.record("logits".into(), &logits);
            t.finish()?;
        }
        Ok(logits.reshape(&[b, self.cfg.vocab_size])?)
    }
}

/// A `[1]` scalar as an evaluated `[1, 1, dim]` view: multiplying a one-position activation
/// by it needs no broadcast node (MLX adds one per product of unequal shapes), and the values
/// are the scalar's, so the product's bits are unchanged.
fn one_position_scalar(s: Array, dim: i32) -> Result<Array> {
    let s = broadcast_to(&s, &[1, 1, dim])?;
    s.eval()?;
    Ok(s)
}
