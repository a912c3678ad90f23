//! The C ABI. Every `extern "C"` function lives under this module; it is the only
//! part of the crate allowed to use `unsafe`.
#![allow(unsafe_code)]

/// The ABI version of this header and library: bumped on every incompatible change.
pub const MEMEXEC_ABI_VERSION: u32 = 1;

/// Returns the ABI version the library was built with (`MEMEXEC_ABI_VERSION`).
///
/// Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn memexec_abi_version() -> u32 {
    MEMEXEC_ABI_VERSION
}
