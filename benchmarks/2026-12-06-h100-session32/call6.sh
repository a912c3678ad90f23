# session 32, call 6 (through remote.sh, after the bundles arrived again on a cold machine):
# graphs.sh's EXTRACT w8 under each setting, then one more decode round.
set -u
echo "uname: $(uname -srvm)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PART=bench bash benchmarks/2026-12-06-h100-session32/graphs.sh; echo "graphs bench rc=$?"
PART=decode ROUNDS=1 bash benchmarks/2026-12-06-h100-session32/graphs.sh; echo "graphs decode rc=$?"
