#!/usr/bin/env bash
# The main job (README): set up (idempotent), build, and run memexec's end-to-end job.
set -euo pipefail
cd "$(dirname "$0")/.."
unset RUSTFLAGS RUSTDOCFLAGS
bash scripts/setup.sh
cargo build --bin memexec
exec target/debug/memexec smoke "$@"
