#!/usr/bin/env python3
"""Compile memexec's CUDA kernel modules HERE (no GPU) with NVIDIA's NVRTC for sm_90: a compile
check before device time is spent on a kernel that does not build.

memexec writes each precompiled form's module (`src/model/precompiled.rs`) to
$MEMEXEC_KERNEL_DUMP_DIR; on a CPU build the self-checks still write them before falling back,
so the library's tests dump every form they call:

    MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_KERNEL_DUMP_DIR=/tmp/dump cargo test --lib
    scripts/gpu/nvrtc_check.py /tmp/dump/*.cu

Each module is compiled as memexec compiles it on a device (src/nvrtc_ffi.rs): after
src/model/kernels/precompiled_prelude.cuh (what the kernels take from MLX's default header),
with the architecture, include folders and -default-device as options; a pass here is necessary, not
sufficient (NVRTC 13 on the device, bits and speed need the device). NVRTC, the CUDA runtime
headers and CCCL (12.9, from PyPI: ~96 MB) are fetched once into --nv (default .gpu/nvrtc).
A control: `--expect-fail` inverts the exit status (feed it a module with a planted error).

Usage: nvrtc_check.py [--nv DIR] [--arch sm_90] [--expect-fail] MODULE.cu ...
Exit 1 when any module fails to compile.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ["nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79",
          "nvidia-cuda-cccl-cu12==12.9.27"]
# What memexec compiles each module after (src/nvrtc_ffi.rs): the part of MLX's default header
# its kernels use.
PRELUDE = (ROOT / "src" / "model" / "kernels" / "precompiled_prelude.cuh").read_text()


def fetch(nv: Path) -> Path:
    """The extracted `nvidia/` folder of the three wheels, downloaded the first time."""
    root = nv / "x" / "nvidia"
    if (root / "cuda_nvrtc" / "lib" / "libnvrtc.so.12").exists():
        return root
    nv.mkdir(parents=True, exist_ok=True)
    print(f"[nvrtc_check] fetching {', '.join(WHEELS)} into {nv}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12",
                    "--platform", "manylinux2014_x86_64", "-d", str(nv), *WHEELS], check=True)
    for w in nv.glob("nvidia_cuda_*.whl"):
        zipfile.ZipFile(w).extractall(nv / "x")
    return root


def compile_one(lib, root: Path, path: Path, arch: str) -> tuple[bool, str]:
    src = (PRELUDE + "\n" + path.read_text()).encode()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, path.name.encode(), 0, None, None):
        return False, "nvrtcCreateProgram failed"
    # memexec's options (src/nvrtc_ffi.rs): MLX's JIT's (architecture, include folders) and
    # -default-device, without which NVRTC 12.9 rejects the kernels' unannotated lambdas.
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device",
            *(f"--include-path={root / p / 'include'}".encode()
              for p in ("cuda_cccl", "cuda_runtime"))]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status == 0, log.value.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="+", type=Path)
    ap.add_argument("--nv", type=Path, default=ROOT / ".gpu" / "nvrtc")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--expect-fail", action="store_true")
    a = ap.parse_args()
    root = fetch(a.nv)
    lib = ctypes.CDLL(str(root / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"))
    failed = 0
    for m in a.modules:
        ok, log = compile_one(lib, root, m, a.arch)
        print(f"{m.name}: {'ok' if ok else 'FAILED'}")
        if not ok or "warning" in log:
            print(log[:4000])
        failed += not ok
    print(f"[nvrtc_check] {len(a.modules) - failed} of {len(a.modules)} modules compiled "
          f"({a.arch})")
    sys.exit(int((failed == 0) == a.expect_fail))


if __name__ == "__main__":
    main()
