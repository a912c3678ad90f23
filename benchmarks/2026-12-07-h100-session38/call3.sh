# session 38, call 3 (after the three bundle stashes): why MLX instantiates CUDA graphs while
# decoding (cupti_trace.py --graphs: every failed graph update with the node it names, and the
# node types of every instantiated graph), for memexec's serial decode with the graph cache the
# GPU scripts use (4096) and with MLX's default (100, what a library user gets), for mlx-lm's,
# and for the batched EXTRACT w8 step with the host's CUDA calls (--api); the least needed last.
set -u
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
GEN="$MEMEXEC generate --model $E4B --prompt-ids $P400 --max-tokens 64 --ignore-eos --json"
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
$GEN > /dev/null; echo "warm-up rc=$?"
$GEN | $PY -c "import json,sys;d=json.load(sys.stdin);print('untraced memexec', round(d['decode_tokens_per_s'],1), 'tok/s', {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()})"
trace() { # NAME CUPTI-OPTIONS -- COMMAND...
  local name=$1; shift
  echo "=== $name"
  timeout 200 $PY scripts/gpu/cupti_trace.py "/tmp/ct-$name" "$@" 2>&1 | grep -v transformers
  echo "$name rc=${PIPESTATUS[0]}"
  cp "/tmp/ct-$name/summary.json" "$OUT/ct-$name.json" 2>/dev/null
}
trace serial-cache4096 --graphs -- $GEN
trace w8 --graphs --api --steps 40 -- $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 \
  --reps 1 --no-mlx-lm
MLX_CUDA_GRAPH_CACHE_SIZE=100 trace serial-cache100 --graphs -- $GEN
trace mlxlm --graphs -- $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 64 --reps 1
