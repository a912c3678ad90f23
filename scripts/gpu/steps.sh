#!/usr/bin/env bash
# The measurement steps of one H200 round, run THERE through scripts/gpu/remote.sh (which
# exports MEMEXEC E4B TINY OUT PY and installs everything first). One step per argument, so a
# device call can run several and stay under its 10-minute limit:
#   check   row-exactness facts of MLX on this device (row_kernels.py), memexec's values-product
#           kernel vs cuBLAS at every key count it covers (values_order.py --table) + memexec vs
#           mlx-lm greedy ids on the e4b checkpoint (e4b_parity.py)
#   warm    first-use kernel JIT of every decode shape (a short bench, a generate), then the
#           single-stream decode speed of `memexec generate` (400 random ids, 128 new, x2)
#   bench   `memexec bench` on e4b: serial and widths 1-16 on EXTRACT/SHORT/UNIFORM, with
#           mlx-lm (generate_step / batch_generate) on the same prompt ids, in one JSON
#   logprobs  memexec vs mlx-lm step by step (log-prob sums, ids) on random prompts of
#           520/700/1000 ids: the first step where the numbers differ (logprobs_compare.py)
#   trace   memexec vs mlx-lm tensor by tensor (every layer's hidden state, queries, keys,
#           values, attention output) on random prompts of 520/700 ids, 4 tokens: the first
#           call / layer that differs
#   opsbuf  single-stream decode of `memexec generate` (with its host-time profile) and of
#           mlx-lm's generate_step on the 400-id prompt, at MLX_MAX_OPS_PER_BUFFER = the default
#           (20 kernels per CUDA graph) and OPSBUF_VALUES (default "60 120 240")
#   serial  single-stream decode, memexec `generate` then mlx-lm `generate_step`, on the 400-id
#           prompt, 128 new tokens, SERIAL_ROUNDS (default 3) interleaved rounds (the pairs to
#           compare: the machine drifts between rounds)
#   ab      the same bench on EXTRACT at width 8 with RoPE and the greedy pick run once per
#           row (MEMEXEC_ROW_OPS=per-row, the decoder before 2026-11-30 session 3)
#   extract issue #8's target (2): EXTRACT at width 8 (serial and batched interleaved, 3 reps)
#           in EXTRACT_ROUNDS (default 2) rounds; with MEMEXEC_B (another binary, e.g. carried
#           in .gpu/extra/) each round runs it right after $MEMEXEC (an interleaved A/B); one
#           JSON per round and arm ($OUT/extract-rN-A.json, -B.json)
# Example: run(command="bash scripts/gpu/remote.sh 'bash scripts/gpu/steps.sh check warm'")
set -uo pipefail
# MLX CUDA caches one CUDA graph per decode shape; the default cache thrashes ("Cache thrashing
# is happening") over the many shapes of a batched bench.
export MLX_CUDA_GRAPH_CACHE_SIZE=${MLX_CUDA_GRAPH_CACHE_SIZE:-4096}
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
rc=0
for step in "$@"; do
  echo "--- step $step"
  case "$step" in
  check)
    timeout 240 $PY scripts/gpu/row_kernels.py --out "$OUT/row-kernels.json" || rc=1
    timeout 120 $PY scripts/gpu/values_order.py /tmp/values-order --table 1 || rc=1
    timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" \
      --lengths 23,100,400 --tokens 32 || rc=1 ;;
  warm)
    $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 16 --ignore-eos --json >/dev/null || rc=1
    timeout 150 $MEMEXEC bench --model "$E4B" --reps 1 --max-tokens 3 --no-mlx-lm 2>&1 | tail -3
    for i in 1 2; do
      $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 128 --ignore-eos --json |
        $PY -c "import json,sys;d=json.load(sys.stdin);print('generate P400 x128', {k:d.get(k) for k in ['prefill_tokens_per_s','decode_tokens_per_s']})" || rc=1
    done ;;
  bench)
    timeout 560 $MEMEXEC bench --model "$E4B" --reps 2 --mlx-lm-reps 1 --python "$PY" \
      --json-out "$OUT/memexec-bench.json" || rc=1 ;;
  logprobs)
    timeout 300 $PY scripts/gpu/logprobs_compare.py "$MEMEXEC" "$E4B" "$OUT/logprobs-compare.json" \
      --lengths 520,700,1000 --tokens 32 || rc=1 ;;
  trace)
    timeout 300 $PY scripts/gpu/trace_compare.py "$MEMEXEC" "$E4B" "$OUT/trace-compare.json" \
      --lengths ${TRACE_LENGTHS:-520,700} --tokens 4 || rc=1 ;;
  opsbuf)
    $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 16 --ignore-eos --json >/dev/null || rc=1
    for n in default ${OPSBUF_VALUES:-60 120 240}; do
      if [ "$n" = default ]; then unset MLX_MAX_OPS_PER_BUFFER; else export MLX_MAX_OPS_PER_BUFFER=$n; fi
      for i in 1 2; do
        $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 128 --ignore-eos --json |
          $PY -c "import json,sys;d=json.load(sys.stdin);print('ops/buffer $n memexec', round(d['decode_tokens_per_s'],1), 'tok/s', {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()})" || rc=1
      done
      echo "ops/buffer $n mlx-lm $(timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 2)" || rc=1
    done
    unset MLX_MAX_OPS_PER_BUFFER ;;
  serial)
    $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 16 --ignore-eos --json >/dev/null || rc=1
    for i in $(seq 1 "${SERIAL_ROUNDS:-3}"); do
      $MEMEXEC generate --model "$E4B" --prompt-ids "$P400" --max-tokens 128 --ignore-eos --json |
        $PY -c "import json,sys,hashlib;d=json.load(sys.stdin);print('round $i memexec', round(d['decode_tokens_per_s'],1), 'tok/s, prefill', round(d['prefill_tokens_per_s']), 'tok/s', {k:round(v,2) for k,v in d['decode_profile_ms_per_step'].items()}, 'ids', hashlib.sha1(str(d['ids']).encode()).hexdigest()[:10])" || rc=1
      echo "round $i mlx-lm $(timeout 120 $PY scripts/gpu/mlxlm_decode_speed.py "$E4B" --prompt-ids "$P400" --tokens 128 --reps 1)" || rc=1
    done ;;
  ab)
    MEMEXEC_ROW_OPS=per-row timeout 200 $MEMEXEC bench --model "$E4B" \
      --workloads EXTRACT --widths 8 --reps 2 --no-mlx-lm --json-out "$OUT/memexec-bench-before.json" || rc=1 ;;
  extract)
    [ -z "${MEMEXEC_B:-}" ] || chmod +x "$MEMEXEC_B"
    for i in $(seq 1 "${EXTRACT_ROUNDS:-2}"); do
      for arm in A ${MEMEXEC_B:+B}; do
        bin=$MEMEXEC
        [ "$arm" = B ] && bin=$MEMEXEC_B
        echo "round $i arm $arm: $bin"
        timeout 150 "$bin" bench --model "$E4B" --workloads EXTRACT --widths 8 --reps 3 \
          --no-mlx-lm --json-out "$OUT/extract-r$i-$arm.json" 2>&1 | tail -5 || rc=1
      done
    done ;;
  *) echo "unknown step $step"; rc=2 ;;
  esac
done
exit $rc
