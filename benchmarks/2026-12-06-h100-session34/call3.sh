# session 34, call 3 (through scripts/gpu/remote.sh, after bundles 1-3 arrived): e4b parity,
# then an untimed EXTRACT w8 run that compiles the kernels of its shapes.
set -u
echo "uname: $(uname -srvm)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" \
  --lengths 23,100,400 --tokens 32
echo "e4b_parity rc=$?"
timeout 200 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 1 --max-tokens 3 \
  --no-mlx-lm 2>&1 | tail -4
echo "warm bench rc=$?"
