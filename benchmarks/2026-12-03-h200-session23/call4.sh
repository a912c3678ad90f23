# session 23, call 4: the adaptive draft schedule (391a1bf) vs the fixed one, right / all-wrong / every-third-wrong drafts
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 430 $PY scripts/gpu/speculate.py $MEMEXEC $E4B --ks 4 --rounds 1 --no-lookup --wrong 1,3 --arms fixed:--fixed-drafts --out $OUT/speculate-adaptive.json > $OUT/speculate-adaptive.log 2>&1; echo "speculate rc=$?"
cat $OUT/speculate-adaptive.log | cut -c1-400
