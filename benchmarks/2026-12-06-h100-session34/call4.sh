# session 34, call 4 (warm machine of call 3): EXTRACT at width 8 at HEAD (the batched
# decoder's first admission under the KV budget now starts one row, which measures the KV
# bytes per position, then the others), then one interleaved serial decode round.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 300 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 1 --no-mlx-lm \
  --json-out "$OUT/bench-extract.json" 2>&1 | tail -12
echo "bench rc=$?"
SERIAL_ROUNDS=1 bash scripts/gpu/steps.sh serial
echo "serial rc=$?"
