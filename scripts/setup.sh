#!/usr/bin/env bash
# One-command, idempotent setup for a fresh Debian 12 machine (or re-run: fast, no changes).
# Installs: apt packages, MLX 0.32.2 (the PyPI mlx-cpu wheel, unpacked under .deps/),
# the Python oracle venv (mlx, mlx-cpu, mlx-lm), JS tooling, and generates test fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps
mkdir -p "$DEPS"
MLX_VERSION=0.32.2
log() { printf '[setup] %s\n' "$*" >&2; }

# 1. System packages (bindgen needs libclang; cmake builds mlx-c; valgrind for the C host test).
APT_PKGS=(cmake libclang-dev valgrind libopenblas0-pthread unzip)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. Prebuilt MLX for the Rust build (MLX_PREFIX=.deps/mlx-cpu/mlx, see .cargo/config.toml).
if [ ! -f "$DEPS/mlx-cpu/mlx/lib/libmlx.so" ]; then
  log "fetching mlx-cpu==$MLX_VERSION wheel"
  mkdir -p "$DEPS/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: "mlx-cpu==$MLX_VERSION" -d "$DEPS/wheels"
  rm -rf "$DEPS/mlx-cpu.tmp" && mkdir -p "$DEPS/mlx-cpu.tmp"
  python3 -m zipfile -e "$DEPS"/wheels/mlx_cpu-"$MLX_VERSION"-*.whl "$DEPS/mlx-cpu.tmp"
  rm -rf "$DEPS/mlx-cpu" && mv "$DEPS/mlx-cpu.tmp" "$DEPS/mlx-cpu"
fi

# 3. The Python oracle: mlx-lm on the same MLX version and backend.
VENV=$DEPS/venv
if ! "$VENV/bin/python" -c "import mlx_lm, mlx.core, jinja2, gguf" >/dev/null 2>&1; then
  log "creating the oracle venv (mlx-lm $MLX_VERSION)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION" "mlx-lm==$MLX_VERSION" \
    "jinja2==3.1.6" "gguf==0.17.1" "numpy<3"
fi

# 4. A real BLAS under MLX's CPU backend. The wheels bundle the reference (netlib) BLAS, which
# runs f32 matmuls ~3x slower than Debian's multi-threaded OpenBLAS and cannot amortize a weight
# read over batch rows. MLX loads it by its wheel-private file name, so that file becomes a link
# to OpenBLAS, for memexec (.deps/mlx-cpu) and for the mlx-lm oracle (the venv) alike: both must
# run the same kernels, or the oracle's attention matmuls would round differently.
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -f "$OPENBLAS" ]; then
  for libs in "$DEPS/mlx-cpu/mlx_cpu.libs" "$VENV"/lib/python3*/site-packages/mlx_cpu.libs; do
    for blas in "$libs"/libblas-*.so.*; do
      [ -e "$blas" ] || continue
      [ "$(readlink "$blas")" = "$OPENBLAS" ] && continue
      log "linking $(basename "$blas") -> OpenBLAS"
      ln -sf "$OPENBLAS" "$blas"
    done
  done
else
  log "warning: $OPENBLAS missing; MLX keeps the reference BLAS (slow dense matmuls)"
fi
export MEMEXEC_BLAS=$(readlink -f "$DEPS"/mlx-cpu/mlx_cpu.libs/libblas-*.so.* 2>/dev/null | head -1)

# 5. Later stages (JS tooling, fixtures) hook in here. MEMEXEC_SETUP_EXCEPT / MEMEXEC_SETUP_ONLY
# (a stage's file name, e.g. 35-oracle.sh) leave one out or run only it: scripts/test.sh runs the
# slow mlx-lm oracle while cargo builds.
for step in scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  name=$(basename "$step")
  [ "$name" = "${MEMEXEC_SETUP_EXCEPT:-}" ] && { log "leaving out $step (run separately)"; continue; }
  [ -n "${MEMEXEC_SETUP_ONLY:-}" ] && [ "$name" != "$MEMEXEC_SETUP_ONLY" ] && continue
  log "running $step"
  ROOT=$ROOT DEPS=$DEPS VENV=$VENV MEMEXEC_BLAS=$MEMEXEC_BLAS bash "$step"
done
log "ok"
