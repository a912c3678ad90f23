//! memexec's CUDA kernels as MLX calls them: through MLX's JIT (`fast::cuda_kernel`) or as
//! precompiled kernels (`fast::precompiled_cuda_kernel`), [`Calls`] says which.
//!
//! Why precompiled: a `cuda_kernel` call makes MLX assemble the kernel's whole source text
//! (header, signature, template constants, body) into every graph node and pass each input's
//! shape and strides as arguments. For memexec's one-row product (~6.5 KB of text, four inputs,
//! three shapes, four template constants) that cost the host ~5 us per call more than MLX's
//! own product, where a trivial custom kernel costs about what an MLX op does (session 39), in
//! a decode step that is bound by the host. A precompiled call carries a symbol, the arrays
//! and `int` scalars.
//!
//! How: [`Kernel`] takes a kernel exactly as `cuda_kernel` does (input and output names, a
//! body, a header, template constants per call) and, for each form it is called with
//! (template constants, input dtypes and ranks, output dtypes), writes the `extern "C"` kernel
//! MLX's JIT would have written around the body, with the shapes, strides and ranks the body
//! reads passed as `int` scalars and rebuilt as the arrays the body indexes. The body is
//! untouched, so both ways run the same arithmetic. The module is compiled once per process by
//! the NVRTC MLX links, with the architecture and include paths MLX's JIT uses
//! ([`crate::nvrtc_ffi`]), after [`PRELUDE`] (what the kernels take from MLX's default header).
//! It is not compiled through MLX and read back from MLX's kernel cache, as first built:
//! MLX 0.32.2 keeps custom kernels out of that cache (session 42, H100).
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::rc::Rc;

use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};
use crate::mlx_ffi::{
    is_row_contiguous, versioned_name, CudaKernel, PrecompiledKernel, TemplateArg,
};
use crate::nvrtc_ffi;

/// How memexec calls its CUDA kernels (`MEMEXEC_KERNEL_CALLS`): `jit` (MLX's `cuda_kernel`,
/// the default until the precompiled calls are measured on a device) or `precompiled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Calls {
    /// MLX's `cuda_kernel`: the source text in every call.
    #[default]
    Jit,
    /// MLX's `precompiled_cuda_kernel`: each form compiled once, then only launched.
    Precompiled,
}

impl Calls {
    /// What `MEMEXEC_KERNEL_CALLS` asks for (read once per process): `precompiled`, or
    /// anything else (or nothing) for [`Calls::Jit`].
    pub fn from_env() -> Calls {
        static CALLS: std::sync::OnceLock<Calls> = std::sync::OnceLock::new();
        *CALLS.get_or_init(|| {
            match std::env::var("MEMEXEC_KERNEL_CALLS")
                .map(|v| v.trim().to_ascii_lowercase())
                .as_deref()
            {
                Ok("precompiled") => Calls::Precompiled,
                _ => Calls::Jit,
            }
        })
    }
}

/// Which of an input's shape, strides and rank a body reads (`<name>_shape`, `_strides`,
/// `_ndim`: what MLX passes a `cuda_kernel` when its body names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reads {
    shape: bool,
    strides: bool,
    ndim: bool,
}

/// A custom CUDA kernel, called through MLX's JIT or precompiled ([`Calls::from_env`]); the
/// interface of [`CudaKernel`].
pub struct Kernel {
    /// The JIT form, made on its first call (on a build without MLX CUDA, making it fails).
    jit: RefCell<Option<Rc<CudaKernel>>>,
    calls: Calls,
    name: String,
    inputs: Vec<String>,
    reads: Vec<Reads>,
    outputs: Vec<String>,
    body: String,
    header: String,
    ensure_row_contiguous: bool,
    /// The precompiled kernel of each form called so far, by [`Kernel::form_key`]; `None`
    /// for a form that could not be precompiled (its calls go through MLX's JIT).
    forms: RefCell<HashMap<Vec<u8>, Option<Rc<PrecompiledKernel>>>>,
}

