#!/usr/bin/env bash
# Runs ON the GPU machine, through remote.sh, after kernel_calls_ab.sh (same warm machine): the
# bits of a candidate configuration's kernels, then end-to-end parity and EXTRACT with it, most
# telling first (a call cut off at its limit keeps what finished):
#   1. head_norms.py --quick, precompiled calls: the norms, which of the four ways of writing the
#      rotation gives MLX's RoPE bits (memexec takes the first), the `nofma` control that must
#      differ (~70 forms compile: ~1-2 minutes);
#   2. residual_norm.py --quick, precompiled calls (the `plain` variant: a control);
#   3. e4b_parity.py: memexec with $CAND (default: precompiled calls + the residual-norm and
#      head-norm kernels, MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_NORM_KERNEL=1
#      MEMEXEC_HEAD_NORM_KERNEL=1) vs mlx-lm greedy ids;
#   4. one mlx-lm serial decode (the 400-id prompt, 128 tokens): the ratio's denominator on this
#      host;
#   5. EXTRACT at width 8, 2 reps, the default configuration and then $CAND (issue #8's
#      target (2) must still hold: batched faster than serial, the same tokens);
#   6. quantized_row.py, precompiled calls, tiles 4x2 and 1x4 (the row kernel's two uses).
# Each step writes its whole output to a file under $OUT (kept if the call is cut off: a pipe
# through `tail` would lose it, session 20), then shows its end.
# Usage (device tool): bash scripts/gpu/remote.sh 'bash scripts/gpu/candidate_checks.sh'
#   (CAND='...' before `bash` to check another configuration). Budget (session 39's H100
#   figures, guessed for the new scripts): ~120 + 40 + 110 + 30 + 2 x 60 + 60 s, about 480 s;
#   each step is capped by `timeout`.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
CAND=${CAND:-MEMEXEC_KERNEL_CALLS=precompiled MEMEXEC_NORM_KERNEL=1 MEMEXEC_HEAD_NORM_KERNEL=1}
stamp() { echo "--- $(date -u +%T) $*"; }
stamp head-norms
timeout 180 $PY scripts/gpu/head_norms.py --quick --variant literal,nofma \
  --out "$OUT/head-norms.json" > "$OUT/head-norms.log" 2>&1
tail -8 "$OUT/head-norms.log"
stamp residual-norm
timeout 90 $PY scripts/gpu/residual_norm.py --quick --variant literal,plain \
  --out "$OUT/residual-norm.json" > "$OUT/residual-norm.log" 2>&1
tail -6 "$OUT/residual-norm.log"
stamp "e4b parity ($CAND)"
env $CAND timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" \
  --lengths 23,100,400 --tokens 32 > "$OUT/e4b-parity.log" 2>&1
grep -v transformers "$OUT/e4b-parity.log" | tail -8
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
stamp mlx-lm
timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 1 \
  > "$OUT/mlxlm-decode.log" 2>&1
echo "mlx-lm $(tail -1 "$OUT/mlxlm-decode.log")"
for arm in default cand; do
  stamp "extract $arm"
  if [ $arm = default ]; then envs=""; else envs=$CAND; fi
  env $envs timeout 120 $MEMEXEC bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 2 \
    --no-mlx-lm --json-out "$OUT/extract-w8-$arm.json" > "$OUT/extract-w8-$arm.log" 2>&1
  tail -4 "$OUT/extract-w8-$arm.log"
done
stamp quantized-row
timeout 120 $PY scripts/gpu/quantized_row.py --variants 4x2,1x4 --reps 5 --out "$OUT/qrow.json" \
  > "$OUT/qrow.log" 2>&1
tail -8 "$OUT/qrow.log"
stamp done
