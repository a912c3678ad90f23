# session 39, call 4 (a fresh machine, after the three bundle stashes): where the host cost of
# a custom-kernel call goes, and the one-row kernel's uses against MLX's `qmv` in serial decode.
#   1. kernel_host_cost.py: build + eval host time per call of MLX's qmv / RMSNorm against
#      custom kernels (memexec's as called, constants baked in, a trivial copy kernel);
#   2. serial decode, 400-id prompt, 128 tokens, 2 interleaved rounds of MEMEXEC_ROW_KERNEL
#      off (the default) / large / all, and mlx-lm; the ids' hash must agree across arms;
#   3. the device's view of a serial step with the kernel on every product (cupti_trace.py);
#   4. EXTRACT at width 8, the default binary (issue #8's target (2)).
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
stamp() { echo "--- $(date -u +%T) $*"; }
stamp host-cost
timeout 150 $PY scripts/gpu/kernel_host_cost.py --out "$OUT/host-cost.json"
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
GEN="$MEMEXEC generate --model $E4B --prompt-ids $P400 --max-tokens 128 --ignore-eos --json"
show() {
  $PY -c "import json,sys,hashlib;d=json.load(sys.stdin);print('$1', round(d['decode_tokens_per_s'],1), 'tok/s, prefill', round(d['prefill_tokens_per_s']), {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()}, 'ids', hashlib.sha1(str(d['ids']).encode()).hexdigest()[:10])"
}
stamp warm-ups
for use in off large all; do MEMEXEC_ROW_KERNEL=$use $GEN > /dev/null; done
for i in 1 2; do
  for use in off large all; do
    stamp "round $i $use"
    MEMEXEC_ROW_KERNEL=$use $GEN | show "round $i memexec $use"
  done
  stamp "round $i mlx-lm"
  echo "round $i mlx-lm $(timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 1)"
done
stamp trace
MEMEXEC_ROW_KERNEL=all timeout 200 $PY scripts/gpu/cupti_trace.py /tmp/ct-all -- \
  $MEMEXEC generate --model $E4B --prompt-ids $P400 --max-tokens 64 --ignore-eos --json 2>&1 |
  grep -v transformers | head -60
cp /tmp/ct-all/summary.json "$OUT/ct-serial-all.json" 2>/dev/null
stamp extract
timeout 150 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 3 \
  --no-mlx-lm --json-out "$OUT/extract-w8.json" 2>&1 | tail -5
stamp done
