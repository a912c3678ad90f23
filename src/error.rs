//! The one error type of the crate; the C API maps each variant to a stable status code
//! (`src/capi/status.rs`), once.
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
    /// A JSON document passed by the caller is malformed, has an unknown key or a wrong type.
    #[error("invalid JSON in {what}: {message}")]
    InvalidJson {
        /// Which argument or document (e.g. "config", "input", "opts").
        what: &'static str,
        /// serde_json's description, with line and column.
        message: String,
    },
    /// The configuration document is well-formed JSON but inconsistent (e.g. a stage names an
    /// adapter that is not declared).
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A required pointer argument of the C API was NULL.
    #[error("argument `{0}` is NULL")]
    NullArgument(&'static str),
    /// A string argument of the C API is not valid UTF-8.
    #[error("argument `{0}` is not valid UTF-8")]
    InvalidUtf8(&'static str),
    /// The prompt does not fit the model's context (or the configured prompt limit).
    #[error("prompt has {tokens} tokens; the limit is {limit} ({why})")]
    PromptTooLong {
        /// Prompt length in tokens.
        tokens: usize,
        /// The limit it exceeds.
        limit: usize,
        /// Which limit: the model's context or `limits.max_prompt_tokens`.
        why: &'static str,
    },
    /// Loading the model, tokenizer, template or an adapter failed; the handle was not created.
    #[error("could not load the model: {0}")]
    Load(Box<Error>),
    /// The request was cancelled before it finished.
    #[error("request cancelled")]
    Cancelled,
    /// The engine was shut down (`memexec_free`) while the request was queued or running.
    #[error("the engine was closed while the request was in flight")]
    Closed,
    /// A C handle that is NULL, already freed, or was never returned by `memexec_new`.
    #[error("invalid handle (NULL, already freed, or not from memexec_new)")]
    InvalidHandle,
    /// `memexec_poll` / `memexec_cancel` got an id that is unknown (never submitted, or its result
    /// was already collected).
    #[error("unknown request id {0}")]
    UnknownRequest(u64),
    /// Input `index` of a batch failed; the batch failed with it.
    #[error("input {index}: {source}")]
    BatchItem {
        /// The failing input's position in the batch.
        index: usize,
        /// Why it failed.
        source: Box<Error>,
    },
    /// A bug: a panic was caught at the boundary, or an internal invariant broke.
    #[error("internal error: {0}")]
    Internal(String),
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
    /// A LoRA adapter cannot be read or mounted on this model (the message names the tensor,
    /// or the config key, and the expected vs found shape).
    #[error("adapter {dir}: {message}")]
    Adapter {
        /// The adapter directory.
        dir: PathBuf,
        /// What is wrong (one line per problem).
        message: String,
    },
}

/// Shorthand for `Result<T, memexec::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
