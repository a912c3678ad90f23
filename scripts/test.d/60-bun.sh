#!/usr/bin/env bash
# The bun:ffi binding and the drop-in seam (ts/), under Bun from .deps/js.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/host-oracle.sh
# Under scripts/test.sh the cdylib is in target/<triple>/debug, where ts/ffi.ts does not look.
if [ -n "${MEMEXEC_TARGET_DIR:-}" ] && [ -z "${MEMEXEC_LIB:-}" ]; then
  for f in "$MEMEXEC_TARGET_DIR"/debug/libmemexec.{so,dylib}; do
    if [ -f "$f" ]; then
      export MEMEXEC_LIB=$f
      break
    fi
  done
fi
exec .deps/js/node_modules/.bin/bun test ts
