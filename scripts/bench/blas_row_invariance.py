"""Checks memexec's rule for dense f32 decode products (src/model/linear.rs: calls of exactly
DENSE_STEP_ROWS = 8 rows, zero-padded; the matrix's outputs padded with zero rows until an 8-row
call does 2^21 multiply-adds) on the BLAS MLX loads (OpenBLAS after scripts/setup.sh): every
row of a batch of 1-24 rows, at every position and whatever the other rows hold, must get the
bits it gets alone. Prints each differing case and the count.

usage: .deps/venv/bin/python scripts/bench/blas_row_invariance.py [ROWS_PER_CALL]
Other OpenBLAS kernels on the same machine, e.g.:
  for c in Zen Haswell Sandybridge Nehalem Core2 Penryn Prescott Atom Barcelona; do
    for t in 1 2 4 8 16; do OPENBLAS_CORETYPE=$c OPENBLAS_NUM_THREADS=$t \\
      .deps/venv/bin/python scripts/bench/blas_row_invariance.py; done; done
Zen 1, OpenBLAS 0.3.21 (2026-12-04): 0 differing cases at 8 rows per call with the default
kernels (Zen) at 1, 2, 4 and 8 threads; an equivalent check (12 shapes, every position of 8 rows)
found 0 for all nine core types above at 1-16 threads. At 16 rows per call, one thread: 170 of 629
differ (e.g. positions 7, 8 and 15 of 16 rows). The rule this replaced (one call for all rows,
padded to a multiple of 8 and 2^21 multiply-adds) failed the memexec batch tests on this CPU.
Taking the product the other way round in one call, (W @ X^T)^T (the batch on BLAS's other side,
no padding), is worse: 493 of 765 cases differ at one thread (2026-12-04, 1-48 rows).
"""
import sys

import mlx.core as mx

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
mx.set_default_device(mx.cpu)
mx.random.seed(2)


def padded_out(out_dim, in_dim):
    per_output = ROWS * in_dim
    return max(out_dim, -(-(1 << 21) // per_output))


def product(x, w):
    """memexec's decode product: calls of ROWS rows, zero-padded."""
    m = x.shape[0]
    calls = -(-m // ROWS)
    x = mx.concatenate([x, mx.zeros((calls * ROWS - m, x.shape[1]), x.dtype)], 0)
    ys = [x[c * ROWS:(c + 1) * ROWS] @ w.T for c in range(calls)]
    return mx.concatenate(ys, 0)[:m]


bad = 0
total = 0
shapes = [(128, 64), (64, 128), (256, 64), (64, 32), (64, 16), (16, 64), (1024, 256), (1024, 640),
          (2048, 640), (640, 2048), (4096, 640), (640, 1024), (640, 256), (262144, 640),
          (4096, 256), (10240, 2560), (2560, 10240)]
for out_dim, in_dim in shapes:
    w = mx.random.normal((out_dim, in_dim))
    w = mx.concatenate([w, mx.zeros((padded_out(out_dim, in_dim) - out_dim, in_dim))], 0)
    x0 = mx.random.normal((1, in_dim))
    alone = product(x0, w)
    mx.eval(w, alone)
    for m in (2, 3, 5, 7, 8, 9, 12, 16, 17, 24):
        for pos in sorted({0, 1, m // 2, m - 1}):
            others = mx.random.normal((m, in_dim))
            x = mx.concatenate([others[:pos], x0, others[pos + 1:]], 0)
            total += 1
            if not mx.array_equal(product(x, w)[pos:pos + 1], alone).item():
                bad += 1
                print("DIFF out", out_dim, "in", in_dim, "rows", m, "position", pos)
print("rows per call", ROWS, "differing", bad, "of", total)
