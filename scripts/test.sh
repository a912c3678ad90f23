#!/usr/bin/env bash
# The test command (README, .ci/run): set up (idempotent), then lint and run every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# A RUSTFLAGS in the environment would replace .cargo/config.toml's flags; keep builds uniform.
unset RUSTFLAGS RUSTDOCFLAGS
# napi's CLI always passes cargo an explicit `--target` (scripts/test.d/70-node.sh), and cargo
# keeps such builds apart from host builds (target/<triple>/), so the addon rebuilt every
# dependency (~3 minutes on 2 cores). Everything here builds for the host's triple instead, and
# the addon's build reuses it; the suites find the cdylib through MEMEXEC_TARGET_DIR.
CARGO_BUILD_TARGET=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_BUILD_TARGET
export MEMEXEC_TARGET_DIR="$PWD/target/$CARGO_BUILD_TARGET"
# Doctests get no build-script link args (rpath): let them find libmlx this way.
export LD_LIBRARY_PATH="$PWD/.deps/mlx-cpu/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Each step says when it starts (seconds since the test command began): where CI's time goes.
T0=$SECONDS
step() { printf '\n== %s (at %d s)\n' "$*" "$((SECONDS - T0))" >&2; }
# Everything but the mlx-lm oracle files (~6 minutes on 2 cores, mostly one Python thread);
# they are generated while cargo lints and builds, and the tests wait for them.
MEMEXEC_SETUP_EXCEPT=35-oracle.sh bash scripts/setup.sh
ORACLE_LOG=.deps/oracle-setup.log
MEMEXEC_SETUP_ONLY=35-oracle.sh bash scripts/setup.sh >"$ORACLE_LOG" 2>&1 &
ORACLE_PID=$!
trap 'kill "$ORACLE_PID" 2>/dev/null || true' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo test --no-run (the oracle files are being generated meanwhile)"
cargo test --no-run
step "waiting for the mlx-lm oracle files (scripts/setup.d/35-oracle.sh)"
oracle_rc=0
wait "$ORACLE_PID" || oracle_rc=$?
cat "$ORACLE_LOG" >&2
[ "$oracle_rc" = 0 ] || { echo "the oracle setup failed (log above)" >&2; exit 1; }
step "cargo test"
cargo test --no-fail-fast
# Later suites (C host, bun, node) hook in here.
for suite in scripts/test.d/*.sh; do
  [ -e "$suite" ] || continue
  step "$suite"
  bash "$suite"
done
step "all suites passed"
