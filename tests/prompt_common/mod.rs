//! Shared helpers of the prompt tests: where the setup-generated fixtures live, and loading
//! them once per test binary. A missing fixture fails the test with the command to run.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memexec::prompt::{ChatTemplate, Tokenizer, TokenizerConfig};

/// `$MEMEXEC_DEPS`, else the repository's `.deps` (written by scripts/setup.sh).
pub fn deps_dir() -> PathBuf {
    match std::env::var_os("MEMEXEC_DEPS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps"),
    }
}

/// Fails loudly when a generated fixture is missing.
pub fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "missing fixture {}: run scripts/setup.sh (hooks 20-tokenizers and 40-prompt-oracle)",
        path.display()
    );
    path
}

/// A committed test input under tests/data.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The tokenizer directory `gemma3` or `gemma4` (Gemma-4-renamed).
pub fn tokenizer_dir(name: &str) -> PathBuf {
    require(
        deps_dir()
            .join("tokenizers")
            .join(name)
            .join("tokenizer.json"),
    );
    deps_dir().join("tokenizers").join(name)
}

/// A JSON file of the prompt oracle.
pub fn oracle(name: &str) -> serde_json::Value {
    let path = require(deps_dir().join("fixtures/prompt-oracle").join(name));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn load(name: &str) -> (TokenizerConfig, Tokenizer) {
    let dir = tokenizer_dir(name);
    let config = TokenizerConfig::from_file(&dir.join("tokenizer_config.json")).unwrap();
    let tok = Tokenizer::from_dir(&dir, &config).unwrap();
    (config, tok)
}

/// The real Gemma-3 tokenizer, loaded once.
pub fn gemma3() -> &'static (TokenizerConfig, Tokenizer) {
    static T: OnceLock<(TokenizerConfig, Tokenizer)> = OnceLock::new();
    T.get_or_init(|| load("gemma3"))
}

/// The Gemma-4-renamed tokenizer, loaded once.
pub fn gemma4() -> &'static (TokenizerConfig, Tokenizer) {
    static T: OnceLock<(TokenizerConfig, Tokenizer)> = OnceLock::new();
    T.get_or_init(|| load("gemma4"))
}

/// The tokenizer the oracle paired with a template name.
pub fn tokenizer_for(template: &str) -> &'static (TokenizerConfig, Tokenizer) {
    if template == "gemma3" {
        gemma3()
    } else {
        gemma4()
    }
}

/// A committed template from tests/data with the Gemma-4 tokenizer's special tokens.
pub fn gemma4_template(file: &str) -> ChatTemplate {
    let source = std::fs::read_to_string(data(file)).unwrap();
    let (config, _) = gemma4();
    ChatTemplate::new(source, config.bos_token.clone(), config.eos_token.clone()).unwrap()
}

/// Messages of an oracle case.
pub fn messages(v: &serde_json::Value) -> Vec<memexec::prompt::Message> {
    serde_json::from_value(v.clone()).unwrap()
}
