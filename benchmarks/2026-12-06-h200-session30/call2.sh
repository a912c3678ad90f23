# session 30, call 2 (runs through remote.sh, after the bundles arrived): the host (runtime,
# CPU, CUDA call costs, MLX's encode cost per node) and memexec vs mlx-lm greedy ids on e4b.
# (Its lines up to eval_cost's are host_probe.sh's host part, copied; `host_probe.sh --host-only`,
# added after this ran, runs just that part.)
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
echo "uname: $(uname -srvm)"
grep -m1 "model name" /proc/cpuinfo; echo "nproc $(nproc)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
timeout 90 $PY scripts/gpu/runtime_probe.py --out $OUT/runtime_probe.json; echo "runtime_probe rc=$?"
timeout 150 $PY scripts/gpu/eval_cost.py --nodes 400 --reps 4 --out $OUT/eval_cost.json > $OUT/eval_cost.log 2>&1; echo "eval_cost rc=$?"
cut -c1-120 $OUT/eval_cost.log
timeout 220 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" --lengths 23,100,400 --tokens 32; echo "e4b_parity rc=$?"
