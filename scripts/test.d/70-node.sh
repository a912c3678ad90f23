#!/usr/bin/env bash
# The Node-API addon: build it with the napi CLI (which regenerates index.js and index.d.ts:
# they must equal the committed ones), then its tests under Node's runner and under Bun.
set -euo pipefail
cd "$(dirname "$0")/../.."
JS=.deps/js/node_modules/.bin
bash scripts/host-oracle.sh
"$JS/napi" build --platform --manifest-path bindings/node/Cargo.toml \
  --package-json-path bindings/node/package.json -o bindings/node --js index.js --dts index.d.ts
if ! git diff --quiet HEAD -- bindings/node/index.d.ts bindings/node/index.js; then
  git --no-pager diff HEAD -- bindings/node/index.d.ts bindings/node/index.js | head -40 >&2
  echo "bindings/node/index.{d.ts,js} drifted from src/lib.rs: commit the regenerated files" >&2
  exit 1
fi
node --test bindings/node/test/
"$JS/bun" test --timeout 120000 ./bindings/node/test/
