#!/usr/bin/env bash
# JS tooling for the bindings, from the npm registry into .deps/js: Bun (runs ts/ tests and
# loads the Node addon under Bun) and the napi-rs CLI (builds bindings/node and generates its
# index.d.ts). Idempotent: skipped when the pinned versions are installed.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}"
BUN_VERSION=1.4.5
NAPI_CLI_VERSION=3.10.12
JS=$DEPS/js
STAMP=$JS/.stamp
WANT="bun@$BUN_VERSION @napi-rs/cli@$NAPI_CLI_VERSION"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$JS/node_modules/.bin/bun" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "[setup] npm is required (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$JS"
npm install --silent --no-audit --no-fund --prefix "$JS" $WANT
"$JS/node_modules/.bin/bun" --version >/dev/null
echo "$WANT" > "$STAMP"
