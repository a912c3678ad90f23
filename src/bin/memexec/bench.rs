//! `memexec bench`: BENCH.md. Loads the model once, renders the EXTRACT / SHORT / UNIFORM
//! prompts through the prompter (stage defaults), runs memexec serial and batched at the given
//! widths (interleaved repetitions, medians), with `--speculate N` also serial with drafts
//! verified (speculative decoding: its acceptance counts) and each width verifying drafts for
//! rows running alone, counts outputs identical to serial, then runs
//! mlx-lm (serial `generate_step`, `batch_generate`) on the same prompt ids and model through
//! scripts/bench/mlx_lm_bench.py, and prints one table (and JSON with --json-out).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memexec::bench::workloads;
use memexec::config::Config;
use memexec::engine::scheduler::Limits;
use memexec::engine::speculative::{
    greedy_speculative, Drafts, SpeculateOptions, SpeculationStats,
};
use memexec::engine::{Decoder, LocalInput, ModelBackend, RowRequest};
use memexec::generate::{greedy, DecodeProfile, GenerateOptions};
use memexec::{Error, Result};
use serde_json::{json, Value};

/// Arguments of `memexec bench`.
#[derive(clap::Args)]
pub struct Args {
    /// The MLX model directory.
    #[arg(long, default_value = ".deps/fixtures/tiny-gemma4-q4-f32")]
    model: PathBuf,
    /// Timed repetitions per configuration (interleaved; the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Batch widths to run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    widths: Vec<usize>,
    /// Workloads to run (EXTRACT, SHORT, UNIFORM).
    #[arg(long, value_delimiter = ',', default_value = "EXTRACT,SHORT,UNIFORM")]
    workloads: Vec<String>,
    /// Cap every workload's max_tokens (keeps runs on big models short).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Use only the first N prompts of each workload.
    #[arg(long)]
    prompts: Option<usize>,
    /// The workloads' seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the mlx-lm comparison.
    #[arg(long)]
    no_mlx_lm: bool,
    /// The Python with mlx-lm.
    #[arg(long, default_value = ".deps/venv/bin/python")]
    python: PathBuf,
    /// The form of the quantized matrices: auto (the engine's default), quantized or dense.
    #[arg(long, default_value = "auto")]
    weights: memexec::model::WeightChoice,
    /// Workloads mlx-lm runs (default: all that memexec runs). mlx-lm runs the packed 4-bit
    /// kernel, which is slow on CPU: a subset keeps big-model runs short.
    #[arg(long, value_delimiter = ',')]
    mlx_lm_workloads: Option<Vec<String>>,
    /// Batch widths mlx-lm runs (default: --widths).
    #[arg(long, value_delimiter = ',')]
    mlx_lm_widths: Option<Vec<usize>>,
    /// mlx-lm's repetitions (default: --reps).
    #[arg(long)]
    mlx_lm_reps: Option<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Also run serial with up to N drafts per step found by n-gram lookup in the prompt and
    /// output, verified exactly (speculative decoding; mode "speculative kN"), and each width
    /// with drafts verified for rows running alone ("batched wW, speculative kN"): their
    /// speed, outputs identical to serial and how many drafts were accepted. 0 = off.
    #[arg(long, default_value_t = 0, value_name = "N")]
    speculate: usize,
    /// The longest n-gram the lookup matches (with --speculate).
    #[arg(long, default_value_t = 3, value_name = "N")]
    ngram: usize,
}

