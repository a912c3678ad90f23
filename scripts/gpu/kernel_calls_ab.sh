#!/usr/bin/env bash
# Runs ON the GPU machine, through remote.sh: memexec's CUDA kernels called PRECOMPILED
# (MEMEXEC_KERNEL_CALLS=precompiled, src/model/precompiled.rs) against MLX's JIT calls (the
# default), on the e4b's serial decode (400-id prompt, 128 tokens):
#   1. kernel_host_cost.py: host time per call of MLX's ops, memexec's row kernel and a trivial
#      kernel through MLX's JIT and precompiled (--no-host-cost skips it);
#   2. a first run of each arm (the kernels compile; memexec's info log shows any kernel that
#      is unavailable or could not be precompiled), then the arms interleaved, ROUNDS times:
#        jit           MEMEXEC_KERNEL_CALLS=jit          MEMEXEC_ROW_KERNEL=off (the default)
#        pre           MEMEXEC_KERNEL_CALLS=precompiled  MEMEXEC_ROW_KERNEL=off
#        pre-all       MEMEXEC_KERNEL_CALLS=precompiled  MEMEXEC_ROW_KERNEL=all
#        pre-norm      pre + MEMEXEC_NORM_KERNEL=1 (residual updates as one kernel node each)
#        pre-norms     pre-norm + MEMEXEC_HEAD_NORM_KERNEL=1 (a layer's q/k/v head norms and
#                      RoPE as one kernel node too)
#        pre-all-norm  pre-all + MEMEXEC_NORM_KERNEL=1
#        jit-norm      jit + MEMEXEC_NORM_KERNEL=1 (session 10's form, for contrast)
#      ($ARMS picks them, default "jit pre pre-all pre-norm pre-norms"), each run printing
#      tok/s, the build / queue / wait profile per step, the kernels in use and the ids' hash,
#      which must be the same in every arm (the same tokens).
# Usage (device tool): bash scripts/gpu/remote.sh 'bash scripts/gpu/kernel_calls_ab.sh [ROUNDS]
#   [--no-host-cost]'. Budget on a Firecracker host (session 39's figures): ~10 s host cost,
#   ~50 s per first run, ~20 s per run after.
set -u
ROUNDS=${1:-2}
ARMS=${ARMS:-jit pre pre-all pre-norm pre-norms}
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
stamp() { echo "--- $(date -u +%T) $*"; }
if [ "${2:-}" != "--no-host-cost" ]; then
  stamp host-cost
  timeout 100 "$PY" "$ROOT/scripts/gpu/kernel_host_cost.py" --out "$OUT/host-cost.json"
fi
P400=$("$PY" -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
GEN="$MEMEXEC generate --model $E4B --prompt-ids $P400 --max-tokens 128 --ignore-eos --json"
show() {
  "$PY" -c "import json,sys,hashlib;d=json.load(sys.stdin);print('$1', round(d['decode_tokens_per_s'],1), 'tok/s, prefill', round(d['prefill_tokens_per_s']), {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()}, 'row_kernel', d.get('row_kernel'), 'norm_kernel', d.get('norm_kernel'), 'head_norm_kernel', d.get('head_norm_kernel'), 'rope_variant', d.get('head_norm_rope_variant'), 'calls', d.get('kernel_calls'), 'ids', hashlib.sha1(str(d['ids']).encode()).hexdigest()[:10])"
}
arm() {
  case $1 in
    jit) echo "MEMEXEC_KERNEL_CALLS=jit MEMEXEC_ROW_KERNEL=off" ;;
    pre) echo "MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_ROW_KERNEL=off" ;;
    pre-all) echo "MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_ROW_KERNEL=all" ;;
    pre-norm) echo "MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_ROW_KERNEL=off MEMEXEC_NORM_KERNEL=1" ;;
    pre-norms) echo "MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_ROW_KERNEL=off MEMEXEC_NORM_KERNEL=1 MEMEXEC_HEAD_NORM_KERNEL=1" ;;
    pre-all-norm) echo "MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_ROW_KERNEL=all MEMEXEC_NORM_KERNEL=1" ;;
    jit-norm) echo "MEMEXEC_KERNEL_CALLS=jit MEMEXEC_ROW_KERNEL=off MEMEXEC_NORM_KERNEL=1" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}
for a in $ARMS; do
  stamp "first $a"
  env $(arm $a) RUST_LOG=memexec=info timeout 150 $GEN 2>"/tmp/kc-$a.log" | show "first $a"
  grep -i "warn\|unavailable\|precompiled\|residual\|head norms" "/tmp/kc-$a.log" | head -5
done
for i in $(seq 1 "$ROUNDS"); do
  for a in $ARMS; do
    stamp "round $i $a"
    env $(arm $a) timeout 90 $GEN | show "round $i $a"
  done
done
stamp done
