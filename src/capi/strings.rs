//! Strings across the boundary: borrowed C inputs in, library-owned UTF-8 out, and the free
//! function for the latter.
use std::ffi::{c_char, CStr, CString};

use crate::{Error, Result};

/// Frees a string returned by any `memexec_*` function (a result or an error message).
///
/// Ownership: takes back a string the library gave you; passing NULL does nothing. Passing
/// anything else (a string not from memexec, or one already freed) is undefined behaviour.
/// Thread-safe: a string may be freed on any thread.
#[no_mangle]
pub extern "C" fn memexec_string_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    // SAFETY: by the documented contract `s` came from `CString::into_raw` in `into_c_string`
    // and has not been freed; `from_raw` retakes ownership exactly once.
    let _ = std::panic::catch_unwind(|| drop(unsafe { CString::from_raw(s) }));
}

/// Borrows a required NUL-terminated UTF-8 argument.
pub(crate) fn arg_str<'a>(p: *const c_char, name: &'static str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::NullArgument(name));
    }
    // SAFETY: `p` is non-NULL and, by the header's contract, points to a NUL-terminated string
    // that stays valid for the duration of the call.
    let bytes = unsafe { CStr::from_ptr(p) };
    bytes.to_str().map_err(|_| Error::InvalidUtf8(name))
}

/// Borrows an optional argument: NULL is `None`.
pub(crate) fn opt_arg_str<'a>(p: *const c_char, name: &'static str) -> Result<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        arg_str(p, name).map(Some)
    }
}

/// A library-owned copy of `s`. A NUL inside the text (which C could not see past) becomes
/// U+FFFD.
pub(crate) fn into_c_string(s: String) -> *mut c_char {
    let c = CString::new(s).unwrap_or_else(|e| {
        let text = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\u{FFFD}");
        CString::new(text).unwrap_or_default()
    });
    c.into_raw()
}

/// Stores `value` through a nullable out-pointer; frees it instead when the host passed NULL.
pub(crate) fn write_out(out: *mut *mut c_char, value: *mut c_char) {
    if out.is_null() {
        memexec_string_free(value);
    } else {
        // SAFETY: `out` is non-NULL and, by the header's contract, points to writable storage
        // for one `char*`.
        unsafe { out.write(value) };
    }
}

/// Checks that a required out-pointer is non-NULL before any work is done.
pub(crate) fn require_out<T>(out: *mut T, name: &'static str) -> Result<()> {
    if out.is_null() {
        Err(Error::NullArgument(name))
    } else {
        Ok(())
    }
}
