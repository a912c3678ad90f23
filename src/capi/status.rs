//! Status codes of the C API, mapped once from [`crate::Error`].
use std::ffi::c_char;

use crate::Error;

/// The result of every `memexec_*` function (except `memexec_abi_version`,
/// `memexec_string_free` and `memexec_status_name`). Values are stable across versions.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum memexec_status {
    /// Success; out-parameters were written.
    Ok = 0,
    /// `memexec_poll` only: the request is still running; nothing was written.
    Pending = 1,
    /// A required pointer argument was NULL.
    NullArgument = 2,
    /// A string argument is not valid UTF-8.
    InvalidUtf8 = 3,
    /// A JSON argument is malformed, has an unknown key or a value of the wrong type.
    InvalidJson = 4,
    /// An argument is out of range: `max_tokens` 0 or above the cap, a batch above
    /// `limits.max_batch`.
    InvalidArgument = 5,
    /// The configuration is well-formed JSON but inconsistent (e.g. an undeclared adapter).
    InvalidConfig = 6,
    /// `memexec_new` could not load the model directory, tokenizer, template or an adapter.
    LoadFailed = 7,
    /// A prompt does not fit the model's context (or `limits.max_prompt_tokens`).
    PromptTooLong = 8,
    /// The request was cancelled with `memexec_cancel`.
    Cancelled = 9,
    /// The handle was freed while the request was queued or running.
    Closed = 10,
    /// The handle is NULL, already freed, or not from `memexec_new`.
    InvalidHandle = 11,
    /// `memexec_poll` / `memexec_cancel`: no request with that id (never submitted, or its
    /// result was already collected).
    UnknownRequest = 12,
    /// The model, tokenizer or chat template failed on this request (an MLX error, a template
    /// `raise_exception`).
    GenerationFailed = 13,
    /// A bug inside memexec (a caught panic); the handle stays usable.
    Internal = 14,
}

/// The status an error is reported as; a batch reports its failing input's status.
pub(crate) fn status_of(e: &Error) -> memexec_status {
    use memexec_status as S;
    match e {
        Error::Mlx(_) | Error::Tokenizer(_) | Error::ChatTemplate(_) => S::GenerationFailed,
        Error::Io { .. }
        | Error::InvalidFile { .. }
        | Error::Config { .. }
        | Error::UnsupportedModel { .. }
        | Error::Tensor { .. }
        | Error::Adapter { .. }
        | Error::Load(_) => S::LoadFailed,
        Error::InvalidArgument(_) => S::InvalidArgument,
        Error::InvalidJson { .. } => S::InvalidJson,
        Error::InvalidConfig(_) => S::InvalidConfig,
        Error::NullArgument(_) => S::NullArgument,
        Error::InvalidUtf8(_) => S::InvalidUtf8,
        Error::PromptTooLong { .. } => S::PromptTooLong,
        Error::Cancelled => S::Cancelled,
        Error::Closed => S::Closed,
        Error::InvalidHandle => S::InvalidHandle,
        Error::UnknownRequest(_) => S::UnknownRequest,
        Error::BatchItem { source, .. } => status_of(source),
        Error::Internal(_) => S::Internal,
    }
}

impl memexec_status {
    /// Every status, in code order.
    pub const ALL: [memexec_status; 15] = [
        Self::Ok,
        Self::Pending,
        Self::NullArgument,
        Self::InvalidUtf8,
        Self::InvalidJson,
        Self::InvalidArgument,
        Self::InvalidConfig,
        Self::LoadFailed,
        Self::PromptTooLong,
        Self::Cancelled,
        Self::Closed,
        Self::InvalidHandle,
        Self::UnknownRequest,
        Self::GenerationFailed,
        Self::Internal,
    ];

    /// The C name, NUL-terminated (e.g. `"MEMEXEC_STATUS_OK\0"`).
    fn c_name(self) -> &'static str {
        match self {
            Self::Ok => "MEMEXEC_STATUS_OK\0",
            Self::Pending => "MEMEXEC_STATUS_PENDING\0",
            Self::NullArgument => "MEMEXEC_STATUS_NULL_ARGUMENT\0",
            Self::InvalidUtf8 => "MEMEXEC_STATUS_INVALID_UTF8\0",
            Self::InvalidJson => "MEMEXEC_STATUS_INVALID_JSON\0",
            Self::InvalidArgument => "MEMEXEC_STATUS_INVALID_ARGUMENT\0",
            Self::InvalidConfig => "MEMEXEC_STATUS_INVALID_CONFIG\0",
            Self::LoadFailed => "MEMEXEC_STATUS_LOAD_FAILED\0",
            Self::PromptTooLong => "MEMEXEC_STATUS_PROMPT_TOO_LONG\0",
            Self::Cancelled => "MEMEXEC_STATUS_CANCELLED\0",
            Self::Closed => "MEMEXEC_STATUS_CLOSED\0",
            Self::InvalidHandle => "MEMEXEC_STATUS_INVALID_HANDLE\0",
            Self::UnknownRequest => "MEMEXEC_STATUS_UNKNOWN_REQUEST\0",
            Self::GenerationFailed => "MEMEXEC_STATUS_GENERATION_FAILED\0",
            Self::Internal => "MEMEXEC_STATUS_INTERNAL\0",
        }
    }

    /// The C name (e.g. `"MEMEXEC_STATUS_OK"`); the Node addon uses it as the error `code`.
    pub fn name(self) -> &'static str {
        let n = self.c_name();
        &n[..n.len() - 1]
    }

    /// The status `e` is reported as (what the C API would return for it).
    pub fn of(e: &Error) -> memexec_status {
        status_of(e)
    }
}

/// The name of a status as a static NUL-terminated string (e.g. `"MEMEXEC_STATUS_OK"`), or
/// `"MEMEXEC_STATUS_UNKNOWN"` for a value this library does not define.
///
/// Ownership: the string is static; do not free it. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn memexec_status_name(status: i32) -> *const c_char {
    let name = memexec_status::ALL
        .iter()
        .find(|s| **s as i32 == status)
        .map_or("MEMEXEC_STATUS_UNKNOWN\0", |s| s.c_name());
    name.as_ptr().cast()
}
