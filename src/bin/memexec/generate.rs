//! `memexec generate`: greedy generation from a model directory, for debugging and for the
//! parity scripts.
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use memexec::engine::scheduler::Limits;
use memexec::engine::speculative::{
    greedy_speculative, Drafts, SpeculateOptions, SpeculationStats,
};
use memexec::engine::{kv_budget_for, Decoder, RowRequest};
use memexec::generate::{greedy, GenerateOptions, Generation, StopReason};
use memexec::lora::{Activation, AdapterRegistry, AdapterStack};
use memexec::model::Model;
use memexec::Error;

/// Arguments of `memexec generate`.
#[derive(clap::Args)]
pub struct Args {
    /// The MLX model directory (config.json, *.safetensors, optionally tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "text",
        required_unless_present = "text"
    )]
    prompt_ids: Vec<u32>,
    /// Raw prompt text, encoded with the model's tokenizer.json (special tokens added, no chat
    /// template).
    #[arg(long)]
    text: Option<String>,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// A LoRA adapter directory (mlx-lm format) to run with; repeat to stack adapters, added
    /// in the order given.
    #[arg(long = "adapter", value_name = "DIR")]
    adapters: Vec<PathBuf>,
    /// Never stop at an end-of-sequence id: generate exactly --max-tokens ids (raw greedy
    /// tokens, as the oracle records them; also for speed runs on random-weight models).
    #[arg(long)]
    ignore_eos: bool,
    /// The form of the quantized matrices: quantized (as stored, mlx-lm's numeric path), dense
    /// or auto (what the engine picks by default).
    #[arg(long, default_value = "quantized")]
    weights: memexec::model::WeightChoice,
    /// Also write, for each of --max-tokens steps (unpipelined, no stop ids), the greedy id,
    /// the top 8 log-probabilities and the f64 sum of all of them, as JSON to this file:
    /// scripts/gpu/logprobs_compare.py finds the first step where two implementations differ.
    #[arg(long, value_name = "FILE")]
    logprobs_out: Option<PathBuf>,
    /// Verify up to N drafted tokens per decode step (speculative decoding with exact
    /// verification: the same ids as without it); drafts come from the prompt and output by
    /// n-gram lookup, or from --drafts-from. 0 = off.
    #[arg(long, default_value_t = 0, value_name = "N")]
    speculate: usize,
    /// The longest n-gram the lookup matches (with --speculate).
    #[arg(long, default_value_t = 3, value_name = "N")]
    ngram: usize,
    /// Draft from this continuation of the prompt instead of by lookup (comma-separated ids,
    /// e.g. an earlier run's output: every draft right, the ceiling of --speculate's speed).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "IDS",
        requires = "speculate"
    )]
    drafts_from: Vec<u32>,
    /// Feed --speculate's N drafts on every step the text drafts them, instead of following the
    /// acceptance (fewer drafts after rejections, pauses while they keep missing): measures one
    /// draft count.
    #[arg(long, requires = "speculate")]
    fixed_drafts: bool,
    /// Run through the batched decoder as one row alone (the path a batched engine takes
    /// for a lone call: its one-row steps, and with --speculate its verification of drafts
    /// for a row running alone) instead of the serial loop. The same ids.
    #[arg(long, conflicts_with = "adapters")]
    decoder: bool,
    /// Generate this many times before the reported run, with the same options (untimed):
    /// the first use of each step shape compiles kernels and captures graphs (seconds on MLX
    /// CUDA), which a speed figure should not include.
    #[arg(long, default_value_t = 0, value_name = "N")]
    warmup: usize,
    /// The most KV bytes the rows may hold together, as the config's `limits.max_kv_bytes`
    /// (default: half the memory the weights leave). Bounds --speculate's draft rows: each
    /// takes a slot as large as the row's. Only with --speculate: the one row generated is
    /// always admitted, so without draft rows there is nothing to bound.
    #[arg(long, value_name = "BYTES", requires = "speculate")]
    max_kv_bytes: Option<u64>,
}

