//! The engine's counters as JSON.
use std::ffi::c_char;

use super::guard::guard;
use super::handle::{lookup, memexec};
use super::status::memexec_status;
use super::strings::{into_c_string, require_out, write_out};
use crate::Error;

/// Writes the engine's counters since `memexec_new` as a JSON object to `*out_json` (required;
/// free with `memexec_string_free`): `mode`, `weights`, `batch_width`, `load_seconds`,
/// `completed`, `failed`, `cancelled`, `tokens_in`, `tokens_out`, `prefill_seconds`,
/// `decode_seconds`, `peak_memory_bytes`, in batched mode `batched_steps` (decode steps, a
/// step over several rows counting once), and with `speculate` configured `speculation`
/// (`steps`, `steps_with_drafts`, `drafted`, `accepted`, `paused_steps`).
///
/// Thread-safe; never blocks on generation. Returns: `OK`; `NULL_ARGUMENT`; `INVALID_HANDLE`;
/// `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_stats(
    handle: *mut memexec,
    out_json: *mut *mut c_char,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_json, "out_json")?;
        let h = lookup(handle)?;
        let json =
            serde_json::to_string(&h.engine.stats()).map_err(|e| Error::Internal(e.to_string()))?;
        write_out(out_json, into_c_string(json));
        Ok(memexec_status::Ok)
    })
}