/// How a configuration decodes its prompts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One prompt after the other, greedy.
    Serial,
    /// One prompt after the other, with up to this many lookup drafts per step, verified
    /// (the longest n-gram matched).
    Speculative { drafts: usize, ngram: usize },
    /// Continuous batching at this width.
    Batched(usize),
    /// Continuous batching at this width, verifying lookup drafts for rows running alone
    /// (`Decoder::with_speculation`).
    BatchedSpeculative {
        width: usize,
        drafts: usize,
        ngram: usize,
    },
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Serial => "serial".into(),
            Mode::Speculative { drafts, .. } => format!("speculative k{drafts}"),
            Mode::Batched(w) => format!("batched w{w}"),
            Mode::BatchedSpeculative { width, drafts, .. } => {
                format!("batched w{width}, speculative k{drafts}")
            }
        }
    }

    fn width(self) -> usize {
        match self {
            Mode::Batched(w) | Mode::BatchedSpeculative { width: w, .. } => w,
            _ => 1,
        }
    }
}

/// One configuration's measurements over the repetitions.
#[derive(Default)]
struct Runs {
    e2e: Vec<Duration>,
    prefill: Vec<Duration>,
    ids: Vec<Vec<u32>>,
    peak: u64,
    /// The last repetition's decode profile.
    profile: DecodeProfile,
    /// The last repetition's draft counts (speculative mode).
    speculation: Option<SpeculationStats>,
}