/// The `--logprobs-out` document: per step the id, the top 8 `[id, logprob]` and the f64 sum
/// (any changed value moves the sum far more than summation order does).
fn write_logprobs(
    path: &std::path::Path,
    model: &Model,
    prompt: &[u32],
    max_tokens: usize,
    ctx: &memexec::model::ForwardCtx,
) -> memexec::Result<()> {
    let steps = memexec::generate::greedy_logprobs(model, prompt, max_tokens, ctx)?;
    let steps: Vec<serde_json::Value> = steps
        .iter()
        .map(|s| {
            let mut order: Vec<usize> = (0..s.logprobs.len()).collect();
            order.sort_by(|&a, &b| s.logprobs[b].total_cmp(&s.logprobs[a]).then(a.cmp(&b)));
            let top: Vec<(usize, f32)> =
                order.iter().take(8).map(|&i| (i, s.logprobs[i])).collect();
            let sum: f64 = s.logprobs.iter().map(|&v| f64::from(v)).sum();
            serde_json::json!({ "id": s.id, "top": top, "sum": sum })
        })
        .collect();
    let doc = serde_json::json!({ "prompt_ids": prompt, "steps": steps });
    std::fs::write(path, doc.to_string()).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

pub fn run(args: Args) -> memexec::Result<()> {
    let t0 = Instant::now();
    let model = Model::load_with(&args.model, args.weights)?;
    let load_s = t0.elapsed().as_secs_f64();
    let tok_path = args.model.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        Some(
            tokenizers::Tokenizer::from_file(&tok_path)
                .map_err(|e| Error::Tokenizer(e.to_string()))?,
        )
    } else {
        None
    };
    let prompt: Vec<u32> = match (&args.text, &tokenizer) {
        (Some(text), Some(tok)) => tok
            .encode(text.as_str(), true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec(),
        (Some(_), None) => {
            return Err(Error::InvalidArgument(format!(
                "--text needs {}",
                tok_path.display()
            )))
        }
        (None, _) => args.prompt_ids.clone(),
    };
    let mut registry = AdapterRegistry::new(model.linear_modules());
    let mut ids = Vec::new();
    for dir in &args.adapters {
        ids.push(registry.mount_named(&format!("adapter{}", ids.len()), dir)?);
    }
    let adapters = Activation::uniform(Rc::new(registry), AdapterStack::new(ids), 1)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        adapters,
        stop_ids: args.ignore_eos.then(Vec::new),
        ..Default::default()
    };
    if let Some(path) = &args.logprobs_out {
        let ctx = memexec::model::ForwardCtx::with_adapters(opts.adapters.clone());
        write_logprobs(path, &model, &prompt, args.max_tokens, &ctx)?;
    }
    for _ in 0..args.warmup {
        generation(&model, &prompt, opts.clone(), &args)?;
    }
    let (g, speculation) = generation(&model, &prompt, opts, &args)?;
    let text = match &tokenizer {
        Some(tok) => Some(
            tok.decode(&g.ids, false)
                .map_err(|e| Error::Tokenizer(e.to_string()))?,
        ),
        None => None,
    };
    let prefill_tps = prompt.len() as f64 / g.prefill_time.as_secs_f64().max(1e-9);
    let decode_steps =
        g.ids.len().saturating_sub(1) + usize::from(matches!(g.stop, StopReason::Eos(_)));
    let decode_tps = decode_steps as f64 / g.decode_time.as_secs_f64().max(1e-9);
    let stop = match g.stop {
        StopReason::Eos(id) => format!("eos({id})"),
        StopReason::MaxTokens => "max_tokens".to_string(),
    };
    let p = &g.decode_profile;
    let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e3 / p.steps.max(1) as f64;
    let (build_ms, queue_ms, wait_ms) = (per_step(p.build), per_step(p.queue), per_step(p.wait));
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt,
            "ids": g.ids,
            "text": text,
            "stop": stop,
            "load_s": load_s,
            "fused_projections": model.info().fused_groups,
            "decode_attention": model.info().decode_attention,
            "row_kernel": model.info().row_kernel,
            "norm_kernel": model.info().norm_kernel,
            "head_norm_kernel": model.info().head_norm_kernel,
            "head_norm_rope_variant": model.info().head_norm_rope_variant,
            "kernel_calls": memexec::model::precompiled::Calls::from_env(),
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "decode_profile_ms_per_step": {
                "steps": p.steps,
                "build": build_ms,
                "queue": queue_ms,
                "wait": wait_ms,
            },
            "speculation": speculation.map(|s| serde_json::json!({
                "max_drafts": args.speculate,
                "drafts": if args.drafts_from.is_empty() { "lookup" } else { "given" },
                "adaptive": !args.fixed_drafts,
                "steps": s.steps,
                "steps_with_drafts": s.steps_with_drafts,
                "drafted": s.drafted,
                "accepted": s.accepted,
                "paused_steps": s.paused_steps,
            })),
        });
        println!("{v}");
    } else {
        println!("prompt ({} tokens): {:?}", prompt.len(), prompt);
        println!(
            "generated ({} tokens, stop: {stop}): {:?}",
            g.ids.len(),
            g.ids
        );
        if let Some(t) = text {
            println!("text: {t}");
        }
        println!(
            "load {load_s:.2}s; prefill {prefill_tps:.1} tok/s; decode {decode_tps:.1} tok/s ({})",
            model.info().model_type
        );
        println!(
            "decode host time per step: build {build_ms:.2} ms, queue {queue_ms:.2} ms, \
             wait {wait_ms:.2} ms ({} steps)",
            p.steps
        );
        if let Some(s) = speculation {
            println!(
                "speculation: {} of {} drafts accepted over {} steps ({} with drafts, {} paused)",
                s.accepted, s.drafted, s.steps, s.steps_with_drafts, s.paused_steps
            );
        }
    }
    Ok(())
}

