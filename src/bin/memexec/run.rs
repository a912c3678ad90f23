//! `memexec run`: answers a JSONL file of `{stage, system?, user, max_tokens?}` with a JSONL of
//! outputs in the same order, showing progress (tokens/s, ETA) on a terminal.
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memexec::config::Config;
use memexec::engine::{CallOptions, Engine, LocalInput, Ticket};
use memexec::{Error, Result};
use serde::{Deserialize, Serialize};

/// Arguments of `memexec run`.
#[derive(clap::Args)]
pub struct Args {
    /// The model directory (a config with every default); or use --config.
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    model: Option<PathBuf>,
    /// A JSON configuration document (see `memexec_new` in include/memexec.h).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides the configured batch width.
    #[arg(long)]
    batch_width: Option<usize>,
    /// The form of the quantized matrices: auto, quantized or dense (overrides the config).
    #[arg(long)]
    weights: Option<memexec::model::WeightChoice>,
    /// The JSONL input; `-` or absent = standard input.
    #[arg(long, short)]
    input: Option<PathBuf>,
    /// The JSONL output; `-` or absent = standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// One input line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    stage: String,
    #[serde(default)]
    system: Option<String>,
    user: String,
    #[serde(default)]
    max_tokens: Option<usize>,
}

/// One output line, answering the input line of the same position.
#[derive(Serialize)]
struct Out<'a> {
    line: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generated_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<memexec::engine::StopReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn io_err(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_lines(input: &Option<PathBuf>) -> Result<Vec<Line>> {
    let stdin = PathBuf::from("<stdin>");
    let (reader, path): (Box<dyn BufRead>, PathBuf) = match input {
        Some(p) if p.as_os_str() != "-" => (
            Box::new(BufReader::new(File::open(p).map_err(|e| io_err(p, e))?)),
            p.clone(),
        ),
        _ => (Box::new(BufReader::new(std::io::stdin())), stdin),
    };
    let mut lines = Vec::new();
    for (n, text) in reader.lines().enumerate() {
        let text = text.map_err(|e| io_err(&path, e))?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}:{}: {e}", path.display(), n + 1)))?;
        lines.push(line);
    }
    Ok(lines)
}

fn load_config(args: &Args) -> Result<Config> {
    let mut config = match (&args.config, &args.model) {
        (Some(p), _) => Config::from_json(&std::fs::read_to_string(p).map_err(|e| io_err(p, e))?)?,
        (None, Some(m)) => Config::for_model(m),
        (None, None) => {
            return Err(Error::InvalidArgument(
                "pass --model DIR or --config FILE".into(),
            ))
        }
    };
    if let Some(w) = args.batch_width {
        config.batch_width = w;
    }
    if let Some(w) = args.weights {
        config.weights = w;
    }
    config.validate()?;
    Ok(config)
}

pub fn run(args: Args) -> Result<()> {
    let lines = read_lines(&args.input)?;
    let config = load_config(&args)?;
    let engine = Engine::new(config)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) if p.as_os_str() != "-" => {
            Box::new(BufWriter::new(File::create(p).map_err(|e| io_err(p, e))?))
        }
        _ => Box::new(BufWriter::new(std::io::stdout())),
    };

    // Everything is queued at once so the engine may batch; results are written in order.
    let tickets: Vec<Result<Ticket>> = lines
        .into_iter()
        .map(|l| {
            let input = LocalInput {
                system: l.system,
                user: l.user,
            };
            engine.submit(
                &l.stage,
                input,
                CallOptions {
                    max_tokens: l.max_tokens,
                },
            )
        })
        .collect();
    let progress = Progress::new(tickets.len() as u64);
    let mut failures = 0usize;
    for (i, ticket) in tickets.into_iter().enumerate() {
        let result = ticket.and_then(Ticket::wait).and_then(|mut v| {
            v.pop()
                .ok_or_else(|| Error::Internal("a request produced no completion".into()))
        });
        let record = match &result {
            Ok(c) => Out {
                line: i + 1,
                text: Some(&c.text),
                prompt_tokens: Some(c.prompt_tokens),
                generated_tokens: Some(c.ids.len()),
                stop: Some(c.stop),
                error: None,
            },
            Err(e) => {
                failures += 1;
                Out {
                    line: i + 1,
                    text: None,
                    prompt_tokens: None,
                    generated_tokens: None,
                    stop: None,
                    error: Some(e.to_string()),
                }
            }
        };
        let json = serde_json::to_string(&record).map_err(|e| Error::Internal(e.to_string()))?;
        let stdout = PathBuf::from("<output>");
        writeln!(out, "{json}").map_err(|e| io_err(&stdout, e))?;
        out.flush().map_err(|e| io_err(&stdout, e))?;
        progress.advance(i + 1, result.as_ref().map_or(0, |c| c.ids.len()));
    }
    progress.finish();
    let stats = engine.stats();
    eprintln!(
        "memexec run: {} ok, {failures} failed; {} tokens in, {} tokens out; mode {}, batch width {}, {} matrices",
        stats.completed, stats.tokens_in, stats.tokens_out, stats.mode, stats.batch_width, stats.weights
    );
    if failures > 0 {
        return Err(Error::InvalidArgument(format!(
            "{failures} line(s) failed; see their `error` field"
        )));
    }
    Ok(())
}

/// A bar on a terminal; one plain line per finished input otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    tokens: std::cell::Cell<usize>,
}

impl Progress {
    fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Progress {
            bar,
            total,
            started: Instant::now(),
            tokens: std::cell::Cell::new(0),
        }
    }

    fn advance(&self, done: usize, new_tokens: usize) {
        self.tokens.set(self.tokens.get() + new_tokens);
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let rate = self.tokens.get() as f64 / secs;
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("{rate:.1} tok/s"));
                bar.set_position(done as u64);
            }
            None => {
                let eta = secs / done as f64 * (self.total as f64 - done as f64);
                eprintln!("[{done}/{}] {rate:.1} tok/s, ETA {eta:.0}s", self.total);
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
