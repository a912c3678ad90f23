#!/usr/bin/env python3
"""memexec's custom kernels called as PRECOMPILED kernels from Python, made as
src/model/precompiled.rs makes them: for each form a kernel is called with (template constants,
input dtypes and ranks, output dtypes), the `extern "C"` kernel MLX's JIT would write around the
body, with the shapes / strides / ranks the body reads passed as int scalars (strides as low and
high halves) and rebuilt as the arrays the body indexes; compiled once through MLX's JIT (a
one-element kernel whose header holds the module), the image read back from MLX's kernel cache,
then called through `mx.fast.precompiled_cuda_kernel` with the image only until a call has been
evaluated. Imported by quantized_row.py and kernel_host_cost.py; MLX CUDA only.
"""
import hashlib
import os
import tempfile

import mlx.core as mx

CUDA_TYPES = {mx.bool_: "bool", mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t",
              mx.uint64: "uint64_t", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t",
              mx.int64: "int64_t", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
              mx.float32: "float"}


def cache_dir():
    return os.environ.get("MLX_PTX_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "mlx", mx.__version__, "ptx")


def compile_module(module, source):
    """The compiled image (cubin or PTX) of `source`, a module of extern "C" kernels."""
    name = f"{module}_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    carrier = mx.fast.cuda_kernel(name=name, input_names=["x"], output_names=["out"],
                                  source="out[0] = x[0];", header=source,
                                  ensure_row_contiguous=False)
    mx.eval(carrier(inputs=[mx.zeros((1,))], output_shapes=[(1,)], output_dtypes=[mx.float32],
                    grid=(1, 1, 1), threadgroup=(1, 1, 1))[0])
    with open(os.path.join(cache_dir(), f"custom_kernel_{name}.ptx"), "rb") as f:
        return f.read()


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
