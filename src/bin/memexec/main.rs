//! The `memexec` command-line tool: one subcommand per file in this folder.
use clap::{Parser, Subcommand};

mod bench;
mod generate;
mod graph;
mod prompt;
mod run;
mod smoke;

/// memexec: one local language model serving a memory pipeline.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load MLX, run a few operations and print what they computed.
    Smoke(smoke::Args),
    /// Answer a JSONL of {stage, system?, user, max_tokens?} with a JSONL of outputs, in order.
    Run(run::Args),
    /// Greedy generation from a model directory.
    Generate(generate::Args),
    /// Count the graph nodes of one decode step, by MLX primitive (the GPU's host cost).
    Graph(graph::Args),
    /// BENCH.md: serial vs batched vs mlx-lm on the three workloads.
    Bench(bench::Args),
    /// Show the prompt text and ids a stage call gives the model.
    Prompt(prompt::Args),
}

fn main() -> std::process::ExitCode {
    // Warnings by default (a batch check that turned batching off, an ignored setting):
    // `EnvFilter::from_default_env` alone shows errors only unless RUST_LOG is set.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Smoke(args) => smoke::run(args),
        Command::Run(args) => run::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Graph(args) => graph::run(args),
        Command::Prompt(args) => prompt::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memexec: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
