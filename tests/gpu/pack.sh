#!/usr/bin/env bash
# What the GPU check needs beside the working tree, into build/gpu (ignored; carried with the tree):
#   wheels/   a wheel for Python 3.12 on manylinux x86-64 for each `carry` line of tests/gpu/requirements.txt;
#   _proto/   the generated protobuf modules (`make protos`);
#   engines/  each built model file of engines/ under 1 MiB (tiny, identity_fp32, echo_bytes, ...);
#             minilm's ONNX (~87 MiB) is over the 64 MiB that travels, so its checks skip there.
# Prints the size of build/gpu and of everything that travels (tracked and untracked-not-ignored
# files plus build/gpu), and fails when that is over 64 MiB.
# Usage: bash tests/gpu/pack.sh   (PY=.venv/bin/python; `make gpu-pack` builds the protos and models first)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
pack=build/gpu
LIMIT=$((64 << 20))
rm -rf "$pack" && mkdir -p "$pack/wheels" "$pack/engines"
mapfile -t carried < <(grep -E '#\s*carry' tests/gpu/requirements.txt | sed -E 's/\s*#.*//; s/\s+//g')
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$pack/wheels" "${carried[@]}"
cp -r service/trtserve/_proto "$pack/_proto"
find "$pack/_proto" -name __pycache__ -prune -exec rm -rf {} +
for f in engines/*/[0-9]*/*; do
  git check-ignore -q "$f" || continue  # tracked files travel anyway; only built ones are carried
  if [ "$(stat -c %s "$f")" -lt $((1 << 20)) ]; then
    mkdir -p "$pack/$(dirname "$f")" && cp "$f" "$pack/$f"
  else
    echo "not carried: $f ($(( $(stat -c %s "$f") >> 20 )) MiB)"
  fi
done
ls "$pack/wheels"
pack_bytes=$(du -sb "$pack" | cut -f1)
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((pack_bytes + tree_bytes))
printf '%s: %.1f MiB; the tree: %.1f MiB; all that travels: %.1f MiB of 64\n' "$pack" \
  "$(echo "$pack_bytes / 1048576" | bc -l)" "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
[ "$total" -le "$LIMIT" ] || { echo "over the 64 MiB that travels" >&2; exit 1; }
