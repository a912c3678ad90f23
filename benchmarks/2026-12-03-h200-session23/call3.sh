# session 23, call 3 (warm): larger MLX command buffers for memexec and mlx-lm, interleaved, ids compared
set -u
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
ROUNDS=2 GEN_TOKENS=128 BENCH_WIDTHS= timeout 280 bash scripts/gpu/variants.sh base=$MEMEXEC "ops240=env MLX_MAX_OPS_PER_BUFFER=240 $MEMEXEC" "ops1000=env MLX_MAX_OPS_PER_BUFFER=1000 $MEMEXEC" > $OUT/variants2.log 2>&1; echo "variants rc=$?"
for v in default 1000; do
  if [ $v = default ]; then e=""; else e="MLX_MAX_OPS_PER_BUFFER=$v"; fi
  env $e timeout 80 $PY scripts/gpu/mlxlm_decode_speed.py $E4B --prompt-ids $P400 --tokens 128 --reps 2 > $OUT/mlxlm-$v.log 2>&1; echo "mlxlm $v rc=$?"; tail -1 $OUT/mlxlm-$v.log | cut -c1-300
done
grep round $OUT/variants2.log
