//! Opt-in activation traces for parity debugging: with `MEMEXEC_TRACE_DIR` set, every
//! one-row Gemma-4 forward call writes what each layer produced (hidden state, RoPE'd queries,
//! the keys / values its attention saw, the attention output) and the logits to
//! `DIR/forward-NNNN.safetensors`, numbered in call order, so a difference from another
//! implementation (mlx-lm: `scripts/gpu/trace_compare.py`) can be pinned to a call, a layer
//! and a tensor instead of a late token id.
//!
//! Off (no env var) it costs one cached env lookup per forward call; on, every traced array
//! stays alive until the call's file is written, which can be hundreds of MB on a long prompt.
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use mlx_rs::Array;

use crate::error::{Error, Result};

fn trace_dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("MEMEXEC_TRACE_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// Forward calls traced so far in this process (names the files).
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The named arrays of one traced forward call.
pub struct Trace {
    dir: PathBuf,
    arrays: Vec<(String, Array)>,
}

impl Trace {
    /// A trace for a forward over `rows` rows: `None` unless `MEMEXEC_TRACE_DIR` is set and
    /// the call has one row (batched calls interleave rows and are compared through the
    /// batched == serial tests instead).
    pub fn start(rows: i32) -> Option<Trace> {
        let dir = trace_dir()?;
        (rows == 1).then(|| Trace {
            dir: dir.clone(),
            arrays: Vec::new(),
        })
    }

    /// Keeps `a` under `name` (a lazy array is evaluated when the file is written).
    pub fn record(&mut self, name: String, a: &Array) {
        self.arrays.push((name, a.clone()));
    }

    /// Writes `forward-NNNN.safetensors`.
    pub fn finish(self) -> Result<()> {
        let n = CALLS.fetch_add(1, Ordering::Relaxed);
        std::fs::create_dir_all(&self.dir).map_err(|source| Error::Io {
            path: self.dir.clone(),
            source,
        })?;
        let path = self.dir.join(format!("forward-{n:04}.safetensors"));
        Array::save_safetensors(
            self.arrays.iter().map(|(k, v)| (k.as_str(), v)),
            None,
            &path,
        )
        .map_err(|e| Error::InvalidArgument(format!("trace {}: {e}", path.display())))
    }
}
