#!/usr/bin/env bash
# Runs ON the GPU machine (H200, MLX CUDA), in the repository root of the copy that travelled.
# Idempotent, so every device call can simply start with it:
#   1. stashes whatever bundle of scripts/gpu/prepare.sh travelled (.gpu/send1, .gpu/send2)
#      into $GPU_DIR (/tmp/memexec-gpu: /tmp survives between calls while the machine is warm),
#      after checking its sha256 manifest;
#   2. once every bundle is there: reassembles the mlx-cuda-13 wheel, pip-installs it with the
#      mlx and mlx-lm wheels into /tmp/site, unpacks the tokenizer, the tiny fixtures + oracles
#      (the optional send3, in whichever call it travels)
#      and the memexec binary; prints the machine and MLX's device;
#   3. sets the environment (../shared/GPU.md): PYTHONPATH=/tmp/site, LD_LIBRARY_PATH with
#      the CUDA libmlx first, MLX_PTX_CACHE_DIR (JIT'd kernels survive between calls);
#   4. builds the e4b-shaped random 4-bit checkpoint into $E4B once (make_e4b_random.py
#      --check; skip the build with MEMEXEC_GPU_E4B=0, only the check with
#      MEMEXEC_GPU_E4B_CHECK=0);
#   5. runs each argument as a bash command, in order, timing each, with these exported:
#        GPU_DIR MEMEXEC E4B TOK FIXTURES TINY TINY_BF16 OUT PY (python3) ROOT
#      and these shell functions:
#        oracle_gpu NAME [oracle.py args]   mlx-lm oracle on the GPU for fixture NAME
#                                           -> $OUT/oracle-gpu-NAME.json, compared with the
#                                           CPU oracle that travelled (greedy ids agreement)
#        mlxlm_bench TAG WORKLOADS [mlx_lm_bench.py args]   mlx-lm serial/batched on $E4B
#                                           -> $OUT/mlxlm-TAG.json (+ its table)
#        synthetic_workloads FILE           BENCH.md-shaped random-id workloads for $E4B
#   Everything printed also goes to $OUT/remote.log. Exit status: the first failing command's.
# $OUT returns at most 8 files (16 MiB each, <= 2 folders deep): name results accordingly.
#
# Examples (device tool, from the repository root):
#   run(carry=[".gpu/send1"], command="bash scripts/gpu/remote.sh")
#   run(carry=[".gpu/send2"], command="bash scripts/gpu/remote.sh 'oracle_gpu tiny-gemma4-q4-f32'
#       '$MEMEXEC --help'")
#   run(command="bash scripts/gpu/remote.sh 'synthetic_workloads /tmp/w.json'
#       'mlxlm_bench extract /tmp/w.json --only EXTRACT --reps 3'")
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
GPU_DIR=${MEMEXEC_GPU_DIR:-/tmp/memexec-gpu}
STASH=$GPU_DIR/stash
OUT=${OUT:-$GPU_DIR/out}
mkdir -p "$STASH" "$OUT"
exec > >(tee -a "$OUT/remote.log") 2>&1
log() { printf '[remote %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
T0=$SECONDS
# Local dry runs only: REMOTE_PY=.deps/venv/bin/python REMOTE_SKIP_PIP=1 (CPU MLX, no install).
PY=${REMOTE_PY:-python3}

# --- 1. stash travelled bundles
field() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }
for d in "$ROOT"/.gpu/send*/; do
  [ -d "$d" ] || continue
  m=$(ls "$d"MANIFEST-* 2>/dev/null | head -1)
  [ -n "$m" ] || { log "no manifest in $d: ignored"; continue; }
  id=$(field id "$m")
  if ! (cd "$d" && grep '^file ' "$(basename "$m")" | cut -c6- | sha256sum -c --quiet -); then
    log "ERROR: $d fails its sha256 manifest: not stashed (re-run prepare.sh and send it again)"
    continue
  fi
  if [ -f "$STASH/ID" ] && [ "$(cat "$STASH/ID")" != "$id" ]; then
    log "new prepare id $id (stash had $(cat "$STASH/ID")): clearing the stash"
    rm -rf "$STASH" "$GPU_DIR/installed"
    mkdir -p "$STASH"
  fi
  echo "$id" >"$STASH/ID"
  cp -f "$d"* "$STASH/"
  log "stashed $(basename "$m") ($(du -sh "$d" | cut -f1))"
done

# --- 2. install once every bundle is there
missing=()
if [ -f "$STASH/ID" ]; then
  first=$(ls "$STASH"/MANIFEST-* | head -1)
  nb=$(field bundles "$first")
  for i in $(seq 1 "$nb"); do [ -f "$STASH/MANIFEST-$i" ] || missing+=("send$i"); done
