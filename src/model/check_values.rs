//! The start-up self-checks of memexec's CUDA kernels: their deterministic inputs and their
//! once-per-thread answer.
//!
//! Why not MLX's random numbers: a self-check runs inside a user's process and must not move
//! MLX's global random state; a 32-bit LCG gives the same values on every machine.
use std::cell::Cell;
use std::thread::LocalKey;

use mlx_rs::{Array, Dtype};

use crate::error::Result;

/// A 32-bit linear congruential generator (Numerical Recipes' constants).
pub(super) struct Lcg(u32);

impl Lcg {
    /// A generator starting from `seed`.
    pub(super) fn new(seed: u32) -> Lcg {
        Lcg(seed)
    }

    /// A bf16 array of `shape` with values uniform in `[lo, lo + span)` (24 random bits each,
    /// then rounded to bf16).
    pub(super) fn bf16(&mut self, shape: &[i32], lo: f32, span: f32) -> Result<Array> {
        let n = shape.iter().product::<i32>() as usize;
        let data: Vec<f32> = (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (self.0 >> 8) as f32 / (1u32 << 24) as f32 * span + lo
            })
            .collect();
        Ok(Array::from_slice(&data, shape).as_dtype(Dtype::Bfloat16)?)
    }
}

/// Whether a kernel runs here and matches MLX (`check` passes), asked once per thread and kept
/// in `slot`; the variable `off` set to `0` says no without asking. A no is logged once at
/// `info` as `{what}: ...; {otherwise}`.
pub(super) fn passes_once(
    slot: &'static LocalKey<Cell<Option<bool>>>,
    off: &str,
    what: &str,
    otherwise: &str,
    check: impl FnOnce() -> Result<()>,
) -> bool {
    slot.with(|known| {
        if let Some(answer) = known.get() {
            return answer;
        }
        let answer = if std::env::var(off).is_ok_and(|v| v.trim() == "0") {
            tracing::info!("{what}: {off}=0; {otherwise}");
            false
        } else {
            match check() {
                Ok(()) => true,
                Err(e) => {
                    tracing::info!("{what}: kernel unavailable ({e}); {otherwise}");
                    false
                }
            }
        };
        known.set(Some(answer));
        answer
    })
}

/// Whether this is a Linux build whose MLX runs on the CPU: there MLX has no CUDA, so every
/// CUDA kernel's self-check must fail (on a GPU build it may well pass).
#[cfg(test)]
pub(super) fn linux_cpu_build() -> bool {
    cfg!(target_os = "linux")
        && !mlx_rs::Device::try_default().is_ok_and(|d| {
            d.get_type()
                .is_ok_and(|t| !matches!(t, mlx_rs::DeviceType::Cpu))
        })
}

/// Zeros of `shape` and `dtype`: inputs for the kernels' shape tests.
#[cfg(test)]
pub(super) fn zeros(shape: &[i32], dtype: Dtype) -> Array {
    mlx_rs::ops::zeros_dtype(shape, dtype).expect("zeros")
}
