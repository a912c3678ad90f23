//! The Gemma-3 text model (mlx-lm `gemma3_text.py`): `1 + w` norms, `query_pre_attn_scalar`
//! attention scale, local / global RoPE bases, every `sliding_window_pattern`-th layer global.
use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::{Array, Dtype};

use super::activation::{cached_scalar, clip_residual, gelu_approx};
use super::attention::{attend_rows, merge_heads, split_heads, AttentionForm, RowKv, RowOffsets};
use super::cache::{missing_layer, KvCache, LayerCache, Mask, RotatingKvCache, RowCache};
use super::config::{Gemma3Config, LayerType, QuantConfig, RopeParams};
use super::decode_attention::DecodeAttention;
use super::linear::{Embedding, Linear, LinearShape};
use super::linear_group::LinearGroup;
use super::norm::GemmaRmsNorm;
use super::rope::Rope;
use super::weights::Weights;
use super::ForwardCtx;
use crate::error::Result;

struct Attention {
    /// `q_proj`, `k_proj`, `v_proj` (one quantized product when fused).
    qkv: LinearGroup<3>,
    o_proj: Linear,
    q_norm: GemmaRmsNorm,
    k_norm: GemmaRmsNorm,
    rope: Rope,
}

struct Mlp {
    /// `gate_proj`, `up_proj` (one quantized product when fused).
    gate_up: LinearGroup<2>,
    down_proj: Linear,
}

struct TransformerBlock {
    layer_type: LayerType,
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: GemmaRmsNorm,
    post_attention_layernorm: GemmaRmsNorm,
    pre_feedforward_layernorm: GemmaRmsNorm,
    post_feedforward_layernorm: GemmaRmsNorm,
}

/// A loaded Gemma-3 text model.
pub struct Gemma3 {
    cfg: Gemma3Config,
    embed_tokens: Embedding,
    layers: Vec<TransformerBlock>,
    norm: GemmaRmsNorm,
    lm_head: Option<Linear>,
    dtype: Dtype,
    scale: f32,
}

/// The prefix of model tensors and the output head key, by checkpoint layout.
pub fn key_layout(wrapped: bool) -> (&'static str, &'static str) {
    if wrapped {
        ("language_model.model.", "language_model.lm_head")
    } else {
        ("model.", "lm_head")
    }
}

/// mlx-lm's `gemma3.Model.sanitize`: the wrapper drops the vision tower and projector.
pub fn sanitize_key(wrapped: bool, key: &str) -> Option<String> {
    if wrapped && (key.starts_with("vision_tower") || key.starts_with("multi_modal_projector")) {
        return None;
    }
    Some(key.to_string())
}

impl Gemma3 {
    /// Builds the model from sanitized weights (`wrapped`: keys under `language_model.`);
    /// `fuse`: run q/k/v and gate/up as one quantized product each where they can (see
    /// [`super::linear_group`]).
    pub fn load(
        cfg: Gemma3Config,
        quant: &QuantConfig,
        w: &mut Weights,
        wrapped: bool,
        fuse: bool,
    ) -> Result<Gemma3> {
        let (p, head_key) = key_layout(wrapped);
        let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let embed_tokens =
            Embedding::load(w, quant, &format!("{p}embed_tokens"), cfg.vocab_size, d)?;
        let local = RopeParams {
            rope_type: "default".into(),
            theta: cfg.rope_local_base_freq,
            partial_rotary_factor: 1.0,
            factor: 1.0,
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let lp = format!("{p}layers.{i}");
            let ap = format!("{lp}.self_attn");
            let layer_type = cfg.layer_type(i);
            let rope_params = match layer_type {
                LayerType::Sliding => &local,
                LayerType::Full => &cfg.rope_global,
            };
            let mp = format!("{lp}.mlp");
            let im = cfg.intermediate_size;
            let qkv = [
                (format!("{ap}.q_proj"), nh * hd),
                (format!("{ap}.k_proj"), nkv * hd),
                (format!("{ap}.v_proj"), nkv * hd),
            ];
            let gate_up = [
                (format!("{mp}.gate_proj"), im),
                (format!("{mp}.up_proj"), im),
            ];
            layers.push(TransformerBlock {
                layer_type,
                self_attn: Attention {
                    qkv: LinearGroup::load(w, quant, qkv.each_ref().map(as_part), d, fuse)?,
                    o_proj: Linear::load(w, quant, &format!("{ap}.o_proj"), nh * hd, d)?,
                    q_norm: GemmaRmsNorm::load(w, &format!("{ap}.q_norm"), hd, eps)?,
                    k_norm: GemmaRmsNorm::load(w, &format!("{ap}.k_norm"), hd, eps)?,
                    rope: Rope::new(hd, false, rope_params)?,
                },
                mlp: Mlp {
                    gate_up: LinearGroup::load(w, quant, gate_up.each_ref().map(as_part), d, fuse)?,
                    down_proj: Linear::load(w, quant, &format!("{mp}.down_proj"), im, d)?,
                },
                input_layernorm: GemmaRmsNorm::load(w, &format!("{lp}.input_layernorm"), d, eps)?,
                post_attention_layernorm: GemmaRmsNorm::load(
                    w,
                    &format!("{lp}.post_attention_layernorm"),
                    d,
                    eps,
                )?,
                pre_feedforward_layernorm: GemmaRmsNorm::load(
                    w,
                    &format!("{lp}.pre_feedforward_layernorm"),
                    d,
                    eps,
                )?,
                post_feedforward_layernorm: GemmaRmsNorm::load(
                    w,
                    &format!("{lp}.post_feedforward_layernorm"),
                    d,
                    eps,
                )?,
            });
        }
        let norm = GemmaRmsNorm::load(w, &format!("{p}norm"), d, eps)?;
        // mlx-lm ties the head to the embedding exactly when the checkpoint has no lm_head.
        let lm_head = if w.contains(&format!("{head_key}.weight")) {
            Some(Linear::load(w, quant, head_key, d, cfg.vocab_size)?)
        } else {
            None
        };
        let dtype = embed_tokens.dtype();
        let scale = (cfg.query_pre_attn_scalar as f64).powf(-0.5) as f32;
        Ok(Gemma3 {
            cfg,
            embed_tokens,
            layers,
            norm,
            lm_head,
            dtype,
            scale,
        })
    }

