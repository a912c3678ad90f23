# session 25, call 2 (runs through remote.sh): HEAD (b045fda) on the GPU after session 24's
# changes (dense CPU rule: not on this path; paused_steps counted in the speculative loop):
# plain vs adaptive speculation with right and all-wrong drafts, then memexec vs mlx-lm serial.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 250 $PY scripts/gpu/speculate.py $MEMEXEC $E4B --ks 4 --rounds 1 --no-lookup --wrong 1 --out $OUT/speculate.json > $OUT/speculate.log 2>&1; echo "speculate rc=$?"
cut -c1-400 $OUT/speculate.log
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
ROUNDS=2 GEN_TOKENS=128 BENCH_WIDTHS= timeout 120 bash scripts/gpu/variants.sh base=$MEMEXEC > $OUT/variants.log 2>&1; echo "variants rc=$?"
timeout 80 $PY scripts/gpu/mlxlm_decode_speed.py $E4B --prompt-ids $P400 --tokens 128 --reps 2 > $OUT/mlxlm.log 2>&1; echo "mlxlm rc=$?"; tail -1 $OUT/mlxlm.log | cut -c1-300
grep round $OUT/variants.log