impl Kernel {
    /// A kernel named `name` with these input and output names and body; `header` goes after
    /// MLX's default header (includes, helpers). See [`CudaKernel::new`]; nothing is made or
    /// compiled before the first call.
    pub fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
        ensure_row_contiguous: bool,
    ) -> Result<Kernel> {
        let reads = inputs
            .iter()
            .map(|n| Reads {
                shape: source.contains(&format!("{n}_shape")),
                strides: source.contains(&format!("{n}_strides")),
                ndim: source.contains(&format!("{n}_ndim")),
            })
            .collect();
        Ok(Kernel {
            jit: RefCell::new(None),
            calls: Calls::from_env(),
            name: name.to_string(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            reads,
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            body: source.to_string(),
            header: header.to_string(),
            ensure_row_contiguous,
            forms: RefCell::new(HashMap::new()),
        })
    }

    /// The kernel over `inputs` (in the order of the input names), making one output per
    /// `(shape, dtype)`; `grid` counts THREADS per axis (MLX divides by `threadgroup`). See
    /// [`CudaKernel::apply`].
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        grid: [i32; 3],
        threadgroup: [i32; 3],
        template: &[(&str, TemplateArg)],
    ) -> Result<Vec<Array>> {
        if self.calls == Calls::Jit {
            return self
                .jit()?
                .apply(inputs, outputs, grid, threadgroup, template);
        }
        if inputs.len() != self.inputs.len() || outputs.len() != self.outputs.len() {
            return Err(Error::InvalidArgument(format!(
                "kernel `{}`: {} inputs and {} outputs for {} and {}",
                self.name,
                inputs.len(),
                outputs.len(),
                self.inputs.len(),
                self.outputs.len()
            )));
        }
        let Some(kernel) = self.form(inputs, outputs, template) else {
            return self
                .jit()?
                .apply(inputs, outputs, grid, threadgroup, template);
        };
        let mut scalars = Vec::new();
        for (a, reads) in inputs.iter().zip(&self.reads) {
            if a.ndim() == 0 {
                continue;
            }
            if reads.shape {
                scalars.extend_from_slice(a.shape());
            }
            if reads.strides {
                // The strides of what the kernel reads: MLX copies an input that is not row
                // contiguous first where the kernel ensures it.
                let strides: Vec<i64> = if self.ensure_row_contiguous && !is_row_contiguous(a) {
                    row_strides(a.shape())
                } else {
                    a.strides().iter().map(|&s| s as i64).collect()
                };
                for s in strides {
                    // int64 strides as (low, high) 32-bit halves.
                    scalars.extend([s as i32, (s >> 32) as i32]);
                }
            }
            if reads.ndim {
                scalars.push(a.ndim() as i32);
            }
        }
        kernel.apply(
            inputs,
            outputs,
            &scalars,
            grid,
            threadgroup,
            self.ensure_row_contiguous,
        )
    }

    /// The JIT form, made the first time it is called.
    fn jit(&self) -> Result<Rc<CudaKernel>> {
        if let Some(k) = self.jit.borrow().as_ref() {
            return Ok(k.clone());
        }
        let inputs: Vec<&str> = self.inputs.iter().map(String::as_str).collect();
        let outputs: Vec<&str> = self.outputs.iter().map(String::as_str).collect();
        let made = Rc::new(CudaKernel::new(
            &self.name,
            &inputs,
            &outputs,
            &self.body,
            &self.header,
            self.ensure_row_contiguous,
        )?);
        *self.jit.borrow_mut() = Some(made.clone());
        Ok(made)
    }

    /// What tells one compiled form from another: the template constants, the inputs' dtypes
    /// and ranks, the outputs' dtypes. Bytes, not text: this runs on every call, in a decode
    /// step bound by the host, and formatting cost microseconds per call.
    fn form_key(
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        template: &[(&str, TemplateArg)],
    ) -> Vec<u8> {
        let mut key = Vec::with_capacity(8 * template.len() + 2 * inputs.len() + outputs.len());
        // Each constant as (name length, name, tag, value): a key reads back one way only.
        for (n, arg) in template {
            key.push(n.len() as u8);
            key.extend_from_slice(n.as_bytes());
            match arg {
                TemplateArg::Int(v) => {
                    key.push(b'=');
                    key.extend_from_slice(&v.to_le_bytes());
                }
                TemplateArg::Dtype(d) => key.extend([b':', *d as u8]),
            }
        }
        for a in inputs {
            key.extend([a.dtype() as u8, a.ndim() as u8]);
        }
        key.push(b'|');
        key.extend(outputs.iter().map(|(_, d)| *d as u8));
        key
    }

    /// The form of a call as text, for messages.
    fn form_text(
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        template: &[(&str, TemplateArg)],
    ) -> String {
        let mut text = String::new();
        for (n, arg) in template {
            let _ = match arg {
                TemplateArg::Int(v) => write!(text, "{n}={v};"),
                TemplateArg::Dtype(d) => write!(text, "{n}={d:?};"),
            };
        }
        for a in inputs {
            let _ = write!(text, "{:?}/{},", a.dtype(), a.ndim());
        }
        for (_, d) in outputs {
            let _ = write!(text, "{d:?},");
        }
        text
    }

    /// The precompiled kernel for this call's form, compiled the first time it is asked for;
    /// `None` where that failed (logged once per form: the calls stay correct through MLX's
    /// JIT, which compiles the same body).
    fn form(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        template: &[(&str, TemplateArg)],
    ) -> Option<Rc<PrecompiledKernel>> {
        let key = Self::form_key(inputs, outputs, template);
        if let Some(k) = self.forms.borrow().get(&key) {
            return k.clone();
        }
        let symbol = versioned_name(&self.name, &(&key, &self.body, &self.header));
        let made = self
            .module_source(&symbol, inputs, outputs, template)
            .inspect(|source| dump(&symbol, source))
            .and_then(|source| compile(&symbol, &source))
            .and_then(|image| PrecompiledKernel::new(&symbol, image));
        let made = match made {
            Ok(k) => Some(Rc::new(k)),
            Err(e) => {
                tracing::warn!(
                    kernel = %self.name,
                    form = %Self::form_text(inputs, outputs, template),
                    "kernel could not be precompiled ({e}); its calls go through MLX's JIT"
                );
                None
            }
        };
        self.forms.borrow_mut().insert(key, made.clone());
        made
    }

    /// The module of one form: this kernel's header, then an `extern "C"` kernel `symbol` with
    /// the signature MLX's JIT would write for these inputs, outputs and constants, except
    /// that each shape / strides / rank the body reads is passed as `int` scalars (after the
    /// outputs: MLX's precompiled calls pass inputs, outputs, scalars) and rebuilt as the
    /// local array the body indexes.
    fn module_source(
        &self,
        symbol: &str,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        template: &[(&str, TemplateArg)],
    ) -> Result<String> {
        let mut params = Vec::new();
        let mut scalars = Vec::new();
        let mut prologue = String::new();
        for ((name, a), reads) in self.inputs.iter().zip(inputs).zip(&self.reads) {
            params.push(format!("const {}* {name}", cuda_type(a.dtype())?));
            let nd = a.ndim();
            if nd == 0 {
                continue;
            }
            if reads.shape {
                let dims: Vec<String> = (0..nd).map(|i| format!("{name}_shape_{i}")).collect();
                scalars.extend(dims.iter().map(|d| format!("int {d}")));
                writeln!(
                    prologue,
                    "const int {name}_shape[{nd}] = {{{}}};",
                    dims.join(", ")
                )
                .expect("writing to a String");
            }
            if reads.strides {
                let mut strides = Vec::new();
                for i in 0..nd {
                    scalars.push(format!("int {name}_strides_{i}_lo"));
                    scalars.push(format!("int {name}_strides_{i}_hi"));
                    strides.push(format!(
                        "static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(\
                         {name}_strides_{i}_hi)) << 32) | static_cast<uint32_t>({name}_strides_{i}_lo))"
                    ));
                }
                writeln!(
                    prologue,
                    "const int64_t {name}_strides[{nd}] = {{{}}};",
                    strides.join(", ")
                )
                .expect("writing to a String");
            }
            if reads.ndim {
                scalars.push(format!("int {name}_ndim"));
            }
        }
        for (name, (_, dtype)) in self.outputs.iter().zip(outputs) {
            params.push(format!("{}* {name}", cuda_type(*dtype)?));
        }
        params.extend(scalars);
        let mut constants = String::new();
        for (name, arg) in template {
            match arg {
                TemplateArg::Int(v) => writeln!(constants, "  constexpr int {name} = {v};"),
                TemplateArg::Dtype(d) => {
                    writeln!(constants, "  using {name} = {};", cuda_type(*d)?)
                }
            }
            .expect("writing to a String");
        }
        Ok(format!(
            "{header}\nnamespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n\
             extern \"C\" __global__ void {symbol}(\n    {params}) {{\n{constants}{prologue}\n{body}\n}}\n\n\
             }} // namespace mlx::core::cu\n",
            header = self.header,
            params = params.join(",\n    "),
            body = self.body,
        ))
    }
}

