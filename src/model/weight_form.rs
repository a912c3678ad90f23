//! The form a quantized checkpoint's matrices take in memory: kept packed (MLX's affine
//! `quantized_matmul`, the mlx-lm numeric path) or dequantized once at load into dense
//! matrices run through the BLAS (`matmul`).
//!
//! Why two forms: on MLX's CPU backend the 4-bit kernel is scalar and compute-bound — a
//! batch of 8 rows costs 8 times one row, so batching cannot pay. A dense f32 matrix goes
//! through OpenBLAS's multi-threaded GEMM, which reads each weight once for all rows of a
//! batch (decode becomes bandwidth-bound: 8 rows cost about what 1 costs) and runs prefill
//! several times faster. On a GPU the packed form is the fast one (fewer bytes to read).
//!
//! Exactness: in the dense form every row of a batch must get the bits it gets alone. The
//! BLAS picks kernels by matrix size, so [`crate::model::linear`] runs a decode step's dense
//! products in calls of exactly eight rows, zero-padded, whatever the batch (see
//! `DENSE_STEP_ROWS`). The dense form is NOT bit-identical to mlx-lm (which runs the packed
//! kernel); the packed form is. Serial and batched always share the form.
use serde::Deserialize;

/// Which form to load: as configured (`weights` in the config, `--weights` on the CLI).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightChoice {
    /// [`WeightForm::Dense`] when it pays and fits: MLX's default device is the CPU, the
    /// checkpoint's scales are float32 (the BLAS path is f32) and the dense matrices take at
    /// most half of the physical memory; else [`WeightForm::Packed`].
    #[default]
    Auto,
    /// Keep the checkpoint's quantized matrices (mlx-lm's numeric path).
    Quantized,
    /// Dequantize every quantized matrix at load.
    Dense,
}

impl std::str::FromStr for WeightChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(WeightChoice::Auto),
            "quantized" => Ok(WeightChoice::Quantized),
            "dense" => Ok(WeightChoice::Dense),
            other => Err(format!(
                "unknown weights form {other:?} (auto, quantized, dense)"
            )),
        }
    }
}

/// The form a model was loaded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightForm {
    /// Quantized matrices stay packed.
    Packed,
    /// Quantized matrices were dequantized at load.
    Dense,
}

impl WeightForm {
    /// The name used in stats, logs and benchmark files.
    pub fn name(self) -> &'static str {
        match self {
            WeightForm::Packed => "quantized",
            WeightForm::Dense => "dense",
        }
    }
}

/// What [`WeightChoice::Auto`] decides from: facts about the device and the checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct AutoFacts {
    /// MLX's default device is the CPU.
    pub cpu: bool,
    /// The quantized matrices' scales are float32.
    pub f32_scales: bool,
    /// The checkpoint has quantized matrices at all.
    pub quantized: bool,
    /// Bytes of all matrices once dense.
    pub dense_bytes: u64,
    /// Physical memory, if known.
    pub memory_bytes: Option<u64>,
}

impl WeightChoice {
    /// The form to load, and why (for the load log).
    pub fn resolve(self, facts: &AutoFacts) -> (WeightForm, String) {
        match self {
            WeightChoice::Quantized => (WeightForm::Packed, "configured".into()),
            WeightChoice::Dense => (WeightForm::Dense, "configured".into()),
            WeightChoice::Auto if !facts.quantized => {
                (WeightForm::Packed, "the checkpoint is not quantized".into())
            }
            WeightChoice::Auto if !facts.cpu => (
                WeightForm::Packed,
                "auto: a GPU runs the packed kernels fastest".into(),
            ),
            WeightChoice::Auto if !facts.f32_scales => (
                WeightForm::Packed,
                "auto: the BLAS path is float32 and this checkpoint is not".into(),
            ),
            WeightChoice::Auto => match facts.memory_bytes {
                Some(m) if facts.dense_bytes <= m / 2 => (
                    WeightForm::Dense,
                    format!(
                        "auto: CPU, float32, {} MiB dense of {} MiB memory",
                        facts.dense_bytes >> 20,
                        m >> 20
                    ),
                ),
                Some(m) => (
                    WeightForm::Packed,
                    format!(
                        "auto: {} MiB dense would exceed half of {} MiB memory",
                        facts.dense_bytes >> 20,
                        m >> 20
                    ),
                ),
                None => (WeightForm::Packed, "auto: physical memory unknown".into()),
            },
        }
    }
}

/// Physical memory in bytes (Linux `/proc/meminfo`; `None` elsewhere).
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> AutoFacts {
        AutoFacts {
            cpu: true,
            f32_scales: true,
            quantized: true,
            dense_bytes: 1 << 30,
            memory_bytes: Some(24 << 30),
        }
    }

    #[test]
    fn auto_picks_dense_only_on_cpu_f32_when_it_fits() {
        assert_eq!(WeightChoice::Auto.resolve(&facts()).0, WeightForm::Dense);
        let gpu = AutoFacts {
            cpu: false,
            ..facts()
        };
        assert_eq!(WeightChoice::Auto.resolve(&gpu).0, WeightForm::Packed);
        let bf16 = AutoFacts {
            f32_scales: false,
            ..facts()
        };
        assert_eq!(WeightChoice::Auto.resolve(&bf16).0, WeightForm::Packed);
        let big = AutoFacts {
            dense_bytes: 13 << 30,
            ..facts()
        };
        assert_eq!(WeightChoice::Auto.resolve(&big).0, WeightForm::Packed);
        let unknown = AutoFacts {
            memory_bytes: None,
            ..facts()
        };
        assert_eq!(WeightChoice::Auto.resolve(&unknown).0, WeightForm::Packed);
        assert_eq!(
            WeightChoice::Dense.resolve(&unknown).0,
            WeightForm::Dense,
            "an explicit choice is obeyed"
        );
    }

    #[test]
    fn parses_names() {
        assert_eq!("dense".parse::<WeightChoice>(), Ok(WeightChoice::Dense));
        assert!("fp8".parse::<WeightChoice>().is_err());
    }
}
