#!/usr/bin/env bash
# The GPU check's dry run on a CPU machine, in an environment that stands in for the GPU machine:
# a fresh Python 3.12 venv holding only tests/gpu/device-packages.txt (that machine's packages),
# a copy of what travels (tracked and untracked-not-ignored files, plus build/gpu from
# `make gpu-pack`), no registry (PIP_NO_INDEX) and no PYTHONPATH. Every GPU step must be reached
# and SKIPPED with its sentence; results in build/gpu-dry-run (gpu-check.json, .md, .log).
# Usage: bash tests/gpu/dry_run.sh   (PY312=python3.12; the venv is kept in /tmp/trtserve-device-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
PY312=${PY312:-$(ls -d "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
PY312=${PY312:-$(command -v python3.12)}
[ -x "$PY312" ] || { echo "no Python 3.12 here (set PY312)" >&2; exit 1; }
venv=/tmp/trtserve-device-venv
if [ ! -f "$venv/.installed" ] || [ tests/gpu/device-packages.txt -nt "$venv/.installed" ]; then
  rm -rf "$venv" && "$PY312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/gpu/device-packages.txt
  touch "$venv/.installed"
fi
[ -d build/gpu/wheels ] || { echo "no build/gpu: run \`make gpu-pack\` first" >&2; exit 1; }
tree=$(mktemp -d /tmp/trtserve-device-tree.XXXX)
trap 'rm -rf "$tree"' EXIT
git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$tree"
mkdir -p "$tree/build" && cp -r build/gpu "$tree/build/gpu"
out=$repo/build/gpu-dry-run
rm -rf "$out"
cd "$tree"
env -u PYTHONPATH -u VIRTUAL_ENV PATH="$venv/bin:$PATH" PYTHON="$venv/bin/python" GPU_CHECK_OUT="$out" \
  GPU_SITE="$tree/.site" bash tests/gpu/run.sh
