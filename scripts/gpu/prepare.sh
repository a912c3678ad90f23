#!/usr/bin/env bash
# Collect, HERE, what travels to the GPU machine (../shared/GPU.md), into the ignored folder
# .gpu/ as bundles that each fit one device call (64 MiB with the working tree):
#   .gpu/send1/  mlx-cuda-13 wheel part 1, the release binary (xz)
#   .gpu/send2/  mlx-cuda-13 wheel part 2, the mlx + mlx-lm cp312 wheels, the Gemma-4 tokenizer
#                (tar.xz); with --bf16-fixture also the bf16 tiny
#                fixture + its oracle (tar.gz: 7 MiB, which no device script reads today; the
#                e4b checks cover bf16), in send3 where send2 has no room
#   .gpu/send3/  the f32 tiny fixture + its mlx-lm oracle (tar.gz), for `oracle_gpu` only (the
#                tiny fixture is no GPU oracle: session 2): optional, carry it in any later
#                call. REQUIRED (third call) once the CUDA wheel does not fit in send1 and
#                send2 (a tracked tree over ~18 MiB, session 34): then it holds the wheel's
#                part 3 too, and the manifests say `bundles 3`.
# Each bundle holds MANIFEST-<n> (sha256 of its files, the bundle count and a prepare id),
# so scripts/gpu/remote.sh can check what arrived and tell what is still missing.
#
# Usage: scripts/gpu/prepare.sh [--no-binary] [--bf16-fixture]
#   env: GPU_WHEELS (default .gpu/wheels; fetched with pip download when absent),
#        MEMEXEC_BIN (default target/release/memexec), DEPS (default .deps),
#        BUNDLE_MAX_MIB (default: 64 MiB less the tracked tree, which travels with each call,
#        less 256 KiB)
# Then (the lead, with the device tool; back to back, the machine stays warm ~30 s):
#   run(carry=[".gpu/send1"], command="bash scripts/gpu/remote.sh")
#   run(carry=[".gpu/send2"], command="bash scripts/gpu/remote.sh '<cmd>' ...")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DEPS=${DEPS:-$ROOT/.deps}
WHEELS=${GPU_WHEELS:-$ROOT/.gpu/wheels}
BIN=${MEMEXEC_BIN:-$ROOT/target/release/memexec}
NO_BINARY=0
BF16_FIXTURE=0
log() { printf '[gpu-prepare] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
for a in "$@"; do
  case "$a" in
  --no-binary) NO_BINARY=1 ;;
  --bf16-fixture) BF16_FIXTURE=1 ;;
  *) die "unknown option $a (usage: prepare.sh [--no-binary] [--bf16-fixture])" ;;
  esac
done
# A device call carries the working tree as well as one bundle, 64 MiB in all: a bundle may
# take what the tracked and untracked-not-ignored files leave, less 256 KiB. Counted in disk
# blocks (`du -k`), as the device tool counts: with ~560 small files that is ~1.3 MiB more
# than their bytes. (One `du -c` over `xargs` would total only xargs' last batch.)
tree_kib=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 du -k 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
tree_bytes=$((tree_kib * 1024))
if [ -n "${BUNDLE_MAX_MIB:-}" ]; then
  MAX_BYTES=$((BUNDLE_MAX_MIB * 1048576))
else
  MAX_BYTES=$((64 * 1048576 - tree_bytes - 262144))
fi

CUDA_WHL=mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl
MLX_WHL=mlx-0.32.2-cp312-cp312-manylinux_2_35_x86_64.whl
LM_WHL=mlx_lm-0.32.2-py3-none-any.whl

# --- wheels (pinned; fetched once with the ordinary pip client when missing)
mkdir -p "$WHEELS"
fetch() { # spec platform
  local py=python3
  [ -x "$DEPS/venv/bin/python" ] && py=$DEPS/venv/bin/python
  log "fetching $1"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform "$2" -d "$WHEELS" "$1"
}
[ -f "$WHEELS/$CUDA_WHL" ] || fetch mlx-cuda-13==0.32.2 manylinux_2_35_x86_64
[ -f "$WHEELS/$MLX_WHL" ] || fetch mlx==0.32.2 manylinux_2_35_x86_64
[ -f "$WHEELS/$LM_WHL" ] || fetch mlx-lm==0.32.2 any
for w in "$CUDA_WHL" "$MLX_WHL" "$LM_WHL"; do
  [ -f "$WHEELS/$w" ] || die "missing $WHEELS/$w"
done

# --- inputs from the setup
TOK=$DEPS/tokenizers/gemma4
FIX=$DEPS/fixtures
for p in "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$TOK/chat_template.jinja" \
  "$FIX/tiny-gemma4-q4-f32/config.json" "$FIX/oracle/tiny-gemma4-q4-f32.json" \
  "$FIX/tiny-gemma4-q4/config.json" "$FIX/oracle/tiny-gemma4-q4.json"; do
  [ -f "$p" ] || die "missing $p (run scripts/setup.sh first)"
