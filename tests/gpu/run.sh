#!/usr/bin/env bash
# The GPU checks of trtserve: one script for a machine with an NVIDIA GPU, under 5 minutes.
#   1. the cuda-python layer (tests/gpu/test_cuda_layer.py): pinned and device memory, async
#      copies on two streams, events, a packed batch's round trip, byte for byte;
#   2. where TensorRT's builder installs: plans for tiny and minilm (fp32, fp16) compared with
#      ONNX Runtime (fp32 <= 1e-3, fp16 <= 1e-2 abs), refusals, two concurrent slots, and
#      throughput per batch size (tests/gpu/test_tensorrt_gpu.py), and C15: two slots under 16
#      concurrent clients against the sequential reference (tests/gpu/test_tensorrt_concurrent_slots.py).
#      Otherwise it says it skipped.
# Each pytest run must pass at least one test: this script runs only where nvidia-smi sees a GPU,
# so a run in which every test skipped (or none was collected) counts as a failure.
# Usage: bash tests/gpu/run.sh   (GPU_VENV=dir to choose where the throwaway venv goes)
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$SECONDS
say() { printf '\n== %s (t=%ds)\n' "$*" $((SECONDS - T0)); }
status=0

say "GPU"
if ! nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader; then
  echo "nvidia-smi failed: no NVIDIA GPU or driver on this machine, nothing to check."
  exit 1
fi
driver_major=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | cut -d. -f1)
if [ "${driver_major:-0}" -ge 580 ]; then
  cuda_py='cuda-python>=13.0'; trt_pkg='tensorrt-cu13'
else  # CUDA 13 wheels need driver r580+
  cuda_py='cuda-python>=12.9.1,<13'; trt_pkg='tensorrt-cu12'
fi
echo "driver r${driver_major}: ${cuda_py}, ${trt_pkg}"

say "Python environment"
venv=${GPU_VENV:-/tmp/trtserve-gpu-venv}
if python3 -m venv "$venv" >/dev/null 2>&1; then
  PY="$venv/bin/python"; pip_args=()
else  # no venv module: the user site
  PY=python3; pip_args=(--user --break-system-packages)
fi
pip() { timeout "$1" "$PY" -m pip install -q --disable-pip-version-check "${pip_args[@]}" "${@:2}"; }
pip 180 "numpy>=1.26" "grpcio>=1.81" "protobuf>=6.31,<7" "grpcio-tools>=1.81" "ml-dtypes>=0.4" \
  "onnx>=1.16" onnxruntime onnxconverter-common pytest pytest-asyncio pytest-timeout "$cuda_py" \
  || { echo "pip could not install the base packages"; exit 1; }
"$PY" -c "import cuda.bindings, sys; print('python', sys.version.split()[0], '| cuda-bindings', cuda.bindings.__version__)"
export PYTHONPATH="$PWD/service${PYTHONPATH:+:$PYTHONPATH}"

# gpu_pytest SECONDS ARGS...: pytest under a time limit; fails when pytest fails or when no test passed.
gpu_pytest() {
  local limit=$1 report rc
  shift
  report=$(mktemp --suffix=.xml)
  timeout "$limit" "$PY" -m pytest -q -s -p no:cacheprovider -rs --junitxml="$report" "$@"
  rc=$?
  if [ $rc -eq 0 ] && ! "$PY" - "$report" <<'EOF_PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
counts = {k: int(suite.get(k, 0)) for k in ("tests", "skipped", "failures", "errors")}
passed = counts["tests"] - counts["skipped"] - counts["failures"] - counts["errors"]
print(f"{passed} passed of {counts['tests']} ({counts['skipped']} skipped)")
sys.exit(0 if passed > 0 else 1)
EOF_PY
  then
    echo "FAILED: no test passed (every one skipped): on a machine whose nvidia-smi sees a GPU, nothing was checked"
    rc=1
  fi
  rm -f "$report"
  return $rc
}

gen=service/trtserve/_proto
if [ ! -f "$gen/inference/grpc_service_pb2.py" ]; then  # what `make protos` does
  rm -rf "$gen" && mkdir -p "$gen"
  "$PY" -m grpc_tools.protoc -I protos --python_out="$gen" --pyi_out="$gen" --grpc_python_out="$gen" protos/inference/*.proto
  sed -i -E 's/^from inference import/from trtserve._proto.inference import/' "$gen"/inference/*.py
  touch "$gen/__init__.py" "$gen/inference/__init__.py"
fi
"$PY" -m trtserve build --model-repository engines --no-tensorrt tiny || status=1
[ -f engines/minilm/1/model.onnx ] || echo "engines/minilm/1/model.onnx is not here (it needs torch to export): the minilm checks will skip"

say "CUDA layer"
gpu_pytest 120 tests/gpu/test_cuda_layer.py || status=1

say "TensorRT (${trt_pkg})"
if pip 150 "$trt_pkg" && "$PY" -c "import tensorrt as t; t.Builder" 2>/dev/null; then
  "$PY" -c "import tensorrt as t; print('TensorRT', t.__version__)"
  remaining=$(( 290 - (SECONDS - T0) ))
  gpu_pytest $(( remaining > 30 ? remaining : 30 )) \
    tests/gpu/test_tensorrt_gpu.py tests/gpu/test_tensorrt_concurrent_slots.py \
    "tests/unit/test_tensorrt_cpu.py::test_tensorrt_stub_names_exist_in_the_installed_tensorrt" || status=1
else
  echo "SKIPPED the TensorRT checks: ${trt_pkg} (TensorRT's full builder) could not be installed or imported here;"
  echo "only the CUDA layer was checked. (A lean-runtime-only registry cannot build plans.)"
fi

say "done, status ${status}"
exit $status
