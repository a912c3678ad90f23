//! NVIDIA's runtime compiler (NVRTC) and the CUDA driver, called directly: memexec compiles its
//! precompiled kernel modules (`model::precompiled`) itself, with the NVRTC, architecture and
//! include paths MLX's JIT uses (mlx/backend/cuda/jit_module.cpp, 0.32.2).
//!
//! Why not through MLX: MLX 0.32.2 compiles a custom kernel in memory only. Its CUDA
//! `CustomKernel::eval_gpu` asks `get_jit_module` for no disk cache, so the image cannot be read
//! back from `MLX_PTX_CACHE_DIR` (seen on an H100 in session 42: every form fell back to the
//! JIT call; the disassembly of the wheel's `libmlx.so` passes `false` for `use_disk_cache`).
//!
//! Both libraries are opened by their sonames with `dlopen`. Where MLX runs on CUDA, its
//! `libmlx.so` already links `libnvrtc.so.<N>` and `libcuda.so.1`, so these name the very copies
//! MLX uses; elsewhere the calls fail with [`Error::Internal`] and the kernels stay on MLX's JIT.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{Error, Result};

type Program = *mut c_void;
type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR` (cuda.h).
const CC_MAJOR: c_int = 75;
const CC_MINOR: c_int = 76;

/// NVRTC's entry points memexec calls.
struct Nvrtc {
    create: CreateProgram,
    compile: CompileProgram,
    log_size: GetSize,
    log: GetBytes,
    cubin_size: GetSize,
    cubin: GetBytes,
    ptx_size: GetSize,
    ptx: GetBytes,
    destroy: DestroyProgram,
    /// NVRTC's (major, minor) version.
    version: (c_int, c_int),
}

/// The first of `names` that `dlopen` opens; the handle is never closed (the library stays
/// for the process, as MLX's own link to it does).
fn open(names: &[&CStr]) -> Result<*mut c_void> {
    for name in names {
        // SAFETY: `name` is a NUL-terminated C string; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Ok(handle);
        }
    }
    Err(Error::Internal(format!(
        "none of {names:?} could be opened (no CUDA runtime compiler / driver in this process)"
    )))
}

/// The address of `symbol` in `handle`.
fn symbol(handle: *mut c_void, symbol: &CStr) -> Result<*mut c_void> {
    // SAFETY: `handle` came from a successful dlopen and is never closed; `symbol` is a
    // NUL-terminated C string.
    let p = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if p.is_null() {
        return Err(Error::Internal(format!("{symbol:?} is missing")));
    }
    Ok(p)
}

/// Reinterprets a symbol's address as the function type `F`.
///
/// # Safety
/// `F` must be the C signature the library declares for that symbol.
unsafe fn function<F: Copy>(p: *mut c_void) -> F {
    // SAFETY: the caller vouches for the signature; a function pointer has the size of a
    // data pointer on every platform memexec builds for.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| load_nvrtc().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Internal(e.clone()))
}

fn load_nvrtc() -> Result<Nvrtc> {
    let h = open(&[
        c"libnvrtc.so.13",
        c"libnvrtc.so.12",
        c"libnvrtc.so",
        c"libnvrtc.dylib",
    ])?;
    // SAFETY: each type alias above is the signature nvrtc.h declares for that entry point.
    unsafe {
        let version: Version = function(symbol(h, c"nvrtcVersion")?);
        let (mut major, mut minor) = (0, 0);
        check((version)(&mut major, &mut minor), "nvrtcVersion")?;
        Ok(Nvrtc {
            create: function(symbol(h, c"nvrtcCreateProgram")?),
            compile: function(symbol(h, c"nvrtcCompileProgram")?),
            log_size: function(symbol(h, c"nvrtcGetProgramLogSize")?),
            log: function(symbol(h, c"nvrtcGetProgramLog")?),
            cubin_size: function(symbol(h, c"nvrtcGetCUBINSize")?),
            cubin: function(symbol(h, c"nvrtcGetCUBIN")?),
            ptx_size: function(symbol(h, c"nvrtcGetPTXSize")?),
            ptx: function(symbol(h, c"nvrtcGetPTX")?),
            destroy: function(symbol(h, c"nvrtcDestroyProgram")?),
            version: (major, minor),
        })
    }
}

fn check(status: c_int, what: &str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Internal(format!("{what} failed (status {status})")))
    }
}

/// The compute capability (major, minor) of CUDA device 0, the device MLX runs on (asked once
/// per process).
pub fn compute_capability() -> Result<(i32, i32)> {
    static CC: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    CC.get_or_init(|| load_compute_capability().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Internal)
}

fn load_compute_capability() -> Result<(i32, i32)> {
    let h = open(&[c"libcuda.so.1", c"libcuda.so"])?;
    // SAFETY: the aliases are cuda.h's signatures of cuInit, cuDeviceGet and
    // cuDeviceGetAttribute; each writes only through the pointers it is given, which point at
    // live locals. cuInit may be called again after MLX's own call.
    unsafe {
        let init: CuInit = function(symbol(h, c"cuInit")?);
        let get: CuDeviceGet = function(symbol(h, c"cuDeviceGet")?);
        let attr: CuDeviceGetAttribute = function(symbol(h, c"cuDeviceGetAttribute")?);
        check((init)(0), "cuInit")?;
        let mut dev = 0;
        check((get)(&mut dev, 0), "cuDeviceGet")?;
        let (mut major, mut minor) = (0, 0);
        check((attr)(&mut major, CC_MAJOR, dev), "cuDeviceGetAttribute")?;
        check((attr)(&mut minor, CC_MINOR, dev), "cuDeviceGetAttribute")?;
        Ok((major, minor))
    }
}

/// The include folders MLX's JIT passes to NVRTC: the CCCL headers shipped next to
/// `libmlx.so` (`<lib>/../include/cccl`, else `$MLX_CCCL_DIR`) and the CUDA toolkit's
/// (`$CUDA_HOME`, `$CUDA_PATH`, else `/usr/local/cuda`, with `/include`). Found once per
/// process, as MLX finds its own.
pub fn include_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(find_include_dirs)
}

fn find_include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let beside_mlx = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.ends_with("/libmlx.so"))
                .map(PathBuf::from)
        })
        .and_then(|lib| Some(lib.parent()?.parent()?.join("include").join("cccl")));
    let cccl = beside_mlx
        .filter(|d| d.exists())
        .or_else(|| std::env::var_os("MLX_CCCL_DIR").map(PathBuf::from))
        .filter(|d| d.exists());
    dirs.extend(cccl);
    let cuda = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .find_map(|v| std::env::var_os(v).map(PathBuf::from))
        .or_else(|| Some(PathBuf::from("/usr/local/cuda")).filter(|d| d.exists()));
    dirs.extend(cuda.map(|d| d.join("include")));
    dirs
}

/// Compiles `source` (named `name` in NVRTC's messages) for CUDA device 0 as MLX's JIT does
/// ([`compile_for`] with [`compute_capability`] and [`include_dirs`]). Returns the image, to
/// load with `cuModuleLoadData`.
pub fn compile(name: &str, source: &str) -> Result<Vec<u8>> {
    compile_for(name, source, compute_capability()?, include_dirs())
}

/// Compiles `source` for compute capability `(major, minor)`: SASS
/// (`--gpu-architecture=sm_XY`, a cubin) where NVRTC is 11.8 or newer, else PTX for
/// `compute_XY`, with `includes` as include folders and `-default-device`.
pub fn compile_for(
    name: &str,
    source: &str,
    (major, minor): (i32, i32),
    includes: &[PathBuf],
) -> Result<Vec<u8>> {
    let nv = nvrtc()?;
    let sass = nv.version >= (11, 8);
    let mut options = vec![format!(
        "--gpu-architecture={}_{major}{minor}",
        if sass { "sm" } else { "compute" }
    )];
    // MLX passes no such flag, but NVRTC 12.9 rejects the kernels' unannotated lambdas without
    // it (scripts/gpu/nvrtc_check.py); it changes where functions live, not their arithmetic.
    options.push("-default-device".to_owned());
    options.extend(
        includes
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );
    let c_options = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Internal(format!("an NVRTC option holds a NUL byte: {e}")))?;
    let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
    let c_source = CString::new(source)
        .map_err(|e| Error::Internal(format!("kernel source `{name}` holds a NUL byte: {e}")))?;
    let c_name = CString::new(format!("{name}.cu"))
        .map_err(|e| Error::Internal(format!("kernel name `{name}` holds a NUL byte: {e}")))?;
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: the pointers are to live NUL-terminated strings (`c_source`, `c_name`,
    // `c_options` outlive every call below); no headers are passed (count 0, null arrays, as
    // nvrtc.h allows); `prog` is created once, used only while alive and destroyed once, on
    // every path; the size queries write one `usize` and the byte queries write exactly the
    // size they reported into buffers of that size.
    unsafe {
        check(
            (nv.create)(
                &mut prog,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            "nvrtcCreateProgram",
        )?;
        let status = (nv.compile)(prog, option_ptrs.len() as c_int, option_ptrs.as_ptr());
        let result = if status != 0 {
            let mut size = 0usize;
            let mut log = String::new();
            if (nv.log_size)(prog, &mut size) == 0 && size > 0 {
                let mut buf = vec![0u8; size];
                if (nv.log)(prog, buf.as_mut_ptr().cast()) == 0 {
                    log = String::from_utf8_lossy(&buf)
                        .trim_end_matches('\0')
                        .to_owned();
                }
            }
            Err(Error::Internal(format!(
                "NVRTC could not compile `{name}` ({}): {log}",
                options.join(" ")
            )))
        } else {
            let (size_of, bytes_of) = if sass {
                (nv.cubin_size, nv.cubin)
            } else {
                (nv.ptx_size, nv.ptx)
            };
            let mut size = 0usize;
            check(size_of(prog, &mut size), "nvrtcGet(CUBIN|PTX)Size").and_then(|()| {
                let mut image = vec![0u8; size];
                check(
                    bytes_of(prog, image.as_mut_ptr().cast()),
                    "nvrtcGet(CUBIN|PTX)",
                )
                .map(|()| image)
            })
        };
        (nv.destroy)(&mut prog);
        result
    }
}
