# session 32, call 9 (ran as benchmarks/2026-12-06-h100-session32/call6.sh; through remote.sh, after the bundles arrived on a second machine, an H200):
# graphs.sh's EXTRACT w8 under each setting, then one more decode round.
set -u
echo "uname: $(uname -srvm)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PART=bench bash benchmarks/2026-12-06-h100-session32/graphs.sh; echo "graphs bench rc=$?"
PART=decode ROUNDS=1 bash benchmarks/2026-12-06-h100-session32/graphs.sh; echo "graphs decode rc=$?"
