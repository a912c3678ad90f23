#!/usr/bin/env bash
# Builds the cdylib and writes the host tests' expected answers (Rust API serial greedy on the
# tiny fixture) to target/host-oracle/{oracle.json,host_oracle.h}. Used by scripts/test.d/*.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MEMEXEC_HOST_MODEL:-$PWD/.deps/fixtures/tiny-gemma4-q4-f32}
if [ ! -f "$MODEL/config.json" ]; then
  echo "host tests: fixture $MODEL is missing; run scripts/setup.sh" >&2
  exit 1
fi
OUT=target/host-oracle
mkdir -p "$OUT"
cargo build --lib
cargo run --quiet --example host_oracle -- "$MODEL" tests/data/host_cases.json "$OUT/oracle.json" "$OUT/host_oracle.h"
