# session 32, call 3 (ran as benchmarks/2026-12-06-session32/call3.sh: the card was not yet known) (through remote.sh, after the bundles arrived): memexec vs mlx-lm greedy
# ids on e4b, then graphs.sh's decode rounds (with and without MLX's CUDA graphs).
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
echo "uname: $(uname -srvm)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" --lengths 23,100,400 --tokens 32; echo "e4b_parity rc=$?"
PART=decode ROUNDS=2 bash benchmarks/2026-12-06-h100-session32/graphs.sh; echo "graphs rc=$?"
