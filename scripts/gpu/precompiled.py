#!/usr/bin/env python3
"""memexec's precompiled kernel modules from Python (src/model/precompiled.rs and the module
of src/model/quantized_row.rs): the same sources, compiled the same way (MLX's JIT compiles a
one-element kernel whose header holds the module's source; the image is read back from MLX's
kernel cache), run through `mx.fast.precompiled_cuda_kernel`. Imported by quantized_row.py and
kernel_host_cost.py; MLX CUDA only.
"""
import hashlib
import os
import tempfile

import mlx.core as mx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WARPS = 8
# (cols, unroll) per tile: quantized_row.rs's TILES.
TILES = [(1, 4), (4, 2)]
TYPE_NAMES = {mx.bfloat16: ("__nv_bfloat16", "bf16"), mx.float16: ("__half", "f16"),
              mx.float32: ("float", "f32")}


def kernel_text(path):
    """A kernel file (path from the repository root) without its comment lines, as memexec
    passes it to MLX (`row_kernel::without_comment_lines`)."""
    return "\n".join(l for l in open(os.path.join(ROOT, path)).read().splitlines()
                     if not l.lstrip().startswith("//"))


def compile_module(module, source):
    """The compiled image (cubin or PTX) of `source`, a module of extern "C" kernels."""
    name = f"{module}_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    carrier = mx.fast.cuda_kernel(name=name, input_names=["x"], output_names=["out"],
                                  source="out[0] = x[0];", header=source,
                                  ensure_row_contiguous=False)
    mx.eval(carrier(inputs=[mx.zeros((1,))], output_shapes=[(1,)], output_dtypes=[mx.float32],
                    grid=(1, 1, 1), threadgroup=(1, 1, 1))[0])
    cache = os.environ.get("MLX_PTX_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "mlx", mx.__version__, "ptx")
    with open(os.path.join(cache, f"custom_kernel_{name}.ptx"), "rb") as f:
        return f.read()


class Kernel:
    """One precompiled kernel: the image travels with its calls until one has been evaluated
    (MLX then holds the module for the process), as memexec's `PrecompiledKernel`."""

    def __init__(self, symbol, image):
        self.symbol, self.image, self.loaded = symbol, image, False

    def __call__(self, inputs, output_shapes, output_dtypes, scalars, grid, threadgroup):
        return mx.fast.precompiled_cuda_kernel(
            name=self.symbol, compiled_source=b"" if self.loaded else self.image, inputs=inputs,
            output_shapes=output_shapes, output_dtypes=output_dtypes, scalars=scalars, grid=grid,
            threadgroup=threadgroup, ensure_row_contiguous=True)

    def load(self, *args, **kwargs):
        mx.eval(self(*args, **kwargs))
        self.loaded = True


_ROW_MODULES = {}


def row_kernels(dtype, group, tiles=TILES):
    """{(cols, unroll): Kernel} of memexec's one-row product for `dtype` and `group` (memexec
    builds TILES; other tiles here are for timing), each run once so later calls carry no
    image."""
    key = (dtype, group, tuple(tiles))
    if key in _ROW_MODULES:
        return _ROW_MODULES[key]
    cuda_type, short = TYPE_NAMES[dtype]
    source = (kernel_text("src/model/kernels/quantized_rows_header.cuh") + "\n"
              + kernel_text("src/model/kernels/quantized_row.cu") + "\n")
    for cols, unroll in tiles:
        source += f"MEMEXEC_QUANTIZED_ROW({short}, {cuda_type}, {group}, {cols}, {unroll})\n"
    image = compile_module(f"py_quantized_row_{short}_g{group}", source)
    kernels = {}
    k = group * 8
    w, s, b = mx.quantize(mx.zeros((8, k), dtype), group_size=group, bits=4)
    for cols, unroll in tiles:
        kern = Kernel(f"memexec_quantized_row_{short}_g{group}_c{cols}_u{unroll}", image)
        kern.load(*row_call_args(mx.zeros((1, 1, k), dtype), w, s, b, cols))
        kernels[(cols, unroll)] = kern
    _ROW_MODULES[key] = kernels
    return kernels


def row_call_args(x, w, scales, biases, cols):
    """The arguments of a one-row product call, as quantized_row.rs's `launch` makes them."""
    n = w.shape[0]
    blocks = (n + WARPS * cols - 1) // (WARPS * cols)
    return ([x, w, scales, biases], [tuple(x.shape[:-1]) + (n,)], [x.dtype],
            [n, scales.shape[1]], (blocks * 32, WARPS, 1), (32, WARPS, 1))


def row_product(x, w, scales, biases, group, tile, tiles=TILES):
    """memexec's one-row product of x by the 4-bit (w, scales, biases) with `tile`."""
    kern = row_kernels(x.dtype, group, tiles)[tile]
    return kern(*row_call_args(x, w, scales, biases, tile[0]))[0]
