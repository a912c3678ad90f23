"""Host + device time of MLX work, shared by the device scripts (row_kernels.py,
attention_kernel.py, quantized_rows.py): one warm-up, then the mean over `reps` evaluations,
synchronized at both ends so queued work is counted."""
import time

import mlx.core as mx


def timed(f, reps):
    """Microseconds per evaluation of `f()`."""
    mx.eval(f())
    mx.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        mx.eval(f())
    mx.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def chain_time(f, x, reps, calls=42):
    """Microseconds per call of `f` in a chain of `calls` dependent calls from `x` (each output
    feeds the next call, as one decode step's layers do)."""
    def step():
        y = x
        for _ in range(calls):
            y = f(y)
        return y
    return timed(step, reps) / calls
