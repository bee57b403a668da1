#!/usr/bin/env bash
# Run every generated client against one live trtserve and exit non-zero if any fails.
#
#   clients/run_all.sh [node] [cpp] [go]      (default: all three; `make clients-test`)
#
# Starts `trtserve serve --port 0 --http-port 0 --metrics-port 0` on 127.0.0.1 over engines/ (PYTHON picks the interpreter,
# default .venv/bin/python), waits for its "listening on" line, runs the Node.js test
# (node --test), the C++ example and the Go example with the server's address, then stops the
# server with SIGTERM. Where Debian's redis-server is installed it first starts one on 127.0.0.1
# at a free port (no persistence) and the server reads it (--redis-url): the Node.js queue-door
# test gets its URL as TRTSERVE_REDIS_URL (without redis-server that test skips, saying so). With go it also runs the bench load generator's tests (pytest, servers
# of their own; not skipped here). The clients must be built first (`make clients`).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
CLIENTS=("$@")
[ ${#CLIENTS[@]} -gt 0 ] || CLIENTS=(node cpp go)

REDIS=
REDIS_URL=
QUEUE_ARGS=()
if command -v redis-server >/dev/null; then
  REDIS_PORT=$(PYTHONPATH="$ROOT/service" "$PYTHON" -c 'from trtserve.testing.redis_server import free_port; print(free_port())')
  REDIS_DIR=$(mktemp -d -t trtserve-clients-redis.XXXXXX)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$REDIS_DIR" --save "" --appendonly no \
    --protected-mode yes >/dev/null 2>&1 &
  REDIS=$!
  REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
  QUEUE_ARGS=(--redis-url "$REDIS_URL")
else
  echo "== redis-server is not installed (clients/install_deps.sh or apt-get install redis-server): the queue door is off and its Node.js test skips"
fi

LOG=$(mktemp -t trtserve-clients.XXXXXX.log)
"$PYTHON" -m trtserve serve --model-repository "$ROOT/engines" --host 127.0.0.1 --port 0 --http-port 0 --metrics-port 0 \
  "${QUEUE_ARGS[@]}" >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
  if kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM "$SERVER" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER" 2>/dev/null || true
  fi
  wait "$SERVER" 2>/dev/null
  if [ -n "$REDIS" ]; then
    kill -TERM "$REDIS" 2>/dev/null
    wait "$REDIS" 2>/dev/null
    rm -rf "$REDIS_DIR"
    REDIS=
  fi
}
trap stop_server EXIT

URL=
for _ in $(seq 1200); do  # up to 120 s: models load before the server listens
  URL=$(sed -nE 's/.*listening on ([0-9.]+:[0-9]+).*/\1/p' "$LOG" | head -n1)
  [ -n "$URL" ] && break
  if ! kill -0 "$SERVER" 2>/dev/null; then break; fi
  sleep 0.1
done
if [ -z "$URL" ]; then
  echo "trtserve did not start:" >&2
  cat "$LOG" >&2
  exit 1
fi
echo "== trtserve at $URL (log: $LOG)"

FAILED=()
run() {  # run NAME COMMAND...
  local name=$1 start=$SECONDS
  shift
  echo "== $name: $*"
  if "$@"; then
    echo "== $name: passed ($((SECONDS - start)) s)"
  else
    echo "== $name: FAILED ($((SECONDS - start)) s)"
    FAILED+=("$name")
  fi
}

for client in "${CLIENTS[@]}"; do
  case $client in
    node) run node env TRTSERVE_URL="$URL" TRTSERVE_REDIS_URL="$REDIS_URL" node --test --test-reporter=spec clients/node/test/ ;;
    cpp) run cpp clients/cpp/build/trtserve_example "$URL" ;;
    go) run go clients/go/build/go_example "$URL"
        run loadgen env TRTSERVE_REQUIRE_LOADGEN=1 PYTHONPATH="$ROOT/service" "$PYTHON" -m pytest -q \
          tests/harness/test_loadgen_binary.py tests/harness/test_bench_load.py ;;
    *) echo "unknown client '$client' (node, cpp, go)" >&2; FAILED+=("$client") ;;
  esac
done

stop_server
trap - EXIT
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "== client checks FAILED: ${FAILED[*]} (server log: $LOG)" >&2
  exit 1
fi
echo "== all client checks passed: ${CLIENTS[*]}"
rm -f "$LOG"
