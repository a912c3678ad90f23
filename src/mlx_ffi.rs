//! Direct MLX-C calls for what mlx-rs's safe API lacks or builds with extra graph nodes.
//!
//! On a GPU a decode step is bound by MLX's host work per graph node (see README, "Decode is
//! host-bound"), so a node that computes nothing still costs time:
//! - [`slice_update`]: mlx-rs's `try_index_mut` strips the update's leading singleton
//!   dimensions and reshapes it back (two `Reshape` nodes before every `SliceUpdate`); a KV
//!   cache write needs only the `SliceUpdate`.
//! - [`scatter`]: one node that writes a row of every slot of a shared batch KV buffer
//!   ([`crate::model::batch_kv`]); mlx-rs reaches MLX's scatter only through indexing that adds
//!   broadcasts and reshapes.
//! - [`CudaKernel`]: MLX's custom CUDA kernels (`fast::cuda_kernel`), which mlx-rs does not
//!   wrap; memexec's one-node decode attention on MLX CUDA
//!   ([`crate::model::decode_attention`]) is one.
//! - [`PrecompiledKernel`]: MLX's precompiled CUDA kernels (`fast::precompiled_cuda_kernel`,
//!   through memexec's addition to the vendored MLX-C), which carry no source text per call
//!   ([`crate::model::precompiled`]).
//! - [`graph_census`]: MLX's `print_graph`, tallied by primitive, to count a step's nodes
//!   without timing anything (the device's timings drift up to 2x between runs).
//!
//! Besides the C API ([`crate::capi`]) this is the only module with `unsafe`: each block calls
//! one MLX-C function on handles owned by live `mlx_rs::Array`s and says why that is sound.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::rc::Rc;
use std::sync::Once;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, StreamOrDevice};

use crate::error::{Error, Result};

static ERROR_HANDLER: Once = Once::new();

/// mlx-rs installs its MLX-C error handler (which records errors instead of letting MLX-C's
/// default handler exit the process) on its first checked operation; make sure that has run
/// before calling MLX-C directly.
fn ensure_error_handler() {
    ERROR_HANDLER.call_once(|| {
        let _ = mlx_rs::ops::zeros::<f32>(&[1]);
    });
}

/// `src` with `src[start[0]..stop[0], start[1]..stop[1], ...] = update` (unit strides): one
/// `SliceUpdate` graph node. `update` must have exactly the slice's shape.
pub fn slice_update(src: &Array, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
    let shape = src.shape();
    let expected: Vec<i32> = start.iter().zip(stop).map(|(a, b)| b - a).collect();
    let in_bounds = start.len() == shape.len()
        && stop.len() == shape.len()
        && start
            .iter()
            .zip(stop)
            .zip(shape)
            .all(|((&a, &b), &n)| 0 <= a && a <= b && b <= n);
    if !in_bounds || update.shape() != expected.as_slice() {
        return Err(Error::InvalidArgument(format!(
            "slice_update: update {:?} does not fill {start:?}..{stop:?} of {shape:?}",
            update.shape()
        )));
    }
    ensure_error_handler();
    let strides = vec![1i32; shape.len()];
    let stream = StreamOrDevice::default();
    // SAFETY: `mlx_array_new` makes an empty handle that `mlx_slice_update` overwrites; `src`
    // and `update` are live arrays borrowed for the call; the three index slices outlive it and
    // their lengths (`src`'s rank, checked above) are passed with them; for a rank-0 `src` the
    // lengths are 0 and the (dangling, non-null) pointers are not read.
    let (status, res) = unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_slice_update(
            &mut res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ref().as_ptr(),
        );
        (status, res)
    };
    owned_result(status, res, || {
        format!("slice_update of {shape:?} at {start:?}..{stop:?} failed")
    })
}

