//! memexec: one local language model (Gemma-4 / Gemma-3 on MLX) serving every call of a
//! memory pipeline, behind a C ABI (`include/memexec.h`), a `bun:ffi` binding (`ts/`) and a
//! Node-API addon (`bindings/node`).
//!
//! Layout: [`capi`] is the C boundary, [`mlx_ffi`] the few direct MLX-C calls and
//! [`nvrtc_ffi`] the CUDA runtime compiler (the only places with `unsafe`); the rest is safe
//! Rust.
#![deny(unsafe_code)]

pub mod bench;
pub mod capi;
pub mod config;
pub mod engine;
pub mod error;
pub mod generate;
pub mod lora;
pub mod mlx_ffi;
pub mod model;
pub mod nvrtc_ffi;
pub mod prompt;

pub use error::{Error, Result};

/// The header that `build.rs` generated from [`capi`] for this build; the committed
/// `include/memexec.h` must equal it (checked by `tests/header_drift.rs`).
#[doc(hidden)]
pub const GENERATED_HEADER: &str = include_str!(concat!(env!("OUT_DIR"), "/memexec.h"));
