//! Tensor and module names: which module a LoRA tensor belongs to, which factor it is, how it
//! is laid out, and the layout-independent ("canonical") form of a module path.
//!
//! Adapters and checkpoints spell the same module differently (`language_model.model.layers.6
//! .self_attn.q_proj`, `model.layers.6.self_attn.q_proj`, peft's `base_model.model.model
//! .language_model.layers.6.self_attn.q_proj`); both sides are reduced to the part a decoder
//! stack shares (`layers.6.self_attn.q_proj`) before they are compared.

/// The two factors of a LoRA pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Factor {
    /// `lora_a`, applied first.
    A,
    /// `lora_b`, applied second.
    B,
}

/// How a factor is stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// mlx-lm (`.lora_a` / `.lora_b`): plain matrices, A `[in, r]` and B `[r, out]`.
    Mlx,
    /// peft (`.lora_A.weight` / `.lora_B.weight`): `nn.Linear` weights `[out_features,
    /// in_features]`, so A is `[r, in]` and B `[out, r]` and both are transposed on load.
    Peft,
}

/// A LoRA tensor name taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorName {
    /// The module path as spelled in the file (without the factor suffix).
    pub module: String,
    /// Which factor.
    pub factor: Factor,
    /// Its storage layout.
    pub layout: Layout,
}

/// Splits `<module>.lora_a`, `.lora_b`, `.lora_A`, `.lora_B`, each with an optional `.weight`.
///
/// Orientation follows the spelling: a `.weight` suffix marks a peft `nn.Linear` weight
/// (transposed), mlx-lm never writes one.
pub fn parse_tensor_name(name: &str) -> Option<TensorName> {
    let (stem, weight) = match name.strip_suffix(".weight") {
        Some(s) => (s, true),
        None => (name, false),
    };
    let (module, leaf) = stem.rsplit_once('.')?;
    let factor = match leaf {
        "lora_a" | "lora_A" => Factor::A,
        "lora_b" | "lora_B" => Factor::B,
        _ => return None,
    };
    if module.is_empty() {
        return None;
    }
    Some(TensorName {
        module: module.to_string(),
        factor,
        layout: if weight { Layout::Peft } else { Layout::Mlx },
    })
}

/// The module path without its wrapper prefixes: `layers.6.self_attn.q_proj`, `lm_head`,
/// `per_layer_model_projection`, ...
pub fn canonical_module(path: &str) -> &str {
    let mut p = path.strip_prefix("base_model.model.").unwrap_or(path);
    for prefix in [
        "language_model.model.",
        "model.language_model.",
        "language_model.",
        "model.",
    ] {
        if let Some(rest) = p.strip_prefix(prefix) {
            p = rest;
            break;
        }
    }
    p
}

/// The module names LoRA may target inside a decoder layer (SPEC §6).
pub const TARGETS: [&str; 9] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "per_layer_input_gate",
    "per_layer_projection",
];

/// Whether a canonical module path is `layers.<n>.<target>`.
pub fn is_target(canonical: &str) -> bool {
    let Some(rest) = canonical.strip_prefix("layers.") else {
        return false;
    };
    let Some((n, sub)) = rest.split_once('.') else {
        return false;
    };
    !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) && TARGETS.contains(&sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_in_all_spellings() {
        let t = parse_tensor_name("language_model.model.layers.6.mlp.up_proj.lora_a").unwrap();
        assert_eq!(t.module, "language_model.model.layers.6.mlp.up_proj");
        assert_eq!((t.factor, t.layout), (Factor::A, Layout::Mlx));
        let t = parse_tensor_name("model.layers.0.self_attn.o_proj.lora_B.weight").unwrap();
        assert_eq!(t.module, "model.layers.0.self_attn.o_proj");
        assert_eq!((t.factor, t.layout), (Factor::B, Layout::Peft));
        let t = parse_tensor_name("layers.0.self_attn.o_proj.lora_A").unwrap();
        assert_eq!((t.factor, t.layout), (Factor::A, Layout::Mlx));
        assert_eq!(parse_tensor_name("layers.0.mlp.up_proj.m"), None);
        assert_eq!(parse_tensor_name("layers.0.mlp.up_proj.weight"), None);
        assert_eq!(parse_tensor_name("lora_a"), None);
    }

    #[test]
    fn canonical_forms_agree() {
        let want = "layers.6.self_attn.q_proj";
        for p in [
            "language_model.model.layers.6.self_attn.q_proj",
            "model.layers.6.self_attn.q_proj",
            "layers.6.self_attn.q_proj",
            "base_model.model.model.layers.6.self_attn.q_proj",
            "base_model.model.model.language_model.layers.6.self_attn.q_proj",
            "model.language_model.layers.6.self_attn.q_proj",
        ] {
            assert_eq!(canonical_module(p), want, "{p}");
        }
        assert_eq!(canonical_module("language_model.lm_head"), "lm_head");
    }

    #[test]
    fn targets() {
        assert!(is_target("layers.11.per_layer_projection"));
        assert!(is_target("layers.0.mlp.down_proj"));
        assert!(!is_target("per_layer_model_projection"));
        assert!(!is_target("embed_tokens"));
        assert!(!is_target("layers.x.mlp.down_proj"));
        assert!(!is_target("layers.0.self_attn.q_norm"));
    }
}
