//! Modules of memexec's CUDA kernels that MLX runs as precompiled kernels
//! ([`PrecompiledKernel`]): compiled once per process through MLX's own JIT and read back as
//! the image MLX's JIT wrote.
//!
//! Why precompiled: MLX's `cuda_kernel` call assembles the kernel's whole source text into
//! every graph node and passes each input's shape as an argument; with ~6.5 KB of text, four
//! inputs, three shapes and four template constants that cost the host ~5 us per call more
//! than MLX's own product (session 39), in a decode step that is bound by the host. A
//! precompiled call carries only a symbol, arrays and `int` scalars.
//!
//! Why through MLX's JIT: it compiles with the NVRTC, headers (MLX's device headers, the
//! toolkit's and CCCL's) and architecture flags that MLX's own kernels are built with, and
//! needs nothing memexec would have to find or load itself. MLX compiles a kernel whose
//! header holds the module's source and writes the result (a cubin where NVRTC can target the
//! device, else PTX) to its kernel cache (`MLX_PTX_CACHE_DIR`, else `<temp dir>/mlx/<MLX
//! version>/ptx`), named after the kernel. The name carries a hash of the source, so a cache
//! that outlives a memexec build never hands back an older module.
use std::path::PathBuf;
use std::rc::Rc;

use mlx_rs::Array;

use crate::error::{Error, Result};
use crate::mlx_ffi::{mlx_version, CudaKernel};

/// The compiled image of `source` (a module of `extern "C"` kernels, placed after MLX's default
/// header), built by MLX's JIT under a name made of `module` and a hash of the source
/// ([`CudaKernel::new`]). Fails where MLX has no CUDA, where the source does not compile, or
/// where MLX's kernel cache does not hold the image afterwards (a cache directory MLX could not
/// create).
pub fn compile(module: &str, source: &str) -> Result<Rc<[u8]>> {
    // The kernel MLX compiles: a one-element copy whose only purpose is to carry `source` as
    // its header into NVRTC; evaluating it once makes MLX compile and cache the module.
    let carrier = CudaKernel::new(module, &["x"], &["out"], "out[0] = x[0];", source, false)?;
    let x = mlx_rs::ops::zeros::<f32>(&[1])?;
    let out = carrier.apply(&[&x], &[(&[1], x.dtype())], [1, 1, 1], [1, 1, 1], &[])?;
    out.iter().try_for_each(Array::eval)?;
    let path = cache_dir()?.join(format!("custom_kernel_{}.ptx", carrier.compiled_name()));
    let image = std::fs::read(&path).map_err(|e| {
        Error::Internal(format!(
            "precompiled module `{module}`: MLX compiled it but {} is not readable ({e})",
            path.display()
        ))
    })?;
    if image.is_empty() {
        return Err(Error::Internal(format!(
            "precompiled module `{module}`: {} is empty",
            path.display()
        )));
    }
    tracing::debug!(
        module,
        bytes = image.len(),
        path = %path.display(),
        "compiled a precompiled kernel module"
    );
    Ok(image.into())
}

/// Where MLX's JIT writes what it compiles (mlx/backend/cuda/jit_module.cpp, 0.32.2).
fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MLX_PTX_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    Ok(std::env::temp_dir()
        .join("mlx")
        .join(mlx_version()?)
        .join("ptx"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