/// The array an MLX-C call filled into `res` (made by `mlx_array_new`, owned by the caller)
/// when `status` is 0; else frees `res` and fails with `what`.
fn owned_result(
    status: std::os::raw::c_int,
    res: mlx_sys::mlx_array,
    what: impl FnOnce() -> String,
) -> Result<Array> {
    // SAFETY: `res` is a handle we own (new or filled in by the call), released exactly once:
    // by the returned `Array`'s `Drop`, or here on failure.
    unsafe {
        if status == 0 {
            Ok(Array::from_ptr(res))
        } else {
            mlx_sys::mlx_array_free(res);
            Err(Exception::custom(what()).into())
        }
    }
}

/// `src` with `src[indices[0][i], .., indices[1][i], ..] = updates[i]` along `axes`: one
/// `Scatter` graph node for what would be one `SliceUpdate` per index. `indices` are int
/// arrays of one shape `[N]` (in bounds: MLX does not check them); `updates` is `[N, ...]` followed by `src`'s shape with the
/// indexed axes of size 1 (MLX's `scatter`). mlx-rs only reaches it through `try_index_mut`,
/// which adds broadcasts and reshapes around it.
pub fn scatter(src: &Array, indices: &[&Array], updates: &Array, axes: &[i32]) -> Result<Array> {
    if indices.len() != axes.len() || indices.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "scatter: {} index arrays for {} axes",
            indices.len(),
            axes.len()
        )));
    }
    // MLX checks ranks but not the update's sizes: a wider update would write past the slice.
    let n = indices[0].shape().to_vec();
    let mut expected = n.clone();
    expected.extend(src.shape().iter().enumerate().map(|(axis, &size)| {
        if axes.contains(&(axis as i32)) {
            1
        } else {
            size
        }
    }));
    if n.len() != 1 || indices.iter().any(|i| i.shape() != n) || updates.shape() != expected {
        return Err(Error::InvalidArgument(format!(
            "scatter: updates {:?} for indices of shape {n:?} into {:?} along {axes:?}",
            updates.shape(),
            src.shape()
        )));
    }
    ensure_error_handler();
    let handles: Vec<mlx_sys::mlx_array> = indices.iter().map(|a| a.as_ptr()).collect();
    let stream = StreamOrDevice::default();
    // SAFETY: `handles` borrows the handles of live arrays (`indices`) for the call, its
    // pointer and length describe it; `mlx_vector_array_new_data` copies them (adding its own
    // references) into a vector freed below; `mlx_array_new` makes an empty handle that
    // `mlx_scatter` overwrites; `src`, `updates` and `axes` are live for the call.
    let (status, res) = unsafe {
        let vec = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_scatter(
            &mut res,
            src.as_ptr(),
            vec,
            updates.as_ptr(),
            axes.as_ptr(),
            axes.len(),
            stream.as_ref().as_ptr(),
        );
        mlx_sys::mlx_vector_array_free(vec);
        (status, res)
    };
    owned_result(status, res, || {
        format!(
            "scatter of {:?} into {:?} along {axes:?} failed",
            updates.shape(),
            src.shape()
        )
    })
}

/// A template constant of a [`CudaKernel`]: `constexpr int` / `using` (MLX-C also takes
/// `constexpr bool`; nothing here needs it).
#[derive(Debug, Clone, Copy)]
pub enum TemplateArg {
    /// `constexpr int NAME = value;`
    Int(i32),
    /// `using NAME = <the CUDA type of the dtype>;`
    Dtype(Dtype),
}

/// A custom CUDA kernel (MLX's `fast::cuda_kernel`): `source` is the kernel's body, MLX
/// writes its signature (inputs as `const T* name`, plus `name_shape` / `name_strides` where
/// the body uses them; outputs as `T* name`) and compiles it with NVRTC at its first
/// evaluation (cached per name and template constants). Only MLX CUDA builds can evaluate
/// it; elsewhere the evaluation fails. Inputs are passed as they are (views keep their
/// strides: the body must honour `name_strides`) unless the kernel was made with
/// `ensure_row_contiguous`, which copies inputs that are not row contiguous first.
pub struct CudaKernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
    name: String,
}

