#!/usr/bin/env bash
# The bun:ffi binding and the drop-in seam (ts/), under Bun from .deps/js.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/host-oracle.sh
exec .deps/js/node_modules/.bin/bun test ts
