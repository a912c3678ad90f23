"""What the device checks of memexec's decode-step kernels (attention_kernel.py,
attention_probs.py) and eval_cost.py share: random attention inputs in the e4b's head layout in
bf16, drawn from a seeded numpy generator so a seed gives the same case on every run, and the
kernels' scale constant."""
import struct

import mlx.core as mx
import numpy as np

HEADS, KV_HEADS = 8, 2


def normal_bf16(rng, shape, scale=1.0):
    """Standard normal values of `shape` times `scale`, as bf16."""
    return mx.array(rng.standard_normal(shape).astype(np.float32) * scale).astype(mx.bfloat16)


def cache_case(seed, d, n, cap):
    """One query `[1, HEADS, 1, d]` and keys / values as memexec's caches hold them: the first
    `n` positions of `[1, KV_HEADS, cap, d]` buffers. Returns q, k, v and the buffers kb, vb,
    evaluated."""
    rng = np.random.default_rng(seed)
    q = normal_bf16(rng, (1, HEADS, 1, d))
    kb = normal_bf16(rng, (1, KV_HEADS, cap, d))
    vb = normal_bf16(rng, (1, KV_HEADS, cap, d))
    k, v = kb[:, :, :n, :], vb[:, :, :n, :]
    mx.eval(q, k, v)
    return q, k, v, kb, vb


def scale_bits(scale):
    """The f32 `scale`'s bits as an int: the kernels' `SCALE_BITS` template constant."""
    return struct.unpack("<i", struct.pack("<f", scale))[0]
