#!/usr/bin/env bash
# A/B of memexec builds or settings on the H200, interleaved so that the machine's drift hits
# every variant alike. Runs THERE, through scripts/gpu/remote.sh (needs E4B, OUT, PY).
#   usage: variants.sh NAME=COMMAND [NAME=COMMAND ...]
#   COMMAND runs memexec, e.g. "/tmp/memexec-base" or "env MEMEXEC_FUSE_PROJECTIONS=0 $MEMEXEC"
#   env: ROUNDS (default 2), GEN_TOKENS (128), BENCH_WIDTHS (8; empty = no bench)
# Per variant: one warm-up generate, then per round `generate` on the 400-id prompt (decode
# tok/s, host-time profile, a hash of the ids) and `bench --workloads EXTRACT` at
# BENCH_WIDTHS (ms, x serial, outputs identical to serial) -> $OUT/variants-NAME-r1.json
# (round 1 only: $OUT brings back few files).
set -uo pipefail
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
export MLX_CUDA_GRAPH_CACHE_SIZE=${MLX_CUDA_GRAPH_CACHE_SIZE:-4096}
rc=0
for v in "$@"; do
  name=${v%%=*}; cmd=${v#*=}
  $cmd generate --model "$E4B" --prompt-ids "$P400" --max-tokens 16 --ignore-eos --json >/dev/null || rc=1
done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in "$@"; do
    name=${v%%=*}; cmd=${v#*=}
    $cmd generate --model "$E4B" --prompt-ids "$P400" --max-tokens "${GEN_TOKENS:-128}" --ignore-eos --json |
      $PY -c "
import json,sys,hashlib
d=json.load(sys.stdin)
p={k:round(x,2) for k,x in d['decode_profile_ms_per_step'].items()}
print('round $r $name generate', round(d['decode_tokens_per_s'],1), 'tok/s', p, 'ids', hashlib.sha1(str(d['ids']).encode()).hexdigest()[:10])" || rc=1
    if [ -n "${BENCH_WIDTHS-8}" ]; then
      timeout 240 $cmd bench --model "$E4B" --workloads EXTRACT --widths "${BENCH_WIDTHS-8}" --reps 1 --no-mlx-lm \
        --json-out "$([ "$r" = 1 ] && echo "$OUT" || echo /tmp)/variants-$name-r$r.json" 2>&1 | grep -E "^EXTRACT " | sed "s/^/round $r $name /" || rc=1
    fi
  done
done
exit $rc
