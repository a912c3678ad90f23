#!/usr/bin/env bash
# Runs THERE, through remote.sh: `bash scripts/gpu/remote.sh 'bash scripts/gpu/host_probe.sh'`.
# `host_probe.sh --host-only` stops after the host part (runtime, CPU, runtime_probe.py,
# eval_cost.py, ~30 s), for a call that measures decoding some other way.
# Serial decode is host-bound on the H200 (benchmarks/README.md), and the device machines come
# on two runtimes (gVisor or Firecracker, ../.library/device/KINDS.md) that may price the host's
# CUDA calls differently; sessions 1-25 recorded neither for their figures. This records
# the runtime and CPU, then on the same host: runtime_probe.py (a syscall, a thread wake-up, a
# kernel launch, a 96-kernel graph's launch, a managed-memory token read), eval_cost.py (MLX's
# encode cost per node), memexec's plain decode (3 rounds) and mlx-lm's (3 reps) on the 400-id
# prompt. Run it on each kind a session is lent, and read decode figures against their host.
# Written in session 26 (no device); first run in session 29 on an H100 under Firecracker
# (benchmarks/2026-12-05-h100-session29/), where each memexec process took 17-22 s with the model
# load, so three variants rounds need more than the 150 s they had then.
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
echo "uname: $(uname -srvm)"
grep -m1 "model name" /proc/cpuinfo; echo "nproc $(nproc)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
timeout 90 $PY scripts/gpu/runtime_probe.py --out $OUT/runtime_probe.json; echo "runtime_probe rc=$?"
timeout 150 $PY scripts/gpu/eval_cost.py --nodes 400 --reps 4 --out $OUT/eval_cost.json > $OUT/eval_cost.log 2>&1; echo "eval_cost rc=$?"
cut -c1-120 $OUT/eval_cost.log
[ "${1:-}" = --host-only ] && exit 0
P400=$($PY -c "import random;r=random.Random(0);print(','.join(str(r.randrange(3,200000)) for _ in range(400)))")
ROUNDS=3 GEN_TOKENS=128 BENCH_WIDTHS= timeout 240 bash scripts/gpu/variants.sh base=$MEMEXEC > $OUT/variants.log 2>&1; echo "variants rc=$?"
grep round $OUT/variants.log
timeout 100 $PY scripts/gpu/mlxlm_decode_speed.py $E4B --prompt-ids $P400 --tokens 128 --reps 3 > $OUT/mlxlm.log 2>&1; echo "mlxlm rc=$?"; tail -1 $OUT/mlxlm.log | cut -c1-300