else
  missing=("send1" "send2")
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "waiting for: ${missing[*]} (carry .gpu/<bundle> in the next call; prepare id $(cat "$STASH/ID" 2>/dev/null || echo none))"
  if [ $# -gt 0 ]; then
    log "ERROR: commands given but the install is incomplete"
    exit 2
  fi
  exit 0
fi
ID=$(cat "$STASH/ID")
if [ "$(cat "$GPU_DIR/installed" 2>/dev/null)" != "$ID" ]; then
  log "installing (prepare id $ID)"
  whl=$(field cuda_wheel "$STASH/MANIFEST-1")
  mkdir -p "$GPU_DIR/whl"
  cat "$STASH"/cuda.part* >"$GPU_DIR/whl/$whl" || exit 1
  cp "$STASH"/*.whl "$GPU_DIR/whl/"
  if [ "${REMOTE_SKIP_PIP:-0}" != 1 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$GPU_DIR"/whl/*.whl || { log "ERROR: pip install failed"; exit 1; }
  fi
  rm -rf "$GPU_DIR/tokenizers" "$GPU_DIR/fixtures" "$GPU_DIR/bin"
  mkdir -p "$GPU_DIR/tokenizers" "$GPU_DIR/fixtures" "$GPU_DIR/bin"
  tar -C "$GPU_DIR/tokenizers" -xJf "$STASH/tokenizer-gemma4.tar.xz" || exit 1
  if [ -f "$STASH/memexec.xz" ]; then
    xz -dc "$STASH/memexec.xz" >"$GPU_DIR/bin/memexec" && chmod +x "$GPU_DIR/bin/memexec"
  fi
  echo "$ID" >"$GPU_DIR/installed"
  FRESH=1
else
  FRESH=0
fi
# Fixtures (the optional send3) may arrive in any call after the install.
for f in "$STASH"/fixture-*.tar.gz; do
  [ -f "$f" ] || continue
  stamp=$GPU_DIR/fixtures/.unpacked-$(basename "$f")
  [ -f "$stamp" ] && continue
  tar -C "$GPU_DIR/fixtures" -xzf "$f" || exit 1
  touch "$stamp"
done

# --- 3. environment
SP=$("$PY" -c 'import site; print(site.getsitepackages()[0])')/nvidia
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$SP/cu13/lib:$SP/cudnn/lib:$SP/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MLX_PTX_CACHE_DIR=$GPU_DIR/ptx-cache
export PYTHONUNBUFFERED=1
mkdir -p "$MLX_PTX_CACHE_DIR"
export GPU_DIR ROOT OUT PY
export MEMEXEC=$GPU_DIR/bin/memexec
export E4B=$GPU_DIR/e4b
export TOK=$GPU_DIR/tokenizers/gemma4
export FIXTURES=$GPU_DIR/fixtures
export TINY=$FIXTURES/tiny-gemma4-q4-f32
export TINY_BF16=$FIXTURES/tiny-gemma4-q4
if [ "$FRESH" = 1 ]; then
  # The runtime (gVisor reports kernel 4.4.0; Firecracker a 6.x one) and CPU: the host's
  # speed shapes every host-bound figure (scripts/gpu/host_probe.sh).
  echo "host: $(uname -srm), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, "mlx-lm", mlx_lm.__version__, mx.default_device())' \
    || { log "ERROR: mlx does not import with the CUDA build"; exit 1; }
  if [ -x "$MEMEXEC" ]; then
    nf=$(ldd "$MEMEXEC" | grep -c 'not found')
    ldd "$MEMEXEC" | grep -E 'libmlx|not found'
    [ "$nf" = 0 ] || log "WARNING: $nf libraries of memexec not found"
  else
    log "no memexec binary travelled (prepare.sh --no-binary)"
  fi
fi

# --- 4. the e4b-shaped checkpoint
if [ "${MEMEXEC_GPU_E4B:-1}" != 0 ]; then
  H=$(sha256sum scripts/gpu/make_e4b_random.py | cut -c1-16)
  if [ "$(cat "$E4B/.stamp" 2>/dev/null)" != "$H" ]; then
    log "building the e4b-shaped random checkpoint into $E4B"
    # The --check (greedy decodes of 3 prompts: is the model degenerate?) costs ~30 s of
    # device time per cold start; MEMEXEC_GPU_E4B_CHECK=0 skips it once it has passed.
    check=(--check)
    [ "${MEMEXEC_GPU_E4B_CHECK:-1}" = 0 ] && check=()
    "$PY" scripts/gpu/make_e4b_random.py "$E4B" --tokenizer "$TOK" "${check[@]}" \
      || { log "ERROR: make_e4b_random.py failed"; exit 1; }
    echo "$H" >"$E4B/.stamp"
    cp "$E4B/generator.json" "$OUT/e4b-generator.json"
  fi
fi

# --- 5. commands
oracle_gpu() { # NAME [oracle.py args...]
  local name=$1
  shift
  [ -d "$FIXTURES/$name" ] || { log "ERROR: fixture $name is not here: carry .gpu/send3 (prepare.sh)"; return 1; }
  "$PY" scripts/fixtures/oracle.py "$FIXTURES" "$OUT/oracle-gpu-$name.json" --model "$name" "$@" &&
    "$PY" scripts/gpu/compare_oracle.py "$FIXTURES/oracle/$name.json" "$OUT/oracle-gpu-$name.json"
}
mlxlm_bench() { # TAG WORKLOADS [args...]
  local tag=$1 wl=$2
  shift 2
  "$PY" scripts/bench/mlx_lm_bench.py --model "$E4B" --workloads "$wl" --out "$OUT/mlxlm-$tag.json" \
    --device "${MLX_BENCH_DEVICE:-gpu}" "$@"
}
synthetic_workloads() { "$PY" scripts/bench/mlx_lm_bench.py --model "$E4B" --synthetic "$1"; }
export -f oracle_gpu mlxlm_bench synthetic_workloads

rc=0
i=0
for cmd in "$@"; do
  i=$((i + 1))
  log "=== [$i/$#] $cmd"
  t=$SECONDS
  bash -c "$cmd"
  r=$?
  log "=== [$i/$#] rc=$r in $((SECONDS - t)) s"
  [ "$r" = 0 ] || [ "$rc" != 0 ] || rc=$r
done
log "done in $((SECONDS - T0)) s, rc=$rc"
exit "$rc"
