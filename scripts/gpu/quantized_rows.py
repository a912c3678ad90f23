#!/usr/bin/env python3
"""memexec's batched quantized product (src/model/kernels/quantized_rows.cu) against MLX's own
one-row product, on the machine it runs on (MLX CUDA only: the kernel is CUDA).

For the e4b's product shapes (4-bit, group 64, bf16 activations; n x k below), 1 to 16 rows of
random activations against weights quantized by MLX:
  - the share of output elements where the kernel's row r equals MLX's `quantized_matmul` of
    row r ALONE (MLX's `qmv`, memexec's serial path) bit for bit: must be 1.0 everywhere;
  - the same for MLX's product of all rows at once (`qmm` from 8 rows: not row-exact), for
    contrast;
  - host + device time per call in a chain of 42 calls: the kernel on 8 rows vs MLX's product
    in two chunks of 4 (split + 2 products + concatenate: what memexec did before) vs MLX's
    one-row product.

Also f16 / f32 activations, groups of 32 / 128, and an input whose rows start 3 elements into
their buffer (the kernel's element loads instead of vector loads).

And the device time per product of the e4b's larger shapes (8 rows and 1 row through the kernel,
1 row through MLX's product).

Usage: quantized_rows.py [--out FILE] [--reps N] [--timing-only] [--source CU --header CUH]
  (--source / --header time or check another version of the kernel, e.g. an older commit's
  `git show REV:src/model/kernels/quantized_rows.cu`)
"""
import argparse
import json
import os

import mlx.core as mx
import numpy as np

from device_timing import chain_time, timed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL = None


def make_kernel(source, header):
    """The kernel as src/model/quantized_rows.rs makes it (comments do not change the code)."""
    global KERNEL
    KERNEL = mx.fast.cuda_kernel(
        name="memexec_quantized_rows", input_names=["x", "w", "scales", "biases"],
        output_names=["out"], source=open(source).read(), header=open(header).read() + "\n",
        ensure_row_contiguous=True)


# (n, k) of the e4b's products: q / k / v / fused qkv of sliding and full layers, o, fused
# gate+up, down, the per-layer-input gate / projection, the per-layer model projection, and
# the tied output head.
SHAPES = [(2048, 2560), (512, 2560), (3072, 2560), (6144, 2560), (2560, 2048), (2560, 4096),
          (20480, 2560), (2560, 10240), (256, 2560), (2560, 256), (10752, 2560), (262144, 2560)]