impl CudaKernel {
    /// A kernel named `name` with these input and output names and body; `header` goes after
    /// MLX's default header (includes, helpers).
    ///
    /// MLX compiles it under `name` followed by a hash of the body and header: MLX looks its
    /// compiled modules up by name alone (in the process; in some MLX versions also in a disk
    /// cache, `MLX_PTX_CACHE_DIR`, that outlives it), so a plain name could hand a kernel the
    /// module compiled from another source (a script's variant, an older build).
    pub fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
        ensure_row_contiguous: bool,
    ) -> Result<CudaKernel> {
        ensure_error_handler();
        let c = |s: &str| {
            CString::new(s)
                .map_err(|_| Error::InvalidArgument(format!("cuda kernel `{name}`: NUL in {s:?}")))
        };
        let versioned = versioned_name(name, &(source, header));
        let (c_name, c_source, c_header) = (c(&versioned)?, c(source)?, c(header)?);
        let c_inputs = inputs.iter().map(|s| c(s)).collect::<Result<Vec<_>>>()?;
        let c_outputs = outputs.iter().map(|s| c(s)).collect::<Result<Vec<_>>>()?;
        // SAFETY: every pointer handed to MLX-C is a NUL-terminated string alive for the
        // call (MLX-C copies them into `std::string`s); the two string vectors are new
        // handles, filled, used once and freed exactly once.
        let raw = unsafe {
            let in_names = mlx_sys::mlx_vector_string_new();
            for s in &c_inputs {
                mlx_sys::mlx_vector_string_append_value(in_names, s.as_ptr());
            }
            let out_names = mlx_sys::mlx_vector_string_new();
            for s in &c_outputs {
                mlx_sys::mlx_vector_string_append_value(out_names, s.as_ptr());
            }
            let raw = mlx_sys::mlx_fast_cuda_kernel_new(
                c_name.as_ptr(),
                in_names,
                out_names,
                c_source.as_ptr(),
                c_header.as_ptr(),
                ensure_row_contiguous,
                0,
            );
            mlx_sys::mlx_vector_string_free(in_names);
            mlx_sys::mlx_vector_string_free(out_names);
            raw
        };
        if raw.ctx.is_null() {
            return Err(
                Exception::custom(format!("MLX could not make cuda kernel `{name}`")).into(),
            );
        }
        Ok(CudaKernel {
            raw,
            name: name.to_string(),
        })
    }

    /// The kernel over `inputs` (in the order of the input names), making one output per
    /// `(shape, dtype)`; `grid` counts THREADS per axis (MLX divides by `threadgroup`).
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        grid: [i32; 3],
        threadgroup: [i32; 3],
        template: &[(&str, TemplateArg)],
    ) -> Result<Vec<Array>> {
        let names = template
            .iter()
            .map(|(n, _)| {
                CString::new(*n).map_err(|_| {
                    Error::InvalidArgument(format!("cuda kernel `{}`: NUL in {n:?}", self.name))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
        let stream = StreamOrDevice::default();
        // SAFETY: the config is a new handle freed exactly once below; shapes and template
        // names are live for the calls that read them (MLX-C copies them); the input vector is
        // made from handles of live arrays (MLX-C takes its own references) and freed once;
        // `outs` is a new vector that the apply call fills, read with `mlx_vector_array_get`
        // into new array handles that the returned `Array`s own (freed once by their `Drop`),
        // and freed once itself. `Dtype` is `repr(u32)` with MLX-C's `mlx_dtype` values.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            for (shape, dtype) in outputs {
                mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                );
            }
            mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid[0], grid[1], grid[2]);
            mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
                config,
                threadgroup[0],
                threadgroup[1],
                threadgroup[2],
            );
            for (name, (_, arg)) in names.iter().zip(template) {
                match *arg {
                    TemplateArg::Int(v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                            config,
                            name.as_ptr(),
                            v,
                        )
                    }
                    TemplateArg::Dtype(d) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                            config,
                            name.as_ptr(),
                            d as mlx_sys::mlx_dtype,
                        )
                    }
                };
            }
            let ins = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
            let mut outs = mlx_sys::mlx_vector_array_new();
            let status = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut outs,
                self.raw,
                ins,
                config,
                stream.as_ref().as_ptr(),
            );
            mlx_sys::mlx_vector_array_free(ins);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            let mut result = Vec::with_capacity(outputs.len());
            if status == 0 {
                for i in 0..mlx_sys::mlx_vector_array_size(outs) {
                    let mut a = mlx_sys::mlx_array_new();
                    if mlx_sys::mlx_vector_array_get(&mut a, outs, i) != 0 {
                        mlx_sys::mlx_array_free(a);
                        break;
                    }
                    result.push(Array::from_ptr(a));
                }
            }
            mlx_sys::mlx_vector_array_free(outs);
            if status != 0 || result.len() != outputs.len() {
                return Err(Exception::custom(format!(
                    "cuda kernel `{}` could not be applied",
                    self.name
                ))
                .into());
            }
            Ok(result)
        }
    }
}