/// Serial greedy, or with `--speculate` the speculative decoder (same ids) and its counts.
fn generation(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    args: &Args,
) -> memexec::Result<(Generation, Option<SpeculationStats>)> {
    let kv_budget = kv_budget_for(model, args.max_kv_bytes);
    let spec = if args.speculate == 0 {
        None
    } else {
        let drafts = if args.drafts_from.is_empty() {
            Drafts::Lookup { ngram: args.ngram }
        } else {
            Drafts::Continuation(args.drafts_from.clone())
        };
        let spec = SpeculateOptions::new(drafts, args.speculate).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("--speculate: {m}")),
            e => e,
        })?;
        Some(spec.adaptive(!args.fixed_drafts).within(kv_budget))
    };
    if args.decoder {
        return through_decoder(model, prompt, opts, spec, kv_budget);
    }
    match spec {
        None => Ok((greedy(model, prompt, opts)?, None)),
        Some(spec) => {
            let (g, stats) = greedy_speculative(model, prompt, opts, &spec)?;
            Ok((g, Some(stats)))
        }
    }
}

/// `--decoder`: one row alone through [`Decoder`] (no adapters: `--adapter` conflicts).
fn through_decoder(
    model: &Model,
    prompt: &[u32],
    opts: GenerateOptions,
    spec: Option<SpeculateOptions>,
    kv_budget: Option<u64>,
) -> memexec::Result<(Generation, Option<SpeculationStats>)> {
    let stop_ids = opts.stop_ids_for(model);
    let decoder = Decoder::new(model, &stop_ids).with_speculation(spec);
    let req = RowRequest::new(prompt.to_vec(), opts.max_tokens);
    let limits = Limits {
        width: 1,
        kv_budget,
    };
    let out = decoder
        .run_rows(vec![req], limits)
        .pop()
        .unwrap_or_else(|| Err(Error::Internal("the decoder lost the row".into())))?;
    let stop = match out.stop_id {
        Some(id) => StopReason::Eos(id),
        None => StopReason::MaxTokens,
    };
    let g = Generation {
        ids: out.ids,
        stop,
        prefill_time: out.prefill_time,
        decode_time: out.decode_time,
        decode_profile: decoder.profile(),
    };
    Ok((g, out.speculation))
}