def kernel_rows(x, w, scales, biases, group, bits):
    assert bits == 4
    rows, n = x.shape[0], w.shape[0]
    return KERNEL(
        inputs=[x, w, scales, biases],
        template=[("T", x.dtype), ("GROUP", group)],
        grid=(((n + 7) // 8) * 32, ((rows + 7) // 8) * 8, 1), threadgroup=(32, 8, 1),
        output_shapes=[(rows, n)], output_dtypes=[x.dtype])[0]


def mlx_product(x, w, scales, biases, group, bits):
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group, bits=bits)


def bits_of(a):
    """The elements' bits as unsigned integers (16 bits for bf16 / f16, 32 for f32)."""
    return np.array(a.view(mx.uint16) if a.dtype != mx.float32 else a.view(mx.uint32))


def finish(results, key, out):
    """Sets results["ok"] (every case's `key` share is 1.0), writes OUT if given, prints the
    verdict; the exit status."""
    bad = [c for c in results["cases"] if c[key] != 1.0]
    results["ok"] = not bad
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    print("ok" if not bad else f"FAILED: {len(bad)} cases not bit-equal", flush=True)
    return 0 if not bad else 1


def case(n, k, rows, seed, group=64, bits=4, dtype=mx.bfloat16, unaligned=False):
    kw, kx = mx.random.split(mx.random.key(seed))
    wf = (mx.random.normal((n, k), key=kw) * 0.02).astype(dtype)
    w, scales, biases = mx.quantize(wf, group_size=group, bits=bits)
    x = mx.random.normal((rows, k), key=kx).astype(dtype)
    if unaligned:  # a row-contiguous view 3 elements into its buffer: the element loads
        x = mx.concatenate([mx.zeros((3,), dtype), x.reshape(-1)])[3:].reshape(rows, k)
    # MLX's own kernel reads x with vector loads (an unaligned view faults there): it gets an
    # aligned copy of the same values.
    xa = x * 1 if unaligned else x
    mx.eval(w, scales, biases, x, xa)
    ours = kernel_rows(x, w, scales, biases, group, bits)
    alone = mx.concatenate([mlx_product(xa[r:r + 1], w, scales, biases, group, bits)
                            for r in range(rows)], axis=0)
    together = mlx_product(xa, w, scales, biases, group, bits)
    mx.eval(ours, alone, together)
    eq = bits_of(ours) == bits_of(alone)
    return {
        "unaligned": unaligned,
        "n": n, "k": k, "rows": rows, "bits": bits, "group": group, "dtype": str(dtype),
        "equal_to_mlx_one_row": float(eq.mean()),
        "unequal_elements": int((~eq).sum()),
        "mlx_all_rows_equal_to_one_row": float((bits_of(together) == bits_of(alone)).mean()),
        "max_abs_diff": float(np.abs(np.array(ours.astype(mx.float32))
                                     - np.array(alone.astype(mx.float32))).max()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="first N shapes only")
    ap.add_argument("--source", default=os.path.join(ROOT, "src/model/kernels/quantized_rows.cu"),
                    help="the kernel body (default: memexec's)")
    ap.add_argument("--header", default=os.path.join(ROOT, "src/model/kernels/quantized_rows_header.cuh"))
    ap.add_argument("--timing-only", action="store_true", help="skip the equality cases")
    a = ap.parse_args()
    make_kernel(a.source, a.header)
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "cases": [], "timing": []}
    seed = 0
    for n, k in ([] if a.timing_only else SHAPES[: a.shapes]):
        for rows in ((1, 3, 8, 16) if n * k > 5e8 else (1, 2, 7, 8, 9, 16)):
            seed += 1
            r = case(n, k, rows, seed)
            results["cases"].append(r)
            print(f"n={n:6} k={k:5} rows={rows:2}: equal to MLX one-row {r['equal_to_mlx_one_row']:.6f}"
                  f" ({r['unequal_elements']} differ, max |d| {r['max_abs_diff']:.3g});"
                  f" MLX all rows {r['mlx_all_rows_equal_to_one_row']:.4f}", flush=True)
    for dtype, group, unaligned in ((mx.float16, 64, False), (mx.float32, 64, False),
                                    (mx.bfloat16, 32, False), (mx.bfloat16, 128, False),
                                    (mx.bfloat16, 64, True)) if not a.timing_only else ():
        seed += 1
        r = case(2048, 2560 + 128, 8, seed, group=group, dtype=dtype, unaligned=unaligned)
        results["cases"].append(r)
        print(f"{dtype} group={group} unaligned={unaligned} rows=8: equal "
              f"{r['equal_to_mlx_one_row']:.6f} ({r['unequal_elements']} differ)", flush=True)
    # Timing: square-ish 2560 x 2560 product, 8 rows; outputs feed the next call.
    kw, kx = mx.random.split(mx.random.key(7))
    wf = (mx.random.normal((2560, 2560), key=kw) * 0.02).astype(mx.bfloat16)
    w, s, b = mx.quantize(wf, group_size=64, bits=4)
    x8 = mx.random.normal((8, 2560), key=kx).astype(mx.bfloat16)
    mx.eval(w, s, b, x8)
    kern1 = chain_time(lambda y: kernel_rows(y, w, s, b, 64, 4), x8[:1], a.reps)
    kern = chain_time(lambda y: kernel_rows(y, w, s, b, 64, 4), x8, a.reps)
    chunks = chain_time(lambda y: mx.concatenate(
        [mlx_product(p, w, s, b, 64, 4) for p in mx.split(y, [4], axis=0)], axis=0), x8, a.reps)
    one = chain_time(lambda y: mlx_product(y, w, s, b, 64, 4), x8[:1], a.reps)
    results["timing"] = {"kernel_8_rows_us": kern, "kernel_1_row_us": kern1, "mlx_two_chunks_8_rows_us": chunks,
                         "mlx_one_row_us": one}
    print(f"timing 2560x2560: kernel 8 rows {kern:.1f} us/call, MLX 2 chunks of 4 {chunks:.1f}, "
          f"MLX 1 row {one:.1f}, kernel 1 row {kern1:.1f}", flush=True)
    # Device time per product of the e4b's larger shapes: 42 independent calls per evaluation
    # (the host's encoding of 42 nodes hides behind the device's work at these sizes).
    results["e4b_shapes_us"] = []
    for n, k in [(3072, 2560), (20480, 2560), (2560, 10240), (10752, 2560), (262144, 2560)]:
        kw, kx = mx.random.split(mx.random.key(n + k))
        w, s, b = mx.quantize((mx.random.normal((n, k), key=kw) * 0.02).astype(mx.bfloat16),
                              group_size=64, bits=4)
        x = mx.random.normal((8, k), key=kx).astype(mx.bfloat16)
        mx.eval(w, s, b, x)
        calls = 42 if n * k < 1e8 else 4
        row = {"n": n, "k": k}
        for label, f, xr in (("kernel_8_rows", kernel_rows, x), ("kernel_1_row", kernel_rows, x[:1]),
                             ("mlx_1_row", mlx_product, x[:1])):
            row[label] = timed(lambda: [f(xr, w, s, b, 64, 4) for _ in range(calls)], a.reps) / calls
        results["e4b_shapes_us"].append(row)
        print(f"time {n}x{k}: kernel 8 rows {row['kernel_8_rows']:.1f} us, kernel 1 row "
              f"{row['kernel_1_row']:.1f}, MLX 1 row {row['mlx_1_row']:.1f}", flush=True)
    return finish(results, "equal_to_mlx_one_row", a.out)


if __name__ == "__main__":
    raise SystemExit(main())
