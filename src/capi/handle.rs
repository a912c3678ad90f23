//! The opaque handle: creation, lookup and release.
//!
//! A `memexec*` is a token, never dereferenced: it names an entry of a process-wide registry of
//! `Arc`s. A call looks its handle up (cloning the `Arc`) and works on that clone, so
//! `memexec_free` while calls are in flight is safe (they end with `MEMEXEC_STATUS_CLOSED`), and a
//! freed or made-up handle gives `MEMEXEC_STATUS_INVALID_HANDLE` instead of a crash. Tokens are
//! never reused.
use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use super::guard::guard;
use super::status::memexec_status;
use super::strings::{arg_str, require_out};
use crate::config::Config;
use crate::engine::{Engine, Ticket};
use crate::{Error, Result};

/// An engine: one loaded model serving calls. Opaque; create with `memexec_new`, release with
/// `memexec_free`.
pub struct memexec {
    _private: [u8; 0],
}

/// What a handle token stands for.
pub(crate) struct Handle {
    pub(crate) engine: Engine,
    pub(crate) tickets: Mutex<HashMap<u64, Ticket>>,
    pub(crate) next_request: AtomicU64,
}

static REGISTRY: LazyLock<Mutex<HashMap<usize, Arc<Handle>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// The handle behind a token, for the duration of one call.
pub(crate) fn lookup(h: *const memexec) -> Result<Arc<Handle>> {
    let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    registry
        .get(&(h as usize))
        .cloned()
        .ok_or(Error::InvalidHandle)
}

/// Loads a model and starts its engine from a JSON configuration document.
///
/// `config_json` (required, UTF-8): `{"model_dir": "...", "adapters": {"name": "dir"},
/// "stages": {"stage": {"adapter": "name", "system": "default system prompt"}},
/// "batch_width": 1, "device": "default"|"cpu"|"gpu", "weights": "auto"|"quantized"|"dense",
/// "decode_attention": "mlx"|"kernel", "row_kernel": "off"|"large"|"all", "limits": {"max_batch": 4096,
/// "max_tokens_cap": 64000, "default_max_tokens": 256, "max_prompt_tokens": null,
/// "max_kv_bytes": null}, "speculate": {"max_drafts": 4, "ngram": 3}}`.
/// Only `model_dir` is required; unknown keys are an error. `batch_width` defaults to
/// `$MLX_BUN_MEMORY_BATCH`, else 8 (batched; `1` = serial). `speculate` (absent = off)
/// verifies up to `max_drafts` tokens drafted from the prompt and output per decode step (a
/// batched engine: while a call runs alone): the same answers as without it, in fewer steps
/// where the text repeats.
///
/// On success writes a new handle to `*out_handle` (required). On failure writes a message to
/// `*out_error` when it is non-NULL (free it with `memexec_string_free`) and leaves
/// `*out_handle` untouched. Nothing of a failed start is kept: calling again retries.
///
/// Blocks while the model loads. Thread-safe: any number of handles may exist.
///
/// Returns: `OK`; `NULL_ARGUMENT`; `INVALID_UTF8`; `INVALID_JSON` (malformed, unknown key, wrong
/// type); `INVALID_CONFIG` (inconsistent values); `LOAD_FAILED` (missing or corrupt model
/// directory, tokenizer, template, or a bad adapter; the message names the file); `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_new(
    config_json: *const c_char,
    out_handle: *mut *mut memexec,
    out_error: *mut *mut c_char,
) -> memexec_status {
    guard(out_error, || {
        require_out(out_handle, "out_handle")?;
        let config = Config::from_json(arg_str(config_json, "config_json")?)?;
        let engine = Engine::new(config)?;
        let handle = Arc::new(Handle {
            engine,
            tickets: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
        });
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) as usize;
        REGISTRY
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, handle);
        // SAFETY: `out_handle` was checked non-NULL above; the host provides storage for one
        // pointer. The token is an integer disguised as an opaque pointer and never dereferenced.
        unsafe { out_handle.write(token as *mut memexec) };
        Ok(memexec_status::Ok)
    })
}

/// Stops the engine and releases the model.
///
/// Requests queued or running on this handle (in other threads, or submitted and not yet
/// polled) end with `CLOSED`; this returns once the engine thread has ended. Afterwards the
/// handle is invalid: any call with it returns `INVALID_HANDLE` (it is never reused).
///
/// Thread-safe, including while other threads are inside calls on the same handle.
///
/// Returns: `OK`; `INVALID_HANDLE` (NULL, already freed, or unknown); `INTERNAL`.
#[no_mangle]
pub extern "C" fn memexec_free(handle: *mut memexec) -> memexec_status {
    guard(std::ptr::null_mut(), || {
        let removed = REGISTRY
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(handle as usize))
            .ok_or(Error::InvalidHandle)?;
        removed.engine.close();
        Ok(memexec_status::Ok)
    })
}
