//! The one wrapper every `extern "C"` body runs in: panics are caught, errors become a status
//! plus a library-owned message, and nothing unwinds into the host.
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::status::{memexec_status, status_of};
use super::strings::{into_c_string, write_out};
use crate::engine::panic_message;
use crate::{Error, Result};

/// Runs `body`; on `Err` (or a panic) writes the message to `out_error` when it is non-NULL and
/// returns the mapped status. On success `out_error` is left untouched.
pub(crate) fn guard(
    out_error: *mut *mut c_char,
    body: impl FnOnce() -> Result<memexec_status>,
) -> memexec_status {
    let result = catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|p| Err(Error::Internal(panic_message(&p))));
    match result {
        Ok(status) => status,
        Err(e) => {
            let status = status_of(&e);
            // A panic while formatting the message must not escape either.
            let message = catch_unwind(AssertUnwindSafe(|| e.to_string()))
                .unwrap_or_else(|_| "error (its message could not be formatted)".into());
            write_out(out_error, into_c_string(message));
            status
        }
    }
}
