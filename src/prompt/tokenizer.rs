//! The model's tokenizer (`tokenizer.json` through the `tokenizers` crate) with the special
//! tokens that `tokenizer_config.json` names.
use std::path::Path;

use super::tokenizer_config::TokenizerConfig;
use crate::{Error, Result};

/// A special token: its text and its id in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token text, e.g. `<bos>`.
    pub text: String,
    /// Its id.
    pub id: u32,
}

/// A loaded tokenizer. Encoding never adds special tokens: chat templates write the BOS
/// themselves, and adding it again would shift every id the model was trained on.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
    pad: Option<SpecialToken>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from `dir`, with the special tokens of `config` (normally the
    /// directory's `tokenizer_config.json`).
    pub fn from_dir(dir: &Path, config: &TokenizerConfig) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::Io {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::new(inner, config)
    }

    /// Wraps a `tokenizers` tokenizer; every special token the config names must exist in it.
    pub fn new(inner: tokenizers::Tokenizer, config: &TokenizerConfig) -> Result<Self> {
        let lookup = |what: &str, text: &Option<String>| -> Result<Option<SpecialToken>> {
            let Some(text) = text else { return Ok(None) };
            match inner.token_to_id(text) {
                Some(id) => Ok(Some(SpecialToken {
                    text: text.clone(),
                    id,
                })),
                None => Err(Error::Tokenizer(format!(
                    "tokenizer_config.json names {what} {text:?}, which is not in the vocabulary"
                ))),
            }
        };
        Ok(Self {
            bos: lookup("bos_token", &config.bos_token)?,
            eos: lookup("eos_token", &config.eos_token)?,
            pad: lookup("pad_token", &config.pad_token)?,
            inner,
        })
    }

    /// The beginning-of-sequence token, when the config names one.
    pub fn bos(&self) -> Option<&SpecialToken> {
        self.bos.as_ref()
    }

    /// The end-of-sequence token, when the config names one.
    pub fn eos(&self) -> Option<&SpecialToken> {
        self.eos.as_ref()
    }

    /// The padding token, when the config names one.
    pub fn pad(&self) -> Option<&SpecialToken> {
        self.pad.as_ref()
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token text (special tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encodes `text` WITHOUT adding special tokens (special token texts inside `text` still
    /// map to their ids, as in Hugging Face `encode(text, add_special_tokens=False)`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text, skipping special tokens (the model's output text).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, true)
    }

    /// Decodes ids to text, keeping special tokens (to show what a prompt looks like).
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, false)
    }

    fn decode_with(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }
}
