#!/usr/bin/env python3
"""Host cost of the CUDA calls a decode step makes, on the machine it runs on, without MLX.

Why: an e4b decode step is host-bound (benchmarks/README.md), and session 12's trace put a
third of its host time in 12 `cudaGraphLaunch` calls of ~96 kernels (~158 us each, tracer
included). The device machines come on two runtimes (gVisor or Firecracker:
../.library/device/KINDS.md), which may price these calls differently; this measures them
where it runs, so a decode figure can be read against its host:
  - a syscall (`getppid`) and a thread wake-up round trip (futex),
  - launching one tiny kernel (CuPy; includes CuPy's Python overhead),
  - capturing, instantiating and launching a graph of 96 tiny kernels (MLX commits graphs of
    about that many nodes), host time per launch and per launch until synchronized,
  - a GPU write of a managed-memory int32 followed by a host read of it (the token's path:
    MLX CUDA keeps small arrays in managed memory).
Prints one line per figure and, with --out, the figures as JSON.

usage: runtime_probe.py [--out FILE]
"""
import argparse
import ctypes
import json
import os
import platform
import threading
import time

import cupy as cp
import numpy as np


def per_call_us(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    r = {"kernel_release": platform.release()}
    r["getppid_us"] = per_call_us(os.getppid, 200000)

    ping, pong, m = threading.Event(), threading.Event(), 5000

    def other():
        for _ in range(m):
            ping.wait()
            ping.clear()
            pong.set()

    th = threading.Thread(target=other)
    th.start()
    t = time.perf_counter()
    for _ in range(m):
        ping.set()
        pong.wait()
        pong.clear()
    th.join()
    r["thread_round_trip_us"] = (time.perf_counter() - t) / m * 1e6

    inc = cp.ElementwiseKernel("float32 a", "float32 b", "b = a + 1", "memexec_probe_inc")
    x = cp.zeros(256, dtype=cp.float32)
    y = cp.empty_like(x)
    inc(x, y)
    cp.cuda.Device().synchronize()
    r["kernel_launch_us"] = per_call_us(lambda: inc(x, y), 5000)
    cp.cuda.Device().synchronize()

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        t = time.perf_counter()
        s.begin_capture()
        for _ in range(96):
            inc(x, y)
        g = s.end_capture()
        r["graph96_capture_us"] = (time.perf_counter() - t) * 1e6
        t = time.perf_counter()
        # Graph.upload is missing from older CuPy; the first launch then pays the upload.
        if hasattr(g, "upload"):
            g.upload(s)
        s.synchronize()
        r["graph96_instantiate_upload_us"] = (time.perf_counter() - t) * 1e6
        for _ in range(20):
            g.launch(s)
        s.synchronize()
        n = 1000
        t = time.perf_counter()
        for _ in range(n):
            g.launch(s)
        host = time.perf_counter() - t
        s.synchronize()
        r["graph96_launch_host_us"] = host / n * 1e6
        r["graph96_launch_total_us"] = (time.perf_counter() - t) / n * 1e6

        mem = cp.cuda.malloc_managed(4096)
        tok = cp.ndarray((1,), dtype=cp.int32, memptr=mem)
        view = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(mem.ptr))
        w = cp.ElementwiseKernel("int32 a", "int32 b", "b = a + 1", "memexec_probe_tok")
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            w(tok, tok)
            s.synchronize()
            int(view[0])
        r["managed_write_read_us"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for _ in range(n):
            w(tok, tok)
            s.synchronize()
        r["device_write_sync_us"] = (time.perf_counter() - t) / n * 1e6
    for k, v in r.items():
        print(f"{k:32} {v:.2f}" if isinstance(v, float) else f"{k:32} {v}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