/// `name` followed by a hash of `source`: the name a kernel is compiled under, so that MLX's
/// kernel cache, looked up by name alone, never returns a module of another source.
pub fn versioned_name(name: &str, source: &impl std::hash::Hash) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut hasher);
    format!("{name}_{:016x}", std::hash::Hasher::finish(&hasher))
}

/// Where a module keeps its kernel: a `thread_local!` slot, filled on first use on the thread
/// that runs the model (MLX objects stay on the thread that made them).
pub type KernelSlot<K> = std::thread::LocalKey<RefCell<Option<Rc<K>>>>;

/// The kernel in `slot`, made by `make` the first time this thread asks.
pub fn kernel_in<K>(
    slot: &'static KernelSlot<K>,
    make: impl FnOnce() -> Result<K>,
) -> Result<Rc<K>> {
    slot.with(|k| {
        if let Some(k) = k.borrow().as_ref() {
            return Ok(k.clone());
        }
        let made = Rc::new(make()?);
        *k.borrow_mut() = Some(made.clone());
        Ok(made)
    })
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: `raw` was made by `mlx_fast_cuda_kernel_new` (non-null, checked) and is
        // freed only here, once.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_free(self.raw) }
    }
}

/// A kernel MLX loads from a compiled module (MLX's `fast::precompiled_cuda_kernel`):
/// `symbol` is an `extern "C"` kernel of `image` (a cubin or PTX image), called with its
/// inputs, then its outputs, then `int` scalars. [`crate::model::precompiled`] makes them.
///
/// MLX loads the module on the first evaluation of a call under `symbol` and keeps it for
/// the process, so once an output of this kernel has been evaluated, calls pass an empty image
/// instead of making MLX copy the whole module (~150 KB) into every graph node. Until then each
/// call passes the image, and the kernel keeps the latest call's first output to ask.
pub struct PrecompiledKernel {
    symbol: CString,
    image: Rc<[u8]>,
    loaded: Cell<bool>,
    probe: RefCell<Option<Array>>,
}

impl PrecompiledKernel {
    /// The kernel `symbol` of `image`.
    pub fn new(symbol: &str, image: Rc<[u8]>) -> Result<PrecompiledKernel> {
        let symbol = CString::new(symbol).map_err(|_| {
            Error::InvalidArgument(format!("precompiled kernel: NUL in {symbol:?}"))
        })?;
        Ok(PrecompiledKernel {
            symbol,
            image,
            loaded: Cell::new(false),
            probe: RefCell::new(None),
        })
    }

    /// Whether MLX holds the module: an output of an earlier call has been evaluated.
    fn loaded(&self) -> bool {
        if !self.loaded.get() {
            let mut probe = self.probe.borrow_mut();
            if probe.as_ref().is_some_and(is_available) {
                self.loaded.set(true);
                *probe = None;
            }
        }
        self.loaded.get()
    }

