#!/usr/bin/env bash
# mlx-lm oracle files for the fixture models: $DEPS/fixtures/oracle/<model>[+<adapter>].json
# (schema: tests/fixtures/README.md). One stamp per file: hash of oracle.py, its arguments and
# the stamp of the fixture it reads.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}" "${VENV:?}"
cd "$ROOT"
. scripts/fixtures/stamp.sh
PY=$VENV/bin/python
FIX=$DEPS/fixtures
OUT=$FIX/oracle
mkdir -p "$OUT"
log() { printf '[oracle] %s\n' "$*" >&2; }

# file-name | fixture stamp it depends on | oracle.py arguments. The bf16-scale fixtures get 16
# greedy tokens, not 40: MLX decodes them ~10x slower on CPU, and past 8-16 tokens their
# bf16 rounding makes even mlx-lm's own batched and single paths disagree.
JOBS=(
  "tiny-gemma4-q4-f32|.stamp-tiny|--model tiny-gemma4-q4-f32 --batch --verify-head --require-varied"
  "tiny-gemma4-q4|.stamp-tiny|--model tiny-gemma4-q4 --max-new 16"
  "tiny-gemma4-mixed48|.stamp-tiny|--model tiny-gemma4-mixed48 --max-new 16"
  "tiny-gemma4-q4-f32+lora-default|.stamp-adapters|--model tiny-gemma4-q4-f32 --adapter lora-default --batch"
  "tiny-gemma4-q4-f32+lora-attn-mlp|.stamp-adapters|--model tiny-gemma4-q4-f32 --adapter lora-attn-mlp --batch"
  "tiny-gemma4-q4-f32+lora-ple|.stamp-adapters|--model tiny-gemma4-q4-f32 --adapter lora-ple --batch"
  "gemma3-270m-q4-f32|.stamp-gemma3-270m|--model gemma3-270m-q4-f32 --kind real --prompts fibonacci,sentence,list,chat"
)
# The 270M's prompt past its 512-token window (~4 CPU-minutes of mlx-lm; 252.8 s measured on 2
# cores) is only read by the ignored slow test `gemma3_270m_long_prompt_matches_mlx_lm`:
# generated on request.
if [ "${MEMEXEC_SLOW_ORACLE:-0}" = 1 ]; then
  JOBS+=("gemma3-270m-q4-f32-long|.stamp-gemma3-270m|--model gemma3-270m-q4-f32 --kind real --prompts long")
fi
t0=$SECONDS
for job in "${JOBS[@]}"; do
  IFS='|' read -r name dep args <<<"$job"
  [ -f "$FIX/$dep" ] || { log "missing $FIX/$dep (run scripts/setup.d/30-fixtures.sh first)"; exit 1; }
  # MEMEXEC_BLAS: the BLAS MLX runs on (see setup.sh); its kernels shape the oracle's numbers.
  H=$( (stamp_hash scripts/fixtures/oracle.py "$FIX/$dep"; echo "$args ${MEMEXEC_BLAS:-}") | sha256sum | cut -d' ' -f1)
  if stamp_ok "$OUT/.stamp-$name" "$H" "$OUT/$name.json"; then
    continue
  fi
  # shellcheck disable=SC2086 # args is a word list by design
  "$PY" scripts/fixtures/oracle.py "$FIX" "$OUT/$name.json.tmp" $args
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  echo "$H" >"$OUT/.stamp-$name"
done
log "oracle files up to date ($((SECONDS - t0)) s)"