/// Writes a module's source to `$MEMEXEC_KERNEL_DUMP_DIR/<symbol>.cu` where that is set: what
/// NVRTC compiled, to read or compile by hand when a form fails.
fn dump(symbol: &str, source: &str) {
    if let Some(dir) = std::env::var_os("MEMEXEC_KERNEL_DUMP_DIR") {
        let path = PathBuf::from(dir).join(format!("{symbol}.cu"));
        if let Err(e) = std::fs::write(&path, source) {
            tracing::warn!("could not write {}: {e}", path.display());
        }
    }
}

/// The CUDA type MLX's JIT writes for `dtype` (`dtype_to_cuda_type`, MLX 0.32.2).
fn cuda_type(dtype: Dtype) -> Result<&'static str> {
    Ok(match dtype {
        Dtype::Bool => "bool",
        Dtype::Uint8 => "uint8_t",
        Dtype::Uint16 => "uint16_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Uint64 => "uint64_t",
        Dtype::Int8 => "int8_t",
        Dtype::Int16 => "int16_t",
        Dtype::Int32 => "int32_t",
        Dtype::Int64 => "int64_t",
        Dtype::Float16 => "__half",
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float32 => "float",
        other => {
            return Err(Error::InvalidArgument(format!(
                "precompiled kernel: no CUDA type for {other:?}"
            )))
        }
    })
}