    /// The kernel over `inputs`, making one output per `(shape, dtype)`, with `scalars` as
    /// its trailing `int` arguments; `grid` counts THREADS per axis (MLX divides by
    /// `threadgroup`). Inputs that are not row contiguous are copied first where
    /// `ensure_row_contiguous`.
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        scalars: &[i32],
        grid: [i32; 3],
        threadgroup: [i32; 3],
        ensure_row_contiguous: bool,
    ) -> Result<Vec<Array>> {
        ensure_error_handler();
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
        let shapes: Vec<*const i32> = outputs.iter().map(|(s, _)| s.as_ptr()).collect();
        let ndims: Vec<usize> = outputs.iter().map(|(s, _)| s.len()).collect();
        let dtypes: Vec<mlx_sys::mlx_dtype> = outputs
            .iter()
            .map(|(_, d)| *d as mlx_sys::mlx_dtype)
            .collect();
        let loaded = self.loaded();
        let image: &[u8] = if loaded { &[] } else { &self.image };
        let stream = StreamOrDevice::default();
        // SAFETY: every pointer is paired with its length and borrows data alive for the
        // call: the symbol (NUL-terminated), the image, the input handles of live arrays (MLX
        // takes its own references), the output shapes (each `ndims[i]` long), dtypes and
        // scalars; MLX-C copies what it keeps. `outs` are new handles that the call fills;
        // each is owned by exactly one returned `Array` (freed by its `Drop`) or freed here
        // on failure. `Dtype` is `repr(u32)` with MLX-C's `mlx_dtype` values.
        let result = unsafe {
            let mut outs: Vec<mlx_sys::mlx_array> = (0..outputs.len())
                .map(|_| mlx_sys::mlx_array_new())
                .collect();
            let status = mlx_sys::mlx_fast_precompiled_cuda_kernel(
                outs.as_mut_ptr(),
                outs.len(),
                self.symbol.as_ptr(),
                image.as_ptr().cast(),
                image.len(),
                handles.as_ptr(),
                handles.len(),
                shapes.as_ptr(),
                ndims.as_ptr(),
                dtypes.as_ptr(),
                scalars.as_ptr(),
                scalars.len(),
                grid[0],
                grid[1],
                grid[2],
                threadgroup[0],
                threadgroup[1],
                threadgroup[2],
                ensure_row_contiguous,
                stream.as_ref().as_ptr(),
            );
            if status != 0 {
                for a in outs {
                    mlx_sys::mlx_array_free(a);
                }
                return Err(Exception::custom(format!(
                    "precompiled kernel `{}` could not be applied",
                    self.symbol.to_string_lossy()
                ))
                .into());
            }
            outs.into_iter()
                .map(|a| Array::from_ptr(a))
                .collect::<Vec<_>>()
        };
        if !loaded {
            *self.probe.borrow_mut() = result.first().cloned();
        }
        Ok(result)
    }
}

/// Whether `a` has been evaluated (its data is there): MLX's `array::is_available`.
pub fn is_available(a: &Array) -> bool {
    let mut res = false;
    // SAFETY: `a` is a live array whose handle is borrowed for the call; `res` is a local the
    // call writes.
    let status = unsafe { mlx_sys::_mlx_array_is_available(&mut res, a.as_ptr()) };
    status == 0 && res
}

/// Whether `a` is row contiguous (MLX's `flags().row_contiguous`: what `cuda_kernel`'s
/// `ensure_row_contiguous` tests before copying an input).
pub fn is_row_contiguous(a: &Array) -> bool {
    let mut res = false;
    // SAFETY: `a` is a live array whose handle is borrowed for the call; `res` is a local the
    // call writes.
    let status = unsafe { mlx_sys::_mlx_array_is_row_contiguous(&mut res, a.as_ptr()) };
    status == 0 && res
}

