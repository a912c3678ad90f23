//! The one error type of the crate; the C API maps each variant to a stable status code.
use std::path::PathBuf;

/// Everything that can go wrong inside memexec.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An MLX operation failed (shape mismatch, unsupported dtype, backend error).
    #[error("mlx: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The caller passed something invalid (bad JSON, unknown key, empty input...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A model's `config.json` is unreadable, malformed, or lacks a required field.
    #[error("{path}: invalid model config: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint's architecture is not one memexec implements.
    #[error("{path}: unsupported model_type {model_type:?} (supported: gemma4, gemma4_text, gemma3, gemma3_text)")]
    UnsupportedModel {
        /// The config file.
        path: PathBuf,
        /// The `model_type` it declares.
        model_type: String,
    },
    /// A checkpoint tensor is missing, mis-shaped, of the wrong dtype, or unexpected.
    #[error("{file}: tensor {tensor:?}: {message}")]
    Tensor {
        /// The tensor's key in the checkpoint.
        tensor: String,
        /// The safetensors file it is in (or the model directory when it is missing).
        file: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A file exists but its content is unusable (malformed JSON, a missing key...).
    #[error("{path}: {reason}")]
    InvalidFile {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The tokenizer could not be loaded or failed to encode/decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be compiled or rendered (including the template's own
    /// `raise_exception` calls).
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

/// Shorthand for `Result<T, memexec::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
