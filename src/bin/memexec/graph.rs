//! `memexec graph`: the graph nodes of one decode step, by MLX primitive. On a GPU a decode
//! step is bound by MLX's host work per node, so this count (exact, unlike the device's
//! drifting timings) is what node-cutting changes are measured by.
use std::path::PathBuf;

use memexec::engine::Decoder;
use memexec::generate::decode_step_graph;
use memexec::mlx_ffi::GraphCensus;
use memexec::model::Model;

/// Arguments of `memexec graph`.
#[derive(clap::Args)]
pub struct Args {
    /// The MLX model directory.
    #[arg(long)]
    model: PathBuf,
    /// Prompt length each row has seen before the counted step (ids drawn deterministically).
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Batch widths to count a decode step at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    rows: Vec<usize>,
    /// The form of the quantized matrices (see `memexec generate --weights`).
    #[arg(long, default_value = "quantized")]
    weights: memexec::model::WeightChoice,
    /// Also write each step's whole graph (MLX's `print_graph`) to DIR/decode-graph-rowsN.txt.
    #[arg(long, value_name = "DIR")]
    dump: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> memexec::Result<()> {
    let model = Model::load_with(&args.model, args.weights)?;
    // Ids away from the special tokens at the start of every Gemma vocabulary.
    let span = model.info().vocab_size.saturating_sub(16).max(1) as u64;
    let prompt: Vec<u32> = (0..args.prompt_len.max(1) as u64)
        .map(|i| (16 + (i * 7919) % span) as u32)
        .collect();
    // The batched decoder's forward form on this device (row chunks, attention form).
    let decoder = Decoder::new(&model, &[]);
    let ctx = decoder.base_ctx();
    let mut results = Vec::new();
    for &rows in &args.rows {
        let text = decode_step_graph(&model, &prompt, rows, &ctx, decoder.shared_kv())?;
        if let Some(dir) = &args.dump {
            let path = dir.join(format!("decode-graph-rows{rows}.txt"));
            std::fs::write(&path, &text).map_err(|source| memexec::Error::Io { path, source })?;
        }
        let census = GraphCensus::from_text(&text);
        if !args.json {
            println!(
                "rows {rows}: {} nodes ({:.1} per row)",
                census.nodes,
                census.nodes as f64 / rows.max(1) as f64
            );
            let mut by: Vec<_> = census.by_primitive.iter().collect();
            by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (name, n) in by {
                println!("  {n:6}  {name}");
            }
        }
        results.push(serde_json::json!({ "rows": rows, "census": census }));
    }
    if args.json {
        let v = serde_json::json!({
            "model_type": model.info().model_type,
            "fused_projections": model.info().fused_groups,
            "decode_attention": model.info().decode_attention,
            "row_kernel": model.info().row_kernel,
            "norm_kernel": model.info().norm_kernel,
            "head_norm_kernel": model.info().head_norm_kernel,
            "head_norm_rope_variant": model.info().head_norm_rope_variant,
            "kernel_calls": memexec::model::precompiled::Calls::from_env(),
            "product_kernel": decoder.product_kernel(),
            "shared_kv": decoder.shared_kv(),
            "values_kernel": memexec::model::values_product::used_with(model.info().decode_attention),
            "slot_attention": memexec::model::slot_attention::used_with(
                model.info().decode_attention,
                decoder.shared_kv(),
            ),
            "prompt_len": prompt.len(),
            "steps": results,
        });
        println!("{v}");
    }
    Ok(())
}