/// The strides of a row-contiguous array of `shape`.
fn row_strides(shape: &[i32]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * i64::from(shape[i + 1]);
    }
    strides
}

/// What every precompiled module is compiled after: the part of MLX's default custom-kernel
/// header memexec's kernels use ([`compile`]).
pub const PRELUDE: &str = include_str!("kernels/precompiled_prelude.cuh");

/// The compiled image of `source` (a module of `extern "C"` kernels), compiled after
/// [`PRELUDE`] by NVRTC with MLX's architecture and include paths ([`nvrtc_ffi::compile`]).
/// Fails where MLX runs on no CUDA device, where NVRTC or the driver cannot be opened, or where
/// the source does not compile.
pub fn compile(module: &str, source: &str) -> Result<Rc<[u8]>> {
    if super::on_cpu() {
        return Err(Error::Internal(format!(
            "precompiled module `{module}`: MLX runs on no GPU"
        )));
    }
    let image = nvrtc_ffi::compile(module, &format!("{PRELUDE}\n{source}"))?;
    if image.is_empty() {
        return Err(Error::Internal(format!(
            "precompiled module `{module}`: NVRTC gave an empty image"
        )));
    }
    tracing::debug!(
        module,
        bytes = image.len(),
        "compiled a precompiled kernel module"
    );
    Ok(image.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx_ffi::mlx_version;

    #[test]
    fn a_build_without_mlx_cuda_compiles_nothing() {
        if !crate::model::check_values::linux_cpu_build() {
            return; // a GPU build: MLX may well compile it
        }
        let e = compile("memexec_test_module", "extern \"C\" __global__ void k() {}");
        assert!(e.is_err());
    }

    #[test]
    fn mlx_names_its_version() {
        let v = mlx_version().unwrap();
        assert!(
            v.split('.').take(2).all(|p| p.parse::<u32>().is_ok()),
            "{v}"
        );
    }

    #[test]
    fn a_form_passes_what_the_body_reads_as_scalars() {
        let k = Kernel::new(
            "memexec_test_form",
            &["x", "w"],
            &["out"],
            "out[0] = x[x_strides[1]] + w[w_shape[0] - 1] + T(x_ndim * N);",
            "// header\n",
            true,
        )
        .unwrap();
        let x = mlx_rs::ops::zeros_dtype(&[2, 3], Dtype::Bfloat16).unwrap();
        let w = mlx_rs::ops::zeros_dtype(&[4], Dtype::Float32).unwrap();
        let template = [
            ("T", TemplateArg::Dtype(Dtype::Bfloat16)),
            ("N", TemplateArg::Int(7)),
        ];
        let outputs = [(&[1][..], Dtype::Bfloat16)];
        let src = k
            .module_source("sym", &[&x, &w], &outputs, &template)
            .unwrap();
        let expected_signature = "extern \"C\" __global__ void sym(\n    \
             const __nv_bfloat16* x,\n    const float* w,\n    __nv_bfloat16* out,\n    \
             int x_strides_0_lo,\n    int x_strides_0_hi,\n    int x_strides_1_lo,\n    \
             int x_strides_1_hi,\n    int x_ndim,\n    int w_shape_0) {";
        assert!(src.contains(expected_signature), "{src}");
        assert!(src.contains("constexpr int N = 7;") && src.contains("using T = __nv_bfloat16;"));
        assert!(src.contains("const int w_shape[1] = {w_shape_0};"), "{src}");
        assert!(src.starts_with("// header\n"));
        assert_eq!(row_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(row_strides(&[]), Vec::<i64>::new());
        // Forms differ by constants, dtypes and ranks, not by sizes.
        let key =
            |x: &Array, n| Kernel::form_key(&[x, &w], &outputs, &[("N", TemplateArg::Int(n))]);
        let wider = mlx_rs::ops::zeros_dtype(&[5, 3], Dtype::Bfloat16).unwrap();
        let deeper = mlx_rs::ops::zeros_dtype(&[1, 5, 3], Dtype::Bfloat16).unwrap();
        assert_eq!(key(&x, 7), key(&wider, 7));
        assert_ne!(key(&x, 7), key(&x, 8));
        assert_ne!(key(&x, 7), key(&deeper, 7));
    }
}
