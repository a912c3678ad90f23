//! The C ABI. Every `extern "C"` function lives under this module, one file per concern; it is
//! the only part of the crate allowed to use `unsafe`. Every body runs in [`guard::guard`].
#![allow(unsafe_code)]
// C names for C types: the header is what C and Swift hosts read.
#![allow(non_camel_case_types)]

mod r#async;
mod call;
mod guard;
mod handle;
mod prompt;
mod stats;
mod status;
mod strings;

pub use handle::memexec;
pub use status::memexec_status;

/// The ABI version of this header and library: bumped on every incompatible change.
pub const MEMEXEC_ABI_VERSION: u32 = 1;

/// Returns the ABI version the library was built with (`MEMEXEC_ABI_VERSION`).
///
/// Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn memexec_abi_version() -> u32 {
    MEMEXEC_ABI_VERSION
}
