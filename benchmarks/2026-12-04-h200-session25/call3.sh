# session 25, call 3 (warm): call 2's all-wrong run read 0.59x plain (s23: 0.96x); again, two
# interleaved rounds, to tell the host's drift from a change in the code.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 400 $PY scripts/gpu/speculate.py $MEMEXEC $E4B --ks 4 --rounds 2 --no-lookup --wrong 1 --out $OUT/speculate-r2.json > $OUT/speculate-r2.log 2>&1; echo "speculate rc=$?"
cut -c1-400 $OUT/speculate-r2.log
