#!/usr/bin/env python3
"""memexec's custom kernels called as PRECOMPILED kernels from Python, made as
src/model/precompiled.rs makes them: for each form a kernel is called with (template constants,
input dtypes and ranks, output dtypes), the `extern "C"` kernel MLX's JIT would write around the
body, with the shapes / strides / ranks the body reads passed as int scalars (strides as low and
high halves) and rebuilt as the arrays the body indexes; compiled once with the NVRTC MLX links
(as memexec's src/nvrtc_ffi.rs does: after precompiled_prelude.cuh, device 0's sm_XY), then
called through `mx.fast.precompiled_cuda_kernel` with the image only until a call has been
evaluated. Imported by quantized_row.py and kernel_host_cost.py; MLX CUDA only.
"""
import ctypes
import hashlib
import os

import mlx.core as mx

CUDA_TYPES = {mx.bool_: "bool", mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t",
              mx.uint64: "uint64_t", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t",
              mx.int64: "int64_t", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
              mx.float32: "float"}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What memexec compiles every module after (src/nvrtc_ffi.rs, src/model/precompiled.rs).
with open(os.path.join(ROOT, "src", "model", "kernels", "precompiled_prelude.cuh")) as _f:
    PRELUDE = _f.read()


def _compute_capability():
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) == 0
    assert cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) == 0
    return major.value, minor.value


def include_dirs():
    """MLX's JIT's include folders, as src/nvrtc_ffi.rs finds them."""
    dirs = []
    cccl = os.path.join(os.path.dirname(mx.__file__), "include", "cccl")
    if not os.path.isdir(cccl):
        cccl = os.environ.get("MLX_CCCL_DIR", "")
    if cccl and os.path.isdir(cccl):
        dirs.append(cccl)
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or (
        "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None)
    if cuda:
        dirs.append(os.path.join(cuda, "include"))
    return dirs


def compile_module(module, source):
    """The cubin of `source`, a module of extern "C" kernels, compiled as memexec compiles it
    (src/nvrtc_ffi.rs): the NVRTC MLX links, after PRELUDE, for device 0's sm_XY."""
    mx.eval(mx.zeros((1,)))  # MLX loads its CUDA libraries (NVRTC among them)
    lib = ctypes.CDLL("libnvrtc.so.13")
    major, minor = _compute_capability()
    src = (PRELUDE + "\n" + source).encode()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, f"{module}.cu".encode(), 0, None,
                                  None) == 0
    opts = [f"--gpu-architecture=sm_{major}{minor}".encode(), b"-default-device",
            *(f"--include-path={d}".encode() for d in include_dirs())]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    if status != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        raise RuntimeError(f"NVRTC could not compile {module}: {log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    image = ctypes.create_string_buffer(size.value)
    assert lib.nvrtcGetCUBIN(prog, image) == 0
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return image.raw


class PrecompiledKernel:
    """`mx.fast.cuda_kernel`'s interface, called as memexec's `precompiled::Kernel` does."""

    def __init__(self, name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True):
        self.name, self.inputs, self.outputs = name, list(input_names), list(output_names)
        self.body, self.header, self.contiguous = source, header, ensure_row_contiguous
        self.reads = [(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
                      for n in input_names]
        self.forms = {}  # key -> [symbol, image, loaded, probe]

    def module_source(self, symbol, inputs, output_dtypes, template):
        params, scalars, prologue = [], [], ""
        for name, a, (shape, strides, ndim) in zip(self.inputs, inputs, self.reads):
            params.append(f"const {CUDA_TYPES[a.dtype]}* {name}")
            nd = a.ndim
            if nd == 0:
                continue
            if shape:
                dims = [f"{name}_shape_{i}" for i in range(nd)]
                scalars += [f"int {d}" for d in dims]
                prologue += f"const int {name}_shape[{nd}] = {{{', '.join(dims)}}};\n"
            if strides:
                parts = []
                for i in range(nd):
                    scalars += [f"int {name}_strides_{i}_lo", f"int {name}_strides_{i}_hi"]
                    parts.append(
                        f"static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>("
                        f"{name}_strides_{i}_hi)) << 32) | static_cast<uint32_t>({name}_strides_{i}_lo))")
                prologue += f"const int64_t {name}_strides[{nd}] = {{{', '.join(parts)}}};\n"
            if ndim:
                scalars.append(f"int {name}_ndim")
        params += [f"{CUDA_TYPES[d]}* {n}" for n, d in zip(self.outputs, output_dtypes)]
        params += scalars
        consts = ""
        for name, arg in template:
            if isinstance(arg, mx.Dtype):
                consts += f"  using {name} = {CUDA_TYPES[arg]};\n"
            else:
                consts += f"  constexpr int {name} = {int(arg)};\n"
        return (f"{self.header}\nnamespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n"
                f"extern \"C\" __global__ void {symbol}(\n    " + ",\n    ".join(params)
                + f") {{\n{consts}{prologue}\n{self.body}\n}}\n\n}} // namespace mlx::core::cu\n")

    def __call__(self, inputs, output_shapes, output_dtypes, grid, threadgroup, template=()):
        template = list(template)
        key = (tuple((n, str(v)) for n, v in template),
               tuple((str(a.dtype), a.ndim) for a in inputs), tuple(str(d) for d in output_dtypes))
        form = self.forms.get(key)
        if form is None:
            src_key = repr(key) + self.body + self.header
            symbol = f"{self.name}_{hashlib.sha1(src_key.encode()).hexdigest()[:16]}"
            source = self.module_source(symbol, inputs, output_dtypes, template)
            form = self.forms[key] = [symbol, compile_module(symbol, source), False, None]
        symbol, image, loaded, probe = form
        if not loaded and probe is not None:
            # Evaluated (the same test memexec makes with MLX's `is_available`): MLX holds the
            # module. Python has no such query; an evaluated array's eval returns at once.
            mx.eval(probe)
            form[2], form[3] = True, None
            loaded = True
        scalars = []
        for a, (shape, strides, ndim) in zip(inputs, self.reads):
            if a.ndim == 0:
                continue
            if shape:
                scalars += list(a.shape)
            if strides:
                for s in strides_of(a):
                    scalars += [int(s & 0xffffffff) - (1 << 32 if s & 0x80000000 else 0),
                                int(s >> 32)]
            if ndim:
                scalars.append(a.ndim)
        out = mx.fast.precompiled_cuda_kernel(
            name=symbol, compiled_source=b"" if loaded else image, inputs=inputs,
            output_shapes=output_shapes, output_dtypes=output_dtypes, scalars=scalars, grid=grid,
            threadgroup=threadgroup, ensure_row_contiguous=self.contiguous)
        if not loaded:
            form[3] = out[0]
        return out


def strides_of(a):
    """Row-contiguous strides (the kernels here get row-contiguous inputs, or copies of them)."""
    strides, acc = [], 1
    for d in reversed(a.shape):
        strides.append(acc)
        acc *= d
    return list(reversed(strides))
