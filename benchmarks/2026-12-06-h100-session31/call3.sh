# session 31, call 2 (through remote.sh, after the bundles arrived): memexec vs mlx-lm greedy
# ids on e4b, then the batched decoder's lone row (`generate --decoder`: a batched engine's
# path for a lone call) plainly and verifying drafts, next to the serial loop (ids must equal).
set -u
export MLX_CUDA_GRAPH_CACHE_SIZE=4096
echo "uname: $(uname -srvm)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $PY scripts/gpu/e4b_parity.py "$MEMEXEC" "$E4B" "$OUT/e4b-parity.json" --lengths 23,100,400 --tokens 32; echo "e4b_parity rc=$?"
timeout 300 $PY scripts/gpu/speculate.py "$MEMEXEC" "$E4B" --ks 4 --rounds 1 --no-lookup --wrong 3 \
  --arms decoder:--decoder --plain-arms --out "$OUT/speculate-decoder-r1.json"; echo "speculate rc=$?"
