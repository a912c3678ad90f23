#!/usr/bin/env bash
# The C host test: compiled with cc against include/memexec.h, linked to the cdylib, run, then
# run again under valgrind (no definite leaks; a smaller thread load, valgrind being slow).
# The valgrind run is serial (MLX_BUN_MEMORY_BATCH=1): each batched engine start runs the
# batched-vs-serial self-check, ~450 s per start under valgrind; the batched path's memory
# is covered by tests/batch_exact.rs (250 batches without active-memory growth).
# OPENBLAS_NUM_THREADS=1 there: under valgrind's one-thread-at-a-time scheduler, OpenBLAS's
# exit handler (gotoblas_quit -> blas_thread_shutdown_) can wait forever in pthread_join on a
# worker that missed its wake-up (seen 2026-11-30: every check passed, then the process hung at
# exit); with one BLAS thread there is no worker to join. `timeout` turns any other hang into a
# failure instead of a CI run that never ends. The same hang was then seen once WITHOUT valgrind
# (2026-11-30 session 5: all checks passed, main thread in gotoblas_quit -> pthread_join, the
# worker in its condition wait, 20 min), so the plain run also uses one BLAS thread and a
# timeout: this test is about the C ABI, and the engine under multi-threaded BLAS is covered by
# cargo test.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/host-oracle.sh
OUT=target/host-oracle
# The cdylib's folder: target/debug, or target/<triple>/debug under scripts/test.sh.
LIB="${MEMEXEC_TARGET_DIR:-$PWD/target}/debug"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -pthread -Iinclude -I"$OUT" tests/c_host/host.c \
  -L"$LIB" -lmemexec -Wl,-rpath,"$LIB" -o "$OUT/c_host"
OPENBLAS_NUM_THREADS=1 timeout 900 "$OUT/c_host"
MEMEXEC_HOST_QUICK=1 MLX_BUN_MEMORY_BATCH=1 OPENBLAS_NUM_THREADS=1 timeout 1800 valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite --error-exitcode=99 "$OUT/c_host"