impl Runs {
    /// The median; with an even count the lower middle, so that one disturbed repetition of
    /// two cannot make a configuration look slower (or faster) than its other run.
    fn median(v: &[Duration]) -> Duration {
        let mut v = v.to_vec();
        v.sort();
        v.get(v.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default()
    }
}

struct Measured {
    e2e: Duration,
    prefill: Duration,
    ids: Vec<Vec<u32>>,
    /// Host time of the decode steps (serial: summed over the prompts).
    profile: DecodeProfile,
    /// Draft counts summed over the prompts (speculative mode).
    speculation: Option<SpeculationStats>,
}

/// Serial greedy over the prompts, or with `spec` the speculative decoder (same ids).
fn run_serial(
    backend: &ModelBackend,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    spec: Option<&SpeculateOptions>,
) -> Result<Measured> {
    let t = Instant::now();
    let mut prefill = Duration::ZERO;
    let mut ids = Vec::new();
    let mut profile = DecodeProfile::default();
    let mut speculation = spec.map(|_| SpeculationStats::default());
    for p in prompts {
        let opts = GenerateOptions {
            max_tokens,
            stop_ids: Some(backend.stop_ids().to_vec()),
            ..GenerateOptions::default()
        };
        let g = match (spec, speculation.as_mut()) {
            (Some(spec), Some(total)) => {
                let (g, s) = greedy_speculative(backend.model(), p, opts, spec)?;
                *total += s;
                g
            }
            _ => greedy(backend.model(), p, opts)?,
        };
        prefill += g.prefill_time;
        ids.push(g.ids);
        profile += g.decode_profile;
    }
    Ok(Measured {
        e2e: t.elapsed(),
        prefill,
        ids,
        profile,
        speculation,
    })
}

fn run_batched(
    backend: &ModelBackend,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    width: usize,
    spec: Option<SpeculateOptions>,
) -> Result<Measured> {
    let decoder = Decoder::new(backend.model(), backend.stop_ids()).with_speculation(spec);
    let reqs = prompts
        .iter()
        .map(|p| RowRequest::new(p.clone(), max_tokens))
        .collect();
    let t = Instant::now();
    let outs = decoder.run_rows(
        reqs,
        Limits {
            width,
            kv_budget: backend.kv_budget(),
        },
    );
    let e2e = t.elapsed();
    let mut prefill = Duration::ZERO;
    let mut ids = Vec::new();
    let mut speculation: Option<SpeculationStats> = None;
    for o in outs {
        let o = o?;
        prefill += o.prefill_time;
        ids.push(o.ids);
        if let Some(s) = o.speculation {
            *speculation.get_or_insert_with(Default::default) += s;
        }
    }
    Ok(Measured {
        e2e,
        prefill,
        ids,
        profile: decoder.profile(),
        speculation,
    })
}

fn measure(
    backend: &ModelBackend,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    mode: Mode,
) -> Result<(Measured, u64)> {
    let _ = mlx_rs::memory::clear_cache();
    let _ = mlx_rs::memory::reset_peak_memory();
    let m = match mode {
        Mode::Serial => run_serial(backend, prompts, max_tokens, None)?,
        Mode::Speculative { drafts, ngram } => {
            let spec = SpeculateOptions::new(Drafts::Lookup { ngram }, drafts)?
                .within(backend.kv_budget());
            run_serial(backend, prompts, max_tokens, Some(&spec))?
        }
        Mode::Batched(w) => run_batched(backend, prompts, max_tokens, w, None)?,
        Mode::BatchedSpeculative {
            width,
            drafts,
            ngram,
        } => {
            let spec = SpeculateOptions::new(Drafts::Lookup { ngram }, drafts)?
                .within(backend.kv_budget());
            run_batched(backend, prompts, max_tokens, width, Some(spec))?
        }
    };
    let peak = mlx_rs::memory::peak_memory().map_or(0, |b| b as u64);
    Ok((m, peak))
}

/// Host time per decode step (a batched step over several forwards counts once).
fn profile_json(p: &DecodeProfile) -> Value {
    let per_step = |d: Duration| ms(d) / p.steps.max(1) as f64;
    json!({
        "steps": p.steps, "build": per_step(p.build), "queue": per_step(p.queue),
        "wait": per_step(p.wait),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn per_s(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// Runs scripts/bench/mlx_lm_bench.py on the same prompt ids, on `device` (`cpu` / `gpu`).
fn mlx_lm(args: &Args, wls: &[Value], device: &str) -> Result<Value> {
    let dir = std::env::temp_dir().join(format!("memexec-bench-{}", std::process::id()));
    let io = |path: &Path, e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: e,
    };
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let input = dir.join("workloads.json");
    let output = dir.join("mlx_lm.json");
    let widths: Vec<String> = args
        .mlx_lm_widths
        .as_ref()
        .unwrap_or(&args.widths)
        .iter()
        .map(|w| w.to_string())
        .collect();
    let wls: Vec<&Value> = wls
        .iter()
        .filter(|w| {
            args.mlx_lm_workloads.as_ref().is_none_or(|only| {
                only.iter().any(|o| {
                    w["name"]
                        .as_str()
                        .is_some_and(|n| n.eq_ignore_ascii_case(o))
                })
            })
        })
        .collect();
    std::fs::write(&input, json!({ "workloads": wls }).to_string()).map_err(|e| io(&input, e))?;
    let script = Path::new("scripts/bench/mlx_lm_bench.py");
    let mut cmd = std::process::Command::new(&args.python);
    cmd.arg(script);
    if device == "gpu" {
        // A short untimed run per configuration meets every kernel shape; a full one would
        // double the device time.
        cmd.args(["--warmup-tokens", "8"]);
    }
    let status = cmd
        .arg("--model")
        .arg(&args.model)
        .arg("--workloads")
        .arg(&input)
        .arg("--out")
        .arg(&output)
        .arg("--widths")
        .arg(widths.join(","))
        .arg("--reps")
        .arg(args.mlx_lm_reps.unwrap_or(args.reps).to_string())
        .arg("--device")
        .arg(device)
        .status()
        .map_err(|e| io(&args.python, e))?;
    if !status.success() {
        return Err(Error::Internal(format!(
            "{} {} failed: {status}",
            args.python.display(),
            script.display()
        )));
    }
    let text = std::fs::read_to_string(&output).map_err(|e| io(&output, e))?;
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
        path: output,
        reason: e.to_string(),
    })
}

pub fn run(args: Args) -> Result<()> {
    if args.speculate > 0 {
        // Checked before the model loads (seconds to minutes), not at the first measurement.
        SpeculateOptions::new(Drafts::Lookup { ngram: args.ngram }, args.speculate).map_err(
            |e| match e {
                Error::InvalidArgument(m) => {
                    Error::InvalidArgument(format!("--speculate / --ngram: {m}"))
                }
                e => e,
            },
        )?;
    }
    let t0 = Instant::now();
    let mut config = Config::for_model(&args.model);
    config.weights = args.weights;
    let backend = ModelBackend::load(&config)?;
    let weights = backend.model().info().weight_form.name();
    let device = if backend.model().info().on_cpu {
        "cpu"
    } else {
        "gpu"
    };
    eprintln!(
        "loaded {} ({weights} matrices) in {:.1}s",
        args.model.display(),
        t0.elapsed().as_secs_f64()
    );
    let mut rows_json = Vec::new();
    let mut wls_json = Vec::new();
    let mut table = Vec::new();
    for wl in workloads::all(args.seed) {
        if !args
            .workloads
            .iter()
            .any(|w| w.eq_ignore_ascii_case(wl.name))
        {
            continue;
        }
        let max_tokens = args
            .max_tokens
            .map_or(wl.max_tokens, |m| m.min(wl.max_tokens));
        let n = args
            .prompts
            .unwrap_or(wl.prompts.len())
            .min(wl.prompts.len());
        let prompts: Vec<Vec<u32>> = wl.prompts[..n]
            .iter()
            .map(|p| {
                let input = LocalInput {
                    system: p.system.clone(),
                    user: p.user.clone(),
                };
                backend.prompter().prompt_ids(&p.stage, &input)
            })
            .collect::<Result<_>>()?;
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
        let speculative = (args.speculate > 0).then_some(Mode::Speculative {
            drafts: args.speculate,
            ngram: args.ngram,
        });
        let batched = args.widths.iter().flat_map(|&width| {
            let spec = (args.speculate > 0).then_some(Mode::BatchedSpeculative {
                width,
                drafts: args.speculate,
                ngram: args.ngram,
            });
            std::iter::once(Mode::Batched(width)).chain(spec)
        });
        let modes: Vec<Mode> = std::iter::once(Mode::Serial)
            .chain(speculative)
            .chain(batched)
            .collect();
        // Warm-up, untimed: every batch shape once, on the prompts' first 16 ids (full
        // prefills here would double the run time on CPU).
        let heads: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| p[..p.len().min(16)].to_vec())
            .collect();
        for &mode in &modes {
            measure(&backend, &heads, max_tokens.min(3), mode)?;
        }
        let mut runs: Vec<Runs> = modes.iter().map(|_| Runs::default()).collect();
        for rep in 0..args.reps.max(1) {
            for (i, &mode) in modes.iter().enumerate() {
                let (m, peak) = measure(&backend, &prompts, max_tokens, mode)?;
                eprintln!(
                    "{} {} rep {}: {:.0} ms",
                    wl.name,
                    mode.name(),
                    rep + 1,
                    ms(m.e2e)
                );
                let r = &mut runs[i];
                r.e2e.push(m.e2e);
                r.prefill.push(m.prefill);
                r.ids = m.ids;
                r.profile = m.profile;
                r.speculation = m.speculation;
                r.peak = r.peak.max(peak);
            }
        }
        let serial_ids = runs[0].ids.clone();
        let serial_ms = ms(Runs::median(&runs[0].e2e));
        for (mode, r) in modes.iter().zip(&runs) {
            let e2e = Runs::median(&r.e2e);
            let prefill = Runs::median(&r.prefill);
            let generated: usize = r.ids.iter().map(Vec::len).sum();
            // As mlx-lm's serial: decode tok/s counts the tokens after each row's first.
            let after_first = generated.saturating_sub(r.ids.len());
            let identical = r
                .ids
                .iter()
                .zip(&serial_ids)
                .filter(|(a, b)| a == b)
                .count();
            let row = json!({
                "workload": wl.name, "engine": "memexec", "mode": mode.name(),
                "width": mode.width(), "e2e_ms": ms(e2e),
                "e2e_ms_all": r.e2e.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
                "prefill_tok_s": per_s(prompt_tokens, prefill),
                "decode_tok_s": per_s(after_first, e2e.saturating_sub(prefill)),
                "generated_tokens": generated, "speed_vs_serial": serial_ms / ms(e2e),
                "identical_to_serial": identical, "rows": r.ids.len(),
                "peak_memory_bytes": r.peak, "ids": r.ids,
                "decode_profile_ms_per_step": profile_json(&r.profile),
                "speculation": r.speculation.map(|s| json!({
                    "steps": s.steps, "steps_with_drafts": s.steps_with_drafts,
                    "drafted": s.drafted, "accepted": s.accepted,
                    "paused_steps": s.paused_steps,
                })),
            });
            table.push(row.clone());
            rows_json.push(row);
        }
        wls_json.push(json!({
            "name": wl.name, "max_tokens": max_tokens, "prompts": prompts,
        }));
    }
    let mut mlx_json = Value::Null;
    if !args.no_mlx_lm && !wls_json.is_empty() {
        mlx_json = mlx_lm(&args, &wls_json, device)?;
        let empty = Vec::new();
        let mut extra = Vec::new();
        for w in mlx_json["workloads"].as_array().unwrap_or(&empty) {
            let name = w["name"].as_str().unwrap_or("?");
            let ours = |mode: &str| {
                table
                    .iter()
                    .find(|r| r["workload"] == name && r["mode"] == mode)
                    .cloned()
            };
            let serial_ids = ours("serial")
                .map(|r| r["ids"].clone())
                .unwrap_or(Value::Null);
            let serial_ms = ours("serial")
                .and_then(|r| r["e2e_ms"].as_f64())
                .unwrap_or(0.0);
            for run in w["runs"].as_array().unwrap_or(&empty) {
                let batch = run["mode"] == "batch";
                let width = run["width"].as_u64().unwrap_or(1);
                let mode = if batch {
                    format!("batched w{width}")
                } else {
                    "serial".into()
                };
                let e2e = run["e2e_ms"].as_f64().unwrap_or(0.0);
                let ids = run["ids"].as_array().cloned().unwrap_or_default();
                let identical = serial_ids
                    .as_array()
                    .map(|s| ids.iter().zip(s).filter(|(a, b)| a == b).count())
                    .unwrap_or(0);
                let generated: u64 = ids
                    .iter()
                    .map(|r| r.as_array().map_or(0, |v| v.len() as u64))
                    .sum();
                // memexec's time for the same configuration over mlx-lm's: > 1 = memexec faster.
                let vs = ours(&mode)
                    .and_then(|r| r["e2e_ms"].as_f64())
                    .map(|m| e2e / m);
                extra.push(json!({
                    "workload": name, "engine": "mlx-lm", "mode": mode, "width": width,
                    "e2e_ms": e2e, "prefill_tok_s": run["prefill_tok_s"],
                    "decode_tok_s": run["decode_tok_s"], "generated_tokens": generated,
                    "speed_vs_serial": if serial_ms > 0.0 { serial_ms / e2e } else { 0.0 },
                    "identical_to_serial": identical, "rows": ids.len(),
                    "peak_memory_bytes": run["peak_memory_bytes"],
                    "memexec_speedup": vs,
                }));
            }
        }
        table.extend(extra);
    }
    print_table(&table);
    let probe = Decoder::new(backend.model(), backend.stop_ids());
    let decoder_facts = json!({
        "rows_per_forward": (probe.rows_per_forward() != usize::MAX)
            .then_some(probe.rows_per_forward()),
        "rows_per_product": (probe.rows_per_product() != usize::MAX)
            .then_some(probe.rows_per_product()),
        "product_kernel": probe.product_kernel(),
        "stacked_attention": probe.stacked_attention(),
        "shared_kv": probe.shared_kv(),
        "decode_attention": backend.model().info().decode_attention,
        "row_kernel": backend.model().info().row_kernel,
        "norm_kernel": backend.model().info().norm_kernel,
        "head_norm_kernel": backend.model().info().head_norm_kernel,
        "head_norm_rope_variant": backend.model().info().head_norm_rope_variant,
        "kernel_calls": memexec::model::precompiled::Calls::from_env(),
        "values_kernel": memexec::model::values_product::used_with(
            backend.model().info().decode_attention,
        ),
        "slot_attention": memexec::model::slot_attention::used_with(
            backend.model().info().decode_attention,
            probe.shared_kv(),
        ),
        "row_ops": if memexec::model::attention::per_row_ops() { "per-row" } else { "batched" },
    });
    if let Some(path) = &args.json_out {
        let doc = json!({
            "schema": 1, "tool": "memexec bench", "model": args.model,
            "date_unix": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            "device": device, "weights": weights, "blas": blas_library(),
            "decoder": decoder_facts,
            "reps": args.reps, "widths": args.widths, "seed": args.seed,
            "max_tokens_cap": args.max_tokens, "prompts_cap": args.prompts,
            "workloads": wls_json.iter().map(|w| json!({
                "name": w["name"], "max_tokens": w["max_tokens"],
                "prompt_lens": w["prompts"].as_array().map(|p| p.iter()
                    .map(|x| x.as_array().map_or(0, Vec::len)).collect::<Vec<_>>()),
                // The exact ids, so that another engine (mlx-lm on another machine) can be run
                // on the same prompts later.
                "prompt_ids": w["prompts"],
            })).collect::<Vec<_>>(),
            "results": table, "mlx_lm": mlx_json,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default()).map_err(
            |e| Error::Io {
                path: path.clone(),
                source: e,
            },
        )?;
    }
    Ok(())
}

/// The BLAS MLX's CPU backend loads (setup links it to OpenBLAS), for the record.
fn blas_library() -> Value {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("blas"))
        .map_or(Value::Null, |p| {
            let real = std::fs::canonicalize(p).map_or(p.to_string(), |r| r.display().to_string());
            Value::String(real)
        })
}

fn print_table(rows: &[Value]) {
    println!(
        "{:<8} {:<8} {:<11} {:>10} {:>11} {:>10} {:>9} {:>10} {:>9} {:>8}",
        "workload",
        "engine",
        "mode",
        "ms",
        "prefill/s",
        "decode/s",
        "x serial",
        "x mlx-lm",
        "identical",
        "peak MB"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let vs = r["memexec_speedup"]
            .as_f64()
            .map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<8} {:<8} {:<11} {:>10.0} {:>11.1} {:>10.1} {:>9.2} {:>10} {:>5}/{:<3} {:>8.0}",
            r["workload"].as_str().unwrap_or("?"),
            r["engine"].as_str().unwrap_or("?"),
            r["mode"].as_str().unwrap_or("?"),
            f("e2e_ms"),
            f("prefill_tok_s"),
            f("decode_tok_s"),
            f("speed_vs_serial"),
            vs,
            r["identical_to_serial"].as_u64().unwrap_or(0),
            r["rows"].as_u64().unwrap_or(0),
            f("peak_memory_bytes") / 1e6,
        );
    }
    for r in rows.iter().filter(|r| r["speculation"].is_object()) {
        let s = &r["speculation"];
        let n = |k: &str| s[k].as_u64().unwrap_or(0);
        println!(
            "{} {}: {} of {} drafts accepted; {} steps, {} with drafts, {} paused",
            r["workload"].as_str().unwrap_or("?"),
            r["mode"].as_str().unwrap_or("?"),
            n("accepted"),
            n("drafted"),
            n("steps"),
            n("steps_with_drafts"),
            n("paused_steps"),
        );
    }
}
