//! `memexec prompt`: what the model will see for a stage call (rendered text and ids).
use std::path::PathBuf;

use memexec::prompt::{LocalInput, Prompter, StageConfig};

/// Arguments of `memexec prompt`.
#[derive(clap::Args)]
pub struct Args {
    /// The model directory (tokenizer.json, tokenizer_config.json, chat template).
    #[arg(long)]
    model: PathBuf,
    /// The pipeline stage (chunk, entity, route, section, synthesis, editor, or any name).
    #[arg(long)]
    stage: String,
    /// The system prompt; without it the stage's default applies ("" = none).
    #[arg(long)]
    system: Option<String>,
    /// The user message.
    #[arg(long)]
    user: String,
    /// A JSON stage map laid over the built-in defaults: {"stage": {"system": "..."}}.
    #[arg(long)]
    stages: Option<PathBuf>,
    /// Print one JSON object {stage, messages, text, ids} instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> memexec::Result<()> {
    let mut stages = StageConfig::builtin();
    if let Some(path) = &args.stages {
        stages = stages.merged(StageConfig::from_file(path)?);
    }
    let prompter = Prompter::from_dir(&args.model)?.with_stages(stages);
    let input = LocalInput {
        system: args.system,
        user: args.user,
    };
    let prompt = prompter.prompt(&args.stage, &input)?;
    if args.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            stage: &'a str,
            messages: &'a [memexec::prompt::Message],
            text: &'a str,
            ids: &'a [u32],
        }
        let out = Out {
            stage: &args.stage,
            messages: &prompt.messages,
            text: &prompt.text,
            ids: &prompt.ids,
        };
        let json = serde_json::to_string(&out)
            .map_err(|e| memexec::Error::InvalidArgument(format!("JSON output: {e}")))?;
        println!("{json}");
    } else {
        println!("{}", prompt.text);
        println!("--- {} ids", prompt.ids.len());
        let ids: Vec<String> = prompt.ids.iter().map(u32::to_string).collect();
        println!("{}", ids.join(" "));
    }
    Ok(())
}
