# session 39, call 3 (after the bundle stashes): memexec's one-row quantized product kernel
# (src/model/kernels/quantized_row.cu) against MLX's `qmv`:
#   1. bit-equality per tile variant and shape, and device time per kernel and shape
#      (quantized_row.py under cupti_trace.py: its "no decode steps" table);
#   2. serial decode, 400-id prompt, 128 tokens: memexec with the kernel, without it
#      (MEMEXEC_ROW_KERNEL=0: MLX's qmv, the binary of session 38), and mlx-lm, 3 interleaved
#      rounds; the ids' hash must agree between the two memexec arms;
#   3. memexec vs mlx-lm greedy ids on the e4b (e4b_parity.py);
#   4. EXTRACT at width 8 (issue #8's target (2)): the serial side now runs the kernel too.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
timeout 240 $PY scripts/gpu/cupti_trace.py /tmp/ct-qrow -- $PY scripts/gpu/quantized_row.py \
  --out "$OUT/qrow.json" 2>&1 | grep -v transformers
cp /tmp/ct-qrow/summary.json "$OUT/ct-qrow.json" 2>/dev/null
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
GEN="$MEMEXEC generate --model $E4B --prompt-ids $P400 --max-tokens 128 --ignore-eos --json"
show() {
  $PY -c "import json,sys,hashlib;d=json.load(sys.stdin);print('$1', round(d['decode_tokens_per_s'],1), 'tok/s, prefill', round(d['prefill_tokens_per_s']), {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()}, 'ids', hashlib.sha1(str(d['ids']).encode()).hexdigest()[:10])"
}
$GEN > /dev/null; MEMEXEC_ROW_KERNEL=0 $GEN > /dev/null; echo "warm-ups done"
for i in 1 2 3; do
  $GEN | show "round $i memexec row-kernel"
  MEMEXEC_ROW_KERNEL=0 $GEN | show "round $i memexec qmv"
  echo "round $i mlx-lm $(timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 1)"
done
timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" \
  --lengths 23,100,400 --tokens 32
timeout 150 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 3 \
  --no-mlx-lm --json-out "$OUT/extract-w8.json" 2>&1 | tail -5
