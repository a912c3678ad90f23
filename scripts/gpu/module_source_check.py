#!/usr/bin/env python3
"""Do the device scripts run the kernels memexec runs? Rebuilds, with precompiled.py and the
scripts' own kernel bodies and headers, the module source of a form memexec's load-time
self-checks call, and compares it with the one memexec wrote (MEMEXEC_KERNEL_DUMP_DIR), the
symbol aside (memexec names it with a Rust hash). Runs anywhere (no CUDA call is made):

    MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_KERNEL_DUMP_DIR=DIR cargo test --lib
    scripts/gpu/module_source_check.py DIR

Forms: the residual-norm kernel with the layer scalar and the next norm over e4b's hidden size
(residual_norm.py), the head-norm kernel over e4b's sliding heads, without and with the rotation
(head_norms.py). Exit 1 when a
form's dump is missing or differs.
"""
import re
import sys
from pathlib import Path

import mlx.core as mx

import head_norms
import residual_norm
from precompiled import PrecompiledKernel


def zeros(shape, dtype=mx.bfloat16):
    return mx.zeros(shape, dtype=dtype)


def residual_form():
    """residual_norm.rs `self_check`'s first case: bf16 [3, 1, 2560], scale and next norm."""
    k = PrecompiledKernel(name="memexec_residual_norm_next", input_names=["h", "y", "w", "s", "wn"],
                          output_names=["out", "xn"], source=residual_norm.BODY,
                          header=residual_norm.HEADER, ensure_row_contiguous=False)
    h, w = zeros((3, 1, 2560)), zeros((2560,))
    threads, chunks = residual_norm.mlx_launch(2560, mx.bfloat16)
    template = [("T", mx.bfloat16), ("D", 2560), ("BLOCK", threads), ("CHUNKS", chunks),
                ("EPS_BITS", residual_norm.eps_bits()), ("HAS_SCALE", 1), ("HAS_NEXT", 1)]
    return "memexec_residual_norm_next_", k.module_source(
        "SYMBOL", [h, h, w, zeros((1, 1, 2560)), w], [mx.bfloat16] * 2, template)


def head_form():
    """head_norms.rs `self_check`'s first case: bf16 heads of 256, one row, 8 + 2 + 2 heads,
    the norms-only form."""
    k = PrecompiledKernel(name="memexec_head_norms", input_names=["q", "k", "v", "qw", "kw"],
                          output_names=["qn", "kn", "vn"], source=head_norms.source(False, True),
                          header=head_norms.HEADER, ensure_row_contiguous=False)
    q, kv, w = zeros((1, 1, 2048)), zeros((1, 1, 512)), zeros((256,))
    return "memexec_head_norms_", k.module_source(
        "SYMBOL", [q, kv, kv, w, w], [mx.bfloat16] * 3,
        head_norms.template(mx.bfloat16, 256, 8, 2))


def head_rope_form():
    """head_norms.rs `rope_check(0)`'s first case: the same heads rotated at offset 4321 with
    base 10000 (the log2 of the base as MLX and memexec compute it)."""
    k = PrecompiledKernel(name="memexec_head_norms_rope",
                          input_names=["q", "k", "v", "qw", "kw", "offsets", "freqs"],
                          output_names=["qn", "kn", "vn"], source=head_norms.source(True, True),
                          header=head_norms.HEADER, ensure_row_contiguous=False)
    q, kv, w = zeros((1, 1, 2048)), zeros((1, 1, 512)), zeros((256,))
    rot = head_norms.Rotation(256, "default", [4321])
    return "memexec_head_norms_rope_", k.module_source(
        "SYMBOL", [q, kv, kv, w, w, rot.offsets, mx.array(0.0, dtype=mx.float32)],
        [mx.bfloat16] * 3, head_norms.template(mx.bfloat16, 256, 8, 2, rot.consts(0, 1)))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    dump = Path(sys.argv[1])
    ok = True
    for prefix, ours in (residual_form(), head_form(), head_rope_form()):
        dumped = sorted(dump.glob(f"{prefix}*.cu"))
        # The symbol is the only difference allowed: `extern "C" __global__ void <symbol>(`.
        same = [p.name for p in dumped
                if re.sub(r"(__global__ void )\w+\(", r"\1SYMBOL(", p.read_text()) == ours]
        print(f"{prefix}: {len(dumped)} dumped form(s), equal to the script's: "
              f"{same or 'none'}")
        ok = ok and bool(same)
    print("module_source_check:", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
