//! Blocking calls: one input (`memexec_call`) or a batch (`memexec_batch`).
use std::ffi::c_char;

use super::guard::guard;
use super::handle::{lookup, memexec};
use super::status::memexec_status;
use super::strings::{arg_str, into_c_string, opt_arg_str, require_out, write_out};
use crate::engine::{CallOptions, Completion, LocalInput};
use crate::{Error, Result};

/// Parses `{system?, user}`.
pub(crate) fn parse_input(json: &str) -> Result<LocalInput> {
    serde_json::from_str(json).map_err(|e| Error::InvalidJson {
        what: "input_json",
        message: e.to_string(),
    })
}

/// Parses `[{system?, user}, ...]`.
pub(crate) fn parse_inputs(json: &str) -> Result<Vec<LocalInput>> {
    serde_json::from_str(json).map_err(|e| Error::InvalidJson {
        what: "inputs_json",
        message: e.to_string(),
    })
}

/// Parses `{max_tokens?}`; NULL means every default.
pub(crate) fn parse_opts(json: Option<&str>) -> Result<CallOptions> {
    match json {
        None => Ok(CallOptions::default()),
        Some(text) => serde_json::from_str(text).map_err(|e| Error::InvalidJson {
            what: "opts_json",
            message: e.to_string(),
        }),
    }
}

/// The JSON array of output texts a batch returns.
pub(crate) fn texts_json(done: &[Completion]) -> Result<String> {
    let texts: Vec<&str> = done.iter().map(|c| c.text.as_str()).collect();
    serde_json::to_string(&texts)
        .map_err(|e| Error::Internal(format!("cannot encode results: {e}")))
}

/// Generates a greedy completion for one input, blocking the calling thread until it is done.
///
/// - `stage` (required, UTF-8): selects the default system prompt and adapter; an unknown stage
///   is accepted and runs with neither.
/// - `input_json` (required): `{"system"?: string, "user": string}`; `system` overrides the
///   stage's default (`""` = no system message).
/// - `opts_json` (NULL = defaults): `{"max_tokens"?: 1..limits.max_tokens_cap}` (default
///   `limits.default_max_tokens`, 256).
/// - On success `*out_text` (required) receives the output text, special tokens skipped; free
///   it with `memexec_string_free`. On failure `*out_error` (nullable) receives a message to free
///   the same way. Each out-parameter is written only in its case.
///
/// Thread-safe: any number of threads may call at once; concurrent calls may share decode steps.
/// Arguments are borrowed for the duration of the call only.
///
/// Returns: `OK`; `NULL_ARGUMENT`; `INVALID_UTF8`; `INVALID_JSON`; `INVALID_ARGUMENT`
/// (`max_tokens` 0 or above the cap); `PROMPT_TOO_LONG`; `GENERATION_FAILED`; `CLOSED` (the
/// handle was freed meanwhile); `INVALID_HANDLE`; `INTERNAL`. The handle stays usable after any
/// error.
#[no_mangle]
pub extern "C" fn memexec_call(
    handle: *mut memexec,
    stage: *const c_char,
    input_json: *const c_char,
    opts_json: *const c_char,
    out_text: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_text, "out_text")?;
        let h = lookup(handle)?;
        let stage = arg_str(stage, "stage")?;
        let input = parse_input(arg_str(input_json, "input_json")?)?;
        let opts = parse_opts(opt_arg_str(opts_json, "opts_json")?)?;
        let done = h.engine.call(stage, input, opts)?;
        write_out(out_text, into_c_string(done.text));
        Ok(memexec_status::Ok)
    })
}

/// Generates a greedy completion for each input of a batch, blocking until all are done.
///
/// - `inputs_json` (required): a JSON array of `{"system"?, "user"}`; at most
///   `limits.max_batch` entries. An empty array returns `[]` at once.
/// - `stage`, `opts_json`: as for `memexec_call`, applied to every input.
/// - On success `*out_json` (required) receives a JSON array of output strings, `out[i]`
///   answering `inputs[i]`; free it with `memexec_string_free`. If any input fails, the batch
///   fails with that input's status, the message starts with `input <i>:`, and the other inputs
///   are cancelled.
///
/// Thread-safe, as `memexec_call`. Returns the statuses of `memexec_call`.
#[no_mangle]
pub extern "C" fn memexec_batch(
    handle: *mut memexec,
    stage: *const c_char,
    inputs_json: *const c_char,
    opts_json: *const c_char,
    out_json: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_json, "out_json")?;
        let h = lookup(handle)?;
        let stage = arg_str(stage, "stage")?;
        let inputs = parse_inputs(arg_str(inputs_json, "inputs_json")?)?;
        let opts = parse_opts(opt_arg_str(opts_json, "opts_json")?)?;
        let done = h.engine.batch(stage, inputs, opts)?;
        write_out(out_json, into_c_string(texts_json(&done)?));
        Ok(memexec_status::Ok)
    })
}
