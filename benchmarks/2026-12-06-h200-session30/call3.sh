# session 30, call 3 (warm): serial decode, memexec then mlx-lm, 3 interleaved rounds on the
# 400-id prompt; then EXTRACT at widths 1 and 8, memexec next to mlx-lm on the same ids.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
SERIAL_ROUNDS=3 timeout 260 bash scripts/gpu/steps.sh serial; echo "serial rc=$?"
timeout 300 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 1,8 --reps 1 --mlx-lm-reps 1 \
  --python "$PY" --json-out "$OUT/bench-extract.json"; echo "bench rc=$?"