/// MLX's version string (e.g. `0.32.2`): MLX keeps its JIT-compiled kernels under it.
pub fn mlx_version() -> Result<String> {
    // SAFETY: `s` is a new string handle that `mlx_version` fills; its data is read (copied
    // into a Rust `String`) while the handle lives, and the handle is freed exactly once.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let status = mlx_sys::mlx_version(&mut s);
        let data = mlx_sys::mlx_string_data(s);
        let version = (status == 0 && !data.is_null()).then(|| {
            std::ffi::CStr::from_ptr(data)
                .to_string_lossy()
                .into_owned()
        });
        mlx_sys::mlx_string_free(s);
        version.ok_or_else(|| Exception::custom("MLX did not give its version").into())
    }
}

/// The graph nodes (arrays with a primitive, not yet evaluated) behind some outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphCensus {
    /// All nodes.
    pub nodes: usize,
    /// Nodes by MLX primitive name (`QuantizedMatmul`, `SliceUpdate`, `Reshape`, ...).
    pub by_primitive: BTreeMap<String, usize>,
}

impl GraphCensus {
    /// Nodes of primitive `name`.
    pub fn count(&self, name: &str) -> usize {
        self.by_primitive.get(name).copied().unwrap_or(0)
    }
}

/// Counts the unevaluated graph behind `outputs` (nothing is evaluated).
pub fn graph_census(outputs: &[&Array]) -> Result<GraphCensus> {
    Ok(GraphCensus::from_text(&print_graph(outputs)?))
}

impl GraphCensus {
    /// Tallies the text of [`print_graph`]: one line per node between the `Inputs:` and
    /// `Outputs:` lines, the primitive's name first.
    pub fn from_text(text: &str) -> GraphCensus {
        let mut census = GraphCensus::default();
        for line in text.lines() {
            if line.starts_with("Inputs:") || line.starts_with("Outputs:") || line.is_empty() {
                continue;
            }
            let name = line
                .split(|c: char| c.is_whitespace() || c == '(' || c == '{')
                .next()
                .unwrap_or_default();
            census.nodes += 1;
            *census.by_primitive.entry(name.to_string()).or_default() += 1;
        }
        census
    }
}

/// MLX's `print_graph` of `outputs` (nothing is evaluated): an `Inputs:` line, one line per
/// node in execution order (`Primitive inputs -> outputs`), an `Outputs:` line. Written
/// through a temporary file: MLX-C writes to a `FILE*`.
pub fn print_graph(outputs: &[&Array]) -> Result<String> {
    ensure_error_handler();
    let file = tempfile_path();
    let path = CString::new(file.to_string_lossy().as_bytes())
        .map_err(|_| Error::InvalidArgument("temporary path has a NUL byte".into()))?;
    let handles: Vec<mlx_sys::mlx_array> = outputs.iter().map(|a| a.as_ptr()).collect();
    // SAFETY: `fopen` gets a NUL-terminated path and mode; the stream is checked for NULL and
    // closed exactly once below. The vector handle is made from `handles` (copies of live
    // arrays' handles: MLX-C's vector takes its own references) and freed once after use; the
    // namer is a fresh one, freed once. `libc::FILE` and MLX-C's `FILE` are the same C type.
    let status = unsafe {
        let fp = libc::fopen(path.as_ptr(), c"w".as_ptr());
        if fp.is_null() {
            return Err(Error::InvalidArgument(format!(
                "cannot open {} for the graph",
                file.display()
            )));
        }
        let vec = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_print_graph(fp.cast(), namer, vec);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vec);
        libc::fclose(fp);
        status
    };
    let text = std::fs::read_to_string(&file);
    let _ = std::fs::remove_file(&file);
    if status != 0 {
        return Err(Exception::custom("MLX print_graph failed").into());
    }
    text.map_err(|source| Error::Io { path: file, source })
}

