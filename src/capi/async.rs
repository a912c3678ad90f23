//! Non-blocking requests for hosts with an event loop: submit, poll, cancel.
use std::ffi::c_char;
use std::sync::atomic::Ordering;

use super::call::{parse_input, parse_inputs, parse_opts, texts_json};
use super::guard::guard;
use super::handle::{lookup, memexec, Handle};
use super::status::memexec_status;
use super::strings::{arg_str, into_c_string, opt_arg_str, require_out, write_out};
use crate::engine::Ticket;
use crate::{Error, Result};

fn register(h: &Handle, ticket: Ticket, out_id: *mut u64) -> Result<memexec_status> {
    let id = h.next_request.fetch_add(1, Ordering::Relaxed);
    h.tickets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, ticket);
    // SAFETY: `out_id` was checked non-NULL by the caller; the host provides storage for one
    // `uint64_t`.
    unsafe { out_id.write(id) };
    Ok(memexec_status::Ok)
}

/// Queues one input and returns at once with a request id for `memexec_poll`.
///
/// Arguments as for `memexec_call`; on success `*out_id` (required) receives the id (ids are
/// unique per handle and never 0). Validation errors (bad JSON, `max_tokens`) are reported here;
/// generation errors are reported by `memexec_poll`. Every submitted id must eventually be polled
/// to a non-`PENDING` status (or the handle freed), or its result is held in memory.
///
/// Thread-safe; never blocks on generation.
///
/// Returns: `OK`; `NULL_ARGUMENT`; `INVALID_UTF8`; `INVALID_JSON`; `INVALID_ARGUMENT`; `CLOSED`;
/// `INVALID_HANDLE`; `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_submit(
    handle: *mut memexec,
    stage: *const c_char,
    input_json: *const c_char,
    opts_json: *const c_char,
    out_id: *mut u64,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_id, "out_id")?;
        let h = lookup(handle)?;
        let stage = arg_str(stage, "stage")?;
        let input = parse_input(arg_str(input_json, "input_json")?)?;
        let opts = parse_opts(opt_arg_str(opts_json, "opts_json")?)?;
        let ticket = h.engine.submit(stage, input, opts)?;
        register(&h, ticket, out_id)
    })
}

/// Queues a batch (arguments as for `memexec_batch`) and returns at once with a request id;
/// `memexec_poll` then yields the JSON array of outputs. An empty batch completes at once.
///
/// Thread-safe; never blocks on generation. Returns the statuses of `memexec_submit`.
#[no_mangle]
pub extern "C" fn memexec_submit_batch(
    handle: *mut memexec,
    stage: *const c_char,
    inputs_json: *const c_char,
    opts_json: *const c_char,
    out_id: *mut u64,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_id, "out_id")?;
        let h = lookup(handle)?;
        let stage = arg_str(stage, "stage")?;
        let inputs = parse_inputs(arg_str(inputs_json, "inputs_json")?)?;
        let opts = parse_opts(opt_arg_str(opts_json, "opts_json")?)?;
        let ticket = h.engine.submit_batch(stage, inputs, opts)?;
        register(&h, ticket, out_id)
    })
}

/// Checks a submitted request without blocking.
///
/// - `PENDING`: still running; nothing written; poll again later.
/// - `OK`: `*out_result` (required) receives the output text (`memexec_submit`) or the JSON
///   array of outputs (`memexec_submit_batch`); free it with `memexec_string_free`.
/// - Any other status: the request failed (`*out_error`, nullable, receives the message), e.g.
///   `CANCELLED`, `CLOSED`, `PROMPT_TOO_LONG`, `GENERATION_FAILED`.
///
/// After any status but `PENDING` the id is forgotten (polling it again gives
/// `UNKNOWN_REQUEST`). Thread-safe.
#[no_mangle]
pub extern "C" fn memexec_poll(
    handle: *mut memexec,
    request_id: u64,
    out_result: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_result, "out_result")?;
        let h = lookup(handle)?;
        let mut ticket = h
            .tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request_id)
            .ok_or(Error::UnknownRequest(request_id))?;
        // Polled outside the table's lock; an unfinished ticket goes back in.
        let Some(result) = ticket.poll() else {
            h.tickets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(request_id, ticket);
            return Ok(memexec_status::Pending);
        };
        let mut done = result?;
        let text = if ticket.is_batch() {
            texts_json(&done)?
        } else {
            done.pop()
                .map(|c| c.text)
                .ok_or_else(|| Error::Internal("a single request produced no completion".into()))?
        };
        write_out(out_result, into_c_string(text));
        Ok(memexec_status::Ok)
    })
}

/// Asks a submitted request to stop. Its next `memexec_poll` returns `CANCELLED` (or `OK`, if
/// it had already finished). Returns at once.
///
/// Thread-safe. Returns: `OK`; `UNKNOWN_REQUEST`; `INVALID_HANDLE`; `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_cancel(
    handle: *mut memexec,
    request_id: u64,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        let h = lookup(handle)?;
        let tickets = h.tickets.lock().unwrap_or_else(|p| p.into_inner());
        tickets
            .get(&request_id)
            .ok_or(Error::UnknownRequest(request_id))?
            .cancel();
        Ok(memexec_status::Ok)
    })
}
