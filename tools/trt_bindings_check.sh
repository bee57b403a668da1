#!/usr/bin/env bash
# NVIDIA's real TensorRT Python bindings on a CPU machine, to check what trtserve assumes of them.
#
# TensorRT's libraries (libnvinfer & co.) cannot be installed here: PyPI's tensorrt-*-libs wheels
# download them from NVIDIA's own index. The bindings wheels (tensorrt-cu13-bindings,
# tensorrt-cu12-bindings) are on PyPI, and their compiled module needs only nine functions of those
# libraries. So, per TensorRT release checked, this script unpacks the bindings into build/ (never
# into the venv), adds the `tensorrt` package's one line (`from tensorrt_bindings import *`), and
# runs tests/unit/test_tensorrt_cpu.py twice:
#   1. bindings without their libraries: `import tensorrt` fails, and every TensorRT test must
#      pass or skip with the reason (the stub test skips);
#   2. bindings over stand-in libraries whose nine functions return NULL, which is what the real
#      ones return where CUDA cannot start: `import tensorrt` succeeds, trt.Builder()/trt.Runtime()
#      raise pybind's "factory function returned nullptr" TypeError, as on a host with no driver.
#      The stub test runs for real here: typings/tensorrt's classes, methods, enum members and
#      numbers, and int-ness, against the real bindings.
# Usage: bash tools/trt_bindings_check.sh   (PY=python to use; needs pip's registry and a C compiler)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
work=build/trt-bindings
RELEASES=("tensorrt-cu13-bindings==11.4.0.106" "tensorrt-cu12-bindings==10.16.1.11")
SYMBOLS=(createInferBuilder_INTERNAL createInferRuntime_INTERNAL createInferRefitter_INTERNAL
         initLibNvInferPlugins getPluginRegistry getBuilderPluginRegistry
         createNvOnnxParser_INTERNAL createNvOnnxParserRefitter_INTERNAL getNvOnnxParserVersion)
export PYTHONPATH="$PWD/service"
status=0
mkdir -p "$work/wheels"
for release in "${RELEASES[@]}"; do
  version=${release#*==}
  dir="$work/$version"
  echo "== $release"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" "$release"
  wheel=$(ls "$work"/wheels/"$(echo "${release%%==*}" | tr - _)"-"$version"-*.whl)
  rm -rf "$dir" && mkdir -p "$dir/site/tensorrt" "$dir/libs"
  "$PY" -m zipfile -e "$wheel" "$dir/site"
  printf 'from tensorrt_bindings import *  # noqa: F403\nfrom tensorrt_bindings import __version__  # noqa: F401\n' \
    >"$dir/site/tensorrt/__init__.py"
  for s in "${SYMBOLS[@]}"; do echo "void *$s(void) { return 0; }"; done >"$dir/libs/stand_in.c"
  major=${version%%.*}
  for lib in nvinfer nvinfer_plugin nvonnxparser; do
    cc -shared -fPIC -Wl,-soname,"lib$lib.so.$major" -o "$dir/libs/lib$lib.so.$major" "$dir/libs/stand_in.c"
  done
  tests=(tests/unit/test_tensorrt_cpu.py -q -p no:cacheprovider -rs -k "not mypy")
  echo "-- $version, bindings without their libraries"
  PYTHONPATH="$PYTHONPATH:$PWD/$dir/site" "$PY" -m pytest "${tests[@]}" || status=1
  echo "-- $version, bindings over stand-in libraries (TensorRT imports; CUDA cannot start)"
  PYTHONPATH="$PYTHONPATH:$PWD/$dir/site" LD_LIBRARY_PATH="$PWD/$dir/libs" "$PY" -m pytest "${tests[@]}" || status=1
done
exit $status
