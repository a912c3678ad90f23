# session 31, call 3 (warm): a second round of call 2's decoder runs, then EXTRACT at widths
# 1 and 8 with and without speculation for rows running alone (lookup drafts: the random e4b
# drafts little, so this shows what the modes cost, and that every output equals serial).
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 300 $PY scripts/gpu/speculate.py "$MEMEXEC" "$E4B" --ks 4 --rounds 1 --no-lookup --wrong 3 \
  --arms decoder:--decoder --plain-arms --out "$OUT/speculate-decoder-r2.json"; echo "speculate rc=$?"
timeout 260 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 1,8 --speculate 4 --reps 1 \
  --no-mlx-lm --json-out "$OUT/bench-extract-speculate.json"; echo "bench rc=$?"
