#!/usr/bin/env bash
# The GPU machine's scripts (scripts/gpu, scripts/bench), checked here so that no device time is
# spent on a typo: every shell script parses, every Python script compiles, and the device
# checks build the same kernel modules memexec builds (module_source_check.py, on the modules
# the library's self-checks write when called precompiled), and NVIDIA's NVRTC (12.9, fetched
# once from PyPI into .gpu/nvrtc) compiles each of those modules for sm_90 as memexec compiles
# them on a device (nvrtc_check.py, then memexec's own call: tests/nvrtc_compile.rs).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.deps/venv/bin/python
for s in scripts/gpu/*.sh; do
  bash -n "$s"
done
"$PY" -m py_compile scripts/gpu/*.py scripts/bench/*.py
DUMP=$(mktemp -d)
trap 'rm -rf "$DUMP"' EXIT
MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_KERNEL_DUMP_DIR="$DUMP" cargo test -q --lib \
  model:: >/dev/null
(cd scripts/gpu && "../../$PY" module_source_check.py "$DUMP")
"$PY" scripts/gpu/nvrtc_check.py "$DUMP"/*.cu
# memexec's own NVRTC call (src/nvrtc_ffi.rs) on the same modules, with the NVRTC just fetched.
NV="$PWD/.gpu/nvrtc/x/nvidia"
LD_LIBRARY_PATH="$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  MEMEXEC_NVRTC_MODULES="$DUMP" \
  MEMEXEC_NVRTC_INCLUDES="$NV/cuda_cccl/include:$NV/cuda_runtime/include" \
  cargo test -q --test nvrtc_compile -- --ignored
