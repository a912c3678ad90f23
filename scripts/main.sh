#!/usr/bin/env bash
# The main job (README): set up (idempotent), build, and answer a JSONL of memory-pipeline
# calls with `memexec run` on a model the setup provides (default: the tiny Gemma-4 fixture;
# pass `--model DIR` and/or `--input FILE` to run another model or workload).
set -euo pipefail
cd "$(dirname "$0")/.."
unset RUSTFLAGS RUSTDOCFLAGS
bash scripts/setup.sh
cargo build --release --bin memexec
args=("$@")
[[ " $* " == *" --model "* || " $* " == *" --config "* ]] || args+=(--model .deps/fixtures/tiny-gemma4-q4-f32)
[[ " $* " == *" --input "* || " $* " == *" -i "* ]] || args+=(--input examples/data/memory-calls.jsonl)
exec target/release/memexec run "${args[@]}"