    /// Calls `f` on every linear module (not the tied head), in checkpoint order; the parts
    /// of a fused group each on their own.
    pub fn visit_linears(&self, f: &mut dyn FnMut(LinearShape<'_>)) {
        for layer in &self.layers {
            layer.self_attn.qkv.visit(f);
            f(layer.self_attn.o_proj.shape());
            layer.mlp.gate_up.visit(f);
            f(layer.mlp.down_proj.shape());
        }
        if let Some(head) = &self.lm_head {
            f(head.shape());
        }
    }

    /// Groups of projections that run as one quantized product.
    pub fn fused_groups(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                usize::from(l.self_attn.qkv.is_fused()) + usize::from(l.mlp.gate_up.is_fused())
            })
            .sum()
    }

    /// The table decoding gathers rows from (the token embeddings).
    pub fn lookup_tables(&self) -> Vec<&Embedding> {
        vec![&self.embed_tokens]
    }

    /// The activation dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Gemma3Config {
        &self.cfg
    }

    /// Fresh caches for one sequence: one per layer.
    pub fn new_cache(&self) -> RowCache {
        let layers = (0..self.cfg.num_hidden_layers)
            .map(|i| match self.cfg.layer_type(i) {
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
        let mut h = self.embed_tokens.forward(tokens)?;
        // mlx-lm rounds sqrt(hidden) to bf16 before casting to the activation dtype.
        let s = cached_scalar((self.cfg.hidden_size as f64).sqrt(), Dtype::Bfloat16)?;
        h = h.multiply(s.as_dtype(dt)?)?;

        let pattern = self.cfg.sliding_window_pattern;
        let window = self.cfg.sliding_window;
        let mut masks: Vec<[Mask; 2]> = Vec::with_capacity(caches.len());
        for c in caches.iter() {
            let global = match c.layer(pattern - 1) {
                Some(lc) => lc.make_mask(l, window),
                None if l == 1 => Mask::None,
                None => Mask::Causal,
            };
            let sliding = if pattern > 1 {
                c.layer(0)
                    .ok_or_else(|| missing_layer(0))?
                    .make_mask(l, window)
            } else {
                Mask::None
            };
            masks.push([global, sliding]);
        }

        let mut row_offsets: Option<RowOffsets> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let a = &layer.self_attn;
            let (nh, nkv, hd) = (
                self.cfg.num_attention_heads,
                self.cfg.num_key_value_heads,
                self.cfg.head_dim,
            );
            let x = layer.input_layernorm.forward(&h)?;
            let [q, k, v] = a.qkv.forward(&x, ctx)?;
            let q = split_heads(&q, nh, hd, |t| Ok(t.clone()))?;
            let k = split_heads(&k, nkv, hd, |t| Ok(t.clone()))?;
            let v = split_heads(&v, nkv, hd, |t| Ok(t.clone()))?;
            let q = a.q_norm.forward(&q)?;
            let k = a.k_norm.forward(&k)?;
            let offsets: Vec<i32> = caches
                .iter()
                .map(|c| {
                    c.layer(i)
                        .map(|lc| lc.offset())
                        .ok_or_else(|| missing_layer(i))
                })
                .collect::<Result<_>>()?;
            let offsets = RowOffsets::reuse(&mut row_offsets, offsets);
            let q = offsets.rotate(&a.rope, &q)?;
            let k = offsets.rotate(&a.rope, &k)?;
            let slot = if layer.layer_type == LayerType::Full {
                0
            } else {
                1
            };
            let row_masks: Vec<&Mask> = masks.iter().map(|m| &m[slot]).collect();
            let o = attend_rows(
                &q,
                &mut RowKv::update(caches, i, &k, &v)?,
                &row_masks,
                self.scale,
                AttentionForm {
                    stack: ctx.stacked_attention,
                    decode,
                },
            )?;
            let o = merge_heads(&o)?;
            let r = a.o_proj.forward(&o, ctx)?;
            h = clip_residual(&h, &layer.post_attention_layernorm.forward(&r)?)?;
            let x = layer.pre_feedforward_layernorm.forward(&h)?;
            let [gate, up] = layer.mlp.gate_up.forward(&x, ctx)?;
            let m = layer
                .mlp
                .down_proj
                .forward(&gelu_approx(&gate)?.multiply(&up)?, ctx)?;
            h = clip_residual(&h, &layer.post_feedforward_layernorm.forward(&m)?)?;
        }

        let last = if l > 1 {
            h.try_index((.., l - 1.., ..))?
        } else {
            h
        };
        let last = self.norm.forward(&last)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward(&last, ctx)?,
            None => self.embed_tokens.as_linear(&last, ctx)?,
        };
        Ok(logits.reshape(&[b, self.cfg.vocab_size])?)
    }
}

/// A `(path, output features)` pair as [`LinearGroup::load`] takes it.
fn as_part((path, out_dim): &(String, i32)) -> (&str, i32) {
    (path, *out_dim)
}
