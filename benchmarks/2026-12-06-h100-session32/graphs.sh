# session 32: MLX CUDA with and without CUDA graphs (MLX_USE_CUDA_GRAPHS=0: every kernel
# launched on the stream instead of added to a graph that is updated and launched per ~100
# nodes). Interleaved rounds, memexec and mlx-lm on the same 400-id prompt, then EXTRACT at
# width 8 under each setting. Runs THERE through scripts/gpu/remote.sh (E4B, OUT, PY, MEMEXEC).
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
summary='import json,sys,hashlib;d=json.load(sys.stdin);print(round(d["decode_tokens_per_s"],1), "tok/s", {k:round(v,2) for k,v in d["decode_profile_ms_per_step"].items()}, "ids", hashlib.sha1(str(d["ids"]).encode()).hexdigest()[:10])'
# PART: decode (the interleaved rounds), bench (EXTRACT w8), or both (default).
part=${PART:-both}
if [ "$part" != bench ]; then
for g in 1 0; do
  MLX_USE_CUDA_GRAPHS=$g $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 16 --ignore-eos --json >/dev/null
done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for g in 1 0; do
    echo "round $r graphs=$g memexec $(MLX_USE_CUDA_GRAPHS=$g timeout 100 $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 128 --ignore-eos --json | $PY -c "$summary")"
    echo "round $r graphs=$g mlx-lm $(MLX_USE_CUDA_GRAPHS=$g timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 1)"
  done
done
fi
[ "$part" = decode ] && exit 0
for g in 1 0; do
  MLX_USE_CUDA_GRAPHS=$g timeout 150 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 1 \
    --no-mlx-lm --json-out "$OUT/bench-extract-graphs$g.json" 2>&1 | grep -E "^EXTRACT " | sed "s/^/graphs=$g /"
done
