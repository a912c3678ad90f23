# session 23, call 2 (runs through remote.sh): qmm repeatability, mlx-lm prefill repeats, memexec 240 A/B
set -u
timeout 110 $PY scripts/gpu/qmm_repeat.py --reps 200 --out $OUT/qmm-default.json > $OUT/qmm-default.log 2>&1; echo "qmm-default rc=$?"
timeout 90 $PY scripts/gpu/qmm_repeat.py --rows "" --model $E4B --model-reps 40 --out $OUT/model-default.json > $OUT/model-default.log 2>&1; echo "model-default rc=$?"
MLX_MAX_OPS_PER_BUFFER=240 timeout 90 $PY scripts/gpu/qmm_repeat.py --rows "" --model $E4B --model-reps 40 --out $OUT/model-240.json > $OUT/model-240.log 2>&1; echo "model-240 rc=$?"
ROUNDS=1 GEN_TOKENS=128 BENCH_WIDTHS= timeout 150 bash scripts/gpu/variants.sh base=$MEMEXEC "ops240=env MLX_MAX_OPS_PER_BUFFER=240 $MEMEXEC" > $OUT/variants1.log 2>&1; echo "variants rc=$?"
grep -h -E "differ|changed" $OUT/*.log | head -40
cat $OUT/variants1.log | grep round