done
if [ "$NO_BINARY" = 0 ]; then
  [ -x "$BIN" ] || die "missing $BIN (cargo build --release first, or pass --no-binary for an mlx-lm-only run)"
  # The binary's own NEEDED libraries found under the setup folder will not exist there, except
  # libmlx.so (replaced by the CUDA build; its own dependencies come with that wheel).
  if command -v ldd >/dev/null && command -v readelf >/dev/null; then
    needed=$(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    echo "$needed" | grep -qx 'libmlx\.so' || log "WARNING: the binary does not load libmlx.so dynamically"
    for lib in $needed; do
      [ "$lib" = libmlx.so ] && continue
      path=$(ldd "$BIN" | awk -v l="$lib" '$1 == l { print $3 }')
      case "$path" in
      "$(readlink -f "$DEPS")"/* | "$DEPS"/*) log "WARNING: $lib comes from $path (absent there)" ;;
      esac
    done
  fi
fi

# --- bundles
OUTD=$ROOT/.gpu
rm -rf "$OUTD/send1" "$OUTD/send2" "$OUTD/send3" "$OUTD/stage"
mkdir -p "$OUTD/send1" "$OUTD/send2" "$OUTD/send3" "$OUTD/stage"
S1=$OUTD/send1
S2=$OUTD/send2
S3=$OUTD/send3
if [ "$NO_BINARY" = 0 ]; then
  xz -T2 -6 -c "$BIN" >"$S1/memexec.xz"
fi
# Bundle 1 takes as much of the CUDA wheel as fits next to the binary, bundle 2 as much of the
# rest as fits next to the other wheels and the tokenizer, bundle 3 what is left (the tracked
# tree grows with every benchmark folder: since session 34 the wheel no longer fits in two).
# 64 KiB of each stay for the manifest. remote.sh joins the parts in name order.
whl_bytes=$(stat -c %s "$WHEELS/$CUDA_WHL")
part0=$((MAX_BYTES - $(du -k "$S1" | cut -f1) * 1024 - 65536))
# Byte ranges of the wheel (dd: a `tail | head` pipe dies of SIGPIPE under pipefail).
whl_range() { # skip count out
  dd if="$WHEELS/$CUDA_WHL" of="$3" bs=1M iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none
}
whl_range 0 "$part0" "$S1/cuda.part0"
cp "$WHEELS/$MLX_WHL" "$WHEELS/$LM_WHL" "$S2/"
tar -C "$DEPS/tokenizers" -cf - gemma4 | xz -T2 -6 >"$S2/tokenizer-gemma4.tar.xz"
part1=$((MAX_BYTES - $(du -sb "$S2" | cut -f1) - 65536))
whl_range "$part0" "$part1" "$S2/cuda.part1"
NB=2
if [ $((part0 + part1)) -lt "$whl_bytes" ]; then
  whl_range $((part0 + part1)) $((whl_bytes - part0 - part1)) "$S3/cuda.part2"
  NB=3
  log "the CUDA wheel travels in 3 parts: send3 is required"
fi
pack_fixture() { # name dest
  mkdir -p "$OUTD/stage/fx/$1/oracle"
  cp -r "$FIX/$1" "$OUTD/stage/fx/$1/"
  cp "$FIX/oracle/$1.json" "$OUTD/stage/fx/$1/oracle/"
  tar -C "$OUTD/stage/fx/$1" -cf - . | gzip -6 >"$2/fixture-$1.tar.gz"
}
pack_fixture tiny-gemma4-q4-f32 "$S3"
if [ "$BF16_FIXTURE" = 1 ]; then
  # Where bundle 2 has no room for it, the bf16 fixture goes with bundle 3.
  pack_fixture tiny-gemma4-q4 "$S2"
  if [ $(($(du -sb "$S2" | cut -f1) + 65536)) -gt "$MAX_BYTES" ]; then
    mv "$S2/fixture-tiny-gemma4-q4.tar.gz" "$S3/"
  fi
fi
rm -rf "$OUTD/stage"
[ "$(cat "$S1/cuda.part0" "$S2/cuda.part1" "$S3"/cuda.part2 2>/dev/null | sha256sum)" = \
  "$(sha256sum <"$WHEELS/$CUDA_WHL")" ] || die "the CUDA wheel's parts do not join to the wheel"

# --- manifests: sha256 per file, the bundle count, one id for this prepare run
ID=$(cat "$S1"/* "$S2"/* "$S3"/* | sha256sum | cut -c1-16)
for n in 1 2 3; do
  d=$OUTD/send$n
  {
    echo "# memexec-gpu bundle $n (1 to $NB required$([ "$NB" = 2 ] && echo ', 3 optional')), prepare id $ID, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "id $ID"
    echo "bundles $NB"
    echo "cuda_wheel $CUDA_WHL"
    (cd "$d" && sha256sum -- * | sed 's/^/file /')
  } >"$OUTD/MANIFEST-$n.tmp"
  mv "$OUTD/MANIFEST-$n.tmp" "$d/MANIFEST-$n"
  size=$(du -sb "$d" | cut -f1)
  log "send$n: $((size / 1024)) KiB ($(ls "$d" | tr '\n' ' '))"
  [ "$size" -le "$MAX_BYTES" ] ||
    die "send$n is $((size / 1024)) KiB > $((MAX_BYTES / 1024)) KiB: it would not travel with the tree"
done
log "tracked tree: $tree_kib KiB; prepare id $ID"
log "next: run(carry=[\".gpu/send1\"], command=\"bash scripts/gpu/remote.sh\"), then at once"
if [ "$NB" = 3 ]; then
  log "      run(carry=[\".gpu/send2\"], command=\"bash scripts/gpu/remote.sh\"), then at once"
  log "      run(carry=[\".gpu/send3\"], command=\"bash scripts/gpu/remote.sh '<cmd>' ...\")"
else
  log "      run(carry=[\".gpu/send2\"], command=\"bash scripts/gpu/remote.sh '<cmd>' ...\")"
fi