fn tempfile_path() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("memexec-graph-{}-{n}.txt", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_update_is_one_node_and_writes_the_slice() {
        let src = mlx_rs::ops::zeros::<f32>(&[1, 2, 4, 3]).unwrap();
        src.eval().unwrap();
        let upd = Array::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[1, 2, 1, 3]);
        upd.eval().unwrap();
        let out = slice_update(&src, &upd, &[0, 0, 2, 0], &[1, 2, 3, 3]).unwrap();
        let census = graph_census(&[&out]).unwrap();
        assert_eq!(census.nodes, 1, "{census:?}");
        assert_eq!(census.count("SliceUpdate"), 1, "{census:?}");
        let v = out.as_slice::<f32>().to_vec();
        let mut want = vec![0f32; 24];
        want[6..9].copy_from_slice(&[1., 2., 3.]);
        want[18..21].copy_from_slice(&[4., 5., 6.]);
        assert_eq!(v, want);
    }

    #[test]
    fn slice_update_rejects_a_mismatched_update() {
        let src = mlx_rs::ops::zeros::<f32>(&[1, 2, 4, 3]).unwrap();
        let upd = mlx_rs::ops::zeros::<f32>(&[1, 2, 2, 3]).unwrap();
        assert!(slice_update(&src, &upd, &[0, 0, 2, 0], &[1, 2, 3, 3]).is_err());
        assert!(slice_update(&src, &upd, &[0, 0, 3, 0], &[1, 2, 5, 3]).is_err());
    }

    #[test]
    fn scatter_writes_one_position_of_each_slot_in_one_node() {
        // [slots 3, heads 2, positions 4, dim 2]; rows write slot 2 at 1 and slot 0 at 3.
        let src = mlx_rs::ops::zeros::<f32>(&[3, 2, 4, 2]).unwrap();
        src.eval().unwrap();
        let upd = Array::from_slice(&[1f32, 2., 3., 4., 5., 6., 7., 8.], &[2, 1, 2, 1, 2]);
        let slots = Array::from_slice(&[2i32, 0], &[2]);
        let pos = Array::from_slice(&[1i32, 3], &[2]);
        let out = scatter(&src, &[&slots, &pos], &upd, &[0, 2]).unwrap();
        let census = graph_census(&[&out]).unwrap();
        assert_eq!(census.count("Scatter"), 1, "{census:?}");
        let mut want = vec![0f32; 3 * 2 * 4 * 2];
        let at = |s: usize, h: usize, p: usize, d: usize| ((s * 2 + h) * 4 + p) * 2 + d;
        for (row, (s, p)) in [(2, 1), (0, 3)].into_iter().enumerate() {
            for h in 0..2 {
                for d in 0..2 {
                    want[at(s, h, p, d)] = (row * 4 + h * 2 + d + 1) as f32;
                }
            }
        }
        assert_eq!(out.as_slice::<f32>(), want.as_slice());
        assert!(scatter(&src, &[&slots], &upd, &[0, 2]).is_err());
        let wrong = mlx_rs::ops::zeros::<f32>(&[2, 1, 2, 2, 2]).unwrap();
        assert!(scatter(&src, &[&slots, &pos], &wrong, &[0, 2]).is_err());
    }

    #[test]
    fn census_counts_each_pending_node() {
        let a = Array::from_slice(&[1f32, 2.], &[2]);
        a.eval().unwrap();
        let b = a
            .multiply(&a)
            .unwrap()
            .add(&a)
            .unwrap()
            .reshape(&[1, 2])
            .unwrap();
        let census = graph_census(&[&b]).unwrap();
        assert_eq!(census.nodes, 3, "{census:?}");
        assert_eq!(census.count("Multiply"), 1, "{census:?}");
        assert_eq!(census.count("Add"), 1, "{census:?}");
        assert_eq!(census.count("Reshape"), 1, "{census:?}");
        b.eval().unwrap();
        assert_eq!(graph_census(&[&b]).unwrap().nodes, 0);
    }
}
