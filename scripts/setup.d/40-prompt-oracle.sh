#!/usr/bin/env bash
# The prompt oracle: Python Jinja2 (HF's apply_chat_template environment) and Python
# tokenizers render/encode generated cases into $DEPS/fixtures/prompt-oracle for
# tests/prompt_*.rs. Needs the tokenizers of 20-tokenizers.sh. Re-runs only when its inputs change.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}" "${VENV:?}"
cd "$ROOT"
OUT=$DEPS/fixtures/prompt-oracle
STAMP=$OUT/.stamp
INPUTS=(scripts/setup.d/40-prompt-oracle.sh scripts/fixtures/prompt_oracle.py tests/data/gemma4_chat_template.jinja
  tests/data/gemma4_e4b_chat_template.jinja)
for f in "$DEPS/tokenizers/gemma3/tokenizer_config.json" "$DEPS/tokenizers/gemma4/tokenizer_config.json"; do
  [ -f "$f" ] || { echo "[prompt-oracle] missing $f (run scripts/setup.d/20-tokenizers.sh first)" >&2; exit 1; }
done
HASH=$( (for f in "${INPUTS[@]}"; do printf '%s\n' "$f"; cat "$f"; done
  cat "$DEPS/tokenizers/.stamp" 2>/dev/null || true) | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  echo "[prompt-oracle] up to date" >&2
  exit 0
fi
TMP=$(mktemp -d "$DEPS/prompt-oracle.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
"$VENV/bin/python" scripts/fixtures/prompt_oracle.py "$ROOT" "$DEPS" "$TMP"
mkdir -p "$DEPS/fixtures"
rm -rf "$OUT"
chmod 755 "$TMP"
mv "$TMP" "$OUT"
trap - EXIT
echo "$HASH" >"$STAMP"
echo "[prompt-oracle] wrote $OUT" >&2
