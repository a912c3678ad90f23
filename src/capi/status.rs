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
    /// The model failed while generating (an MLX error).
    GenerationFailed = 13,
    /// A bug inside memexec (a caught panic); the handle stays usable.
    Internal = 14,
}

/// The status an error is reported as; a batch reports its failing input's status.
pub(crate) fn status_of(e: &Error) -> memexec_status {
    use memexec_status as S;
    match e {
        Error::Mlx(_) => S::GenerationFailed,
        Error::Io { .. } | Error::Load(_) => S::LoadFailed,
        Error::InvalidArgument(_) => S::InvalidArgument,
        Error::InvalidJson { .. } => S::InvalidJson,
        Error::Config(_) => S::InvalidConfig,
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

/// The name of a status as a static NUL-terminated string (e.g. `"MEMEXEC_STATUS_OK"`), or
/// `"MEMEXEC_STATUS_UNKNOWN"` for a value this library does not define.
///
/// Ownership: the string is static; do not free it. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn memexec_status_name(status: i32) -> *const c_char {
    let name: &'static [u8] = match status {
        0 => b"MEMEXEC_STATUS_OK\0",
        1 => b"MEMEXEC_STATUS_PENDING\0",
        2 => b"MEMEXEC_STATUS_NULL_ARGUMENT\0",
        3 => b"MEMEXEC_STATUS_INVALID_UTF8\0",
        4 => b"MEMEXEC_STATUS_INVALID_JSON\0",
        5 => b"MEMEXEC_STATUS_INVALID_ARGUMENT\0",
        6 => b"MEMEXEC_STATUS_INVALID_CONFIG\0",
        7 => b"MEMEXEC_STATUS_LOAD_FAILED\0",
        8 => b"MEMEXEC_STATUS_PROMPT_TOO_LONG\0",
        9 => b"MEMEXEC_STATUS_CANCELLED\0",
        10 => b"MEMEXEC_STATUS_CLOSED\0",
        11 => b"MEMEXEC_STATUS_INVALID_HANDLE\0",
        12 => b"MEMEXEC_STATUS_UNKNOWN_REQUEST\0",
        13 => b"MEMEXEC_STATUS_GENERATION_FAILED\0",
        14 => b"MEMEXEC_STATUS_INTERNAL\0",
        _ => b"MEMEXEC_STATUS_UNKNOWN\0",
    };
    name.as_ptr().cast()
}
