#!/usr/bin/env bash
# The test command (README, .ci/run): set up (idempotent), then lint and run every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# A RUSTFLAGS in the environment would replace .cargo/config.toml's flags; keep builds uniform.
unset RUSTFLAGS RUSTDOCFLAGS
# Doctests get no build-script link args (rpath): let them find libmlx this way.
export LD_LIBRARY_PATH="$PWD/.deps/mlx-cpu/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bash scripts/setup.sh
step() { printf '\n== %s\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo test"
cargo test --no-fail-fast
# Later suites (C host, bun, node) hook in here.
for suite in scripts/test.d/*.sh; do
  [ -e "$suite" ] || continue
  step "$suite"
  bash "$suite"
done
