"""The failure-case tests' kit: models, requests and probes shared by the reliability tests
(issue 10, ``../shared/cases.md``).

Every test runs a real server (``make_server`` for an in-process ``ServerThread``, or a
``ServerProcess`` child where it needs signals or its own RSS) over a temporary repository
written here:

* :func:`write_identity`: an ONNX Runtime identity of any datatype and dims (``identity_fp32``,
  ``seq_int64``, FP16, BYTES echo ...), from :func:`trtserve.testing.models.identity`.
* :func:`write_probe`: a Python model (platform ``python``) like ``engines/slow`` — each batch
  sleeps ``batch_ms + row_ms * rows`` — that also logs every batch it runs (start, end, the
  first value of each row, which the tests use as the request id) and injects faults on
  demand: raise on its N-th batch or on a row id, hang, return a wrong output shape.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path

import grpc
import numpy as np

from integration.helpers import scrape
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.testing.models import config_text, identity, write_model

# The probe model. Rows are identified by their first value (tests send ids >= 1; the
# warm-up batches are all zeros). ``log`` holds one (start, end, ids) per batch that is not
# warm-up, in the order run; ``executed`` counts every row run, warm-up included.
PROBE = '''
    import threading
    import time

    import numpy as np


    def _number(p, key):
        return float(p[key]) if key in p else None


    class Model:
        def setup(self, config):
            p = config.parameters
            self.batch_s = float(p.get("batch_ms", 0)) / 1000
            self.row_s = float(p.get("row_ms", 0)) / 1000
            self.fast_warmup = p.get("fast_warmup", "false") == "true"
            self.fail_batch = int(p.get("fail_batch", 0))  # 1-based, warm-up not counted
            self.raise_on = _number(p, "raise_on")
            self.hang_on = _number(p, "hang_on")
            self.hang_s = float(p.get("hang_s", 0))
            self.bad_shape_on = _number(p, "bad_shape_on")
            self.log_file = p.get("log_file")  # for a server in another process
            self.executed = 0
            self.log = []
            self.lock = threading.Lock()

        def predict(self, inputs):
            x = inputs["INPUT0"]
            rows = len(x)
            start = time.monotonic()
            warm = not np.count_nonzero(x)
            if not (warm and self.fast_warmup):
                time.sleep(self.batch_s + self.row_s * rows)
            with self.lock:
                self.executed += rows
            if warm:
                return {"OUTPUT0": x.copy()}
            ids = [float(v) for v in x.reshape(rows, -1)[:, 0]]
            if self.hang_on in ids:
                time.sleep(self.hang_s)
            with self.lock:
                self.log.append((start, time.monotonic(), ids))
                n = len(self.log)
                if self.log_file:
                    with open(self.log_file, "a") as f:
                        f.write(" ".join(map(repr, (start, time.monotonic(), *ids))) + "\\n")
            if n == self.fail_batch or self.raise_on in ids:
                raise RuntimeError(f"injected failure in batch {n}")
            if self.bad_shape_on in ids:
                return {"OUTPUT0": np.concatenate([x, x])}
            return {"OUTPUT0": x.copy()}
'''


def write_probe(
    root: Path,
    name: str = "probe",
    *,
    max_batch_size: int = 8,
    instances: int = 1,
    dynamic: str = "",
    **params: object,
) -> Path:
    """``root/name``: the probe Python model, FP32 INPUT0 [-1] → OUTPUT0 [-1].

    ``dynamic`` goes inside ``dynamic_batching { }``; ``params`` become string parameters
    (``batch_ms``, ``row_ms``, ``fast_warmup``, ``fail_batch``, ``raise_on``, ``hang_on``,
    ``hang_s``, ``bad_shape_on``, ``log_file``, and the server's own: ``batching``,
    ``split_oversized_requests`` ...)."""
    return _write_python_model(root, name, PROBE, max_batch_size, instances, dynamic, params)


def _write_python_model(root: Path, name: str, source: str, max_batch_size: int, instances: int, dynamic: str,
                        params: dict[str, object]) -> Path:
    """``root/name``: the Python model ``source``, FP32 INPUT0 [-1] → OUTPUT0 [-1], with
    ``params`` as string parameters."""
    model_dir = Path(root) / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    parameters = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"dynamic_batching {{ {dynamic} }}\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{parameters}\n"
    )
    return model_dir


def write_identity(
    root: Path,
    name: str,
    datatype: str = "FP32",
    dims: tuple[int, ...] = (-1,),
    *,
    max_batch_size: int = 8,
    instances: int = 1,
    dynamic: str = "",
    parameters: dict[str, str] | None = None,
) -> Path:
    """``root/name``: an ONNX Runtime identity INPUT0 → OUTPUT0 of ``datatype`` and ``dims``."""
    extra = f"dynamic_batching {{ {dynamic} }}\n" if max_batch_size else ""
    extra += f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
    for key, value in (parameters or {}).items():
        extra += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    tensors = [("INPUT0", datatype, dims)], [("OUTPUT0", datatype, dims)]
    return write_model(
        root, name, identity(datatype, dims, batched=max_batch_size > 0),
        config_text(name, *tensors, max_batch_size=max_batch_size, extra=extra),
    )


def probe(srv, name: str = "probe", slot: int = 0):
    """The in-process server's probe instance of ``slot`` (thread isolation)."""
    return srv.registry.get(name).backend.models[slot]


def read_log(path: Path) -> list[tuple[float, float, list[float]]]:
    """The batches a probe in another process logged to ``log_file``: (start, end, ids)."""
    out = []
    for line in Path(path).read_text().splitlines():
        start, end, *ids = map(float, line.split())
        out.append((start, end, ids))
    return out


def logged_ids(model) -> list[float]:
    """Every row id the probe ran (warm-up excluded), in run order."""
    return [i for _, _, ids in list(model.log) for i in ids]


def raw_request(model: str, datatype: str, shape: list[int], data: bytes, *, name: str = "INPUT0",
                request_id: str = "") -> pb.ModelInferRequest:
    """A request with one raw input, exactly as given (no checks on this side)."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


def row(rid: float, n: int = 4, rows: int = 1) -> dict[str, np.ndarray]:
    """FP32 INPUT0 of ``rows`` x ``n``, every value ``rid`` (the probe reads it as the id)."""
    return {"INPUT0": np.full((rows, n), rid, np.float32)}


def error_code(message: pb.ModelStreamInferResponse) -> str:
    """A stream message's status name: "OK", or its ``error_code`` parameter."""
    if not message.error_message:
        return "OK"
    params = message.infer_response.parameters
    return params["error_code"].string_param if "error_code" in params else "UNKNOWN"


def stream(stub, requests: Iterable[pb.ModelInferRequest], timeout: float | None = None):
    """Send ``requests`` on one ModelStreamInfer call, half-close, read every answer.

    Returns (messages in arrival order, the stream's final status code)."""
    call = stub.ModelStreamInfer(iter(requests), timeout=timeout)
    messages = []
    try:
        for message in call:
            messages.append(message)
    except grpc.RpcError as exc:
        return messages, exc.code()
    return messages, call.code()


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while not (ok := predicate()) and time.monotonic() < end:
        time.sleep(interval)
    return bool(ok)


# The gate model: like the probe, but every batch of real rows (ids >= 1; the warm-up's are
# zeros) first appends its row ids to ``log_file`` as one line, then waits until ``gate_file``
# exists (at most ``gate_limit_s``, a safety net), then sleeps ``batch_ms``; a warm-up batch
# sleeps ``warmup_ms`` (what the server measures a batch to take: its queue hints' horizon). A test holds the
# running batch for as long as it needs (the queue fills behind it, a client goes away), then
# opens the gate: ordering by events, not by how long a batch takes on a busy machine.
GATE = '''
    import os
    import time

    import numpy as np


    class Model:
        def setup(self, config):
            p = config.parameters
            self.log_file = p["log_file"]
            self.gate_file = p["gate_file"]
            self.limit_s = float(p.get("gate_limit_s", 60))
            self.batch_s = float(p.get("batch_ms", 0)) / 1000
            self.warmup_s = float(p.get("warmup_ms", 0)) / 1000

        def predict(self, inputs):
            x = inputs["INPUT0"]
            if not np.count_nonzero(x):
                time.sleep(self.warmup_s)
            else:
                ids = [float(v) for v in x.reshape(len(x), -1)[:, 0]]
                with open(self.log_file, "a") as f:
                    f.write(" ".join(map(repr, ids)) + "\\n")
                end = time.monotonic() + self.limit_s
                while not os.path.exists(self.gate_file) and time.monotonic() < end:
                    time.sleep(0.002)
                time.sleep(self.batch_s)
            return {"OUTPUT0": x.copy()}
'''


def write_gate(root: Path, name: str, log_file: Path, gate_file: Path, *, max_batch_size: int = 4,
               instances: int = 1, dynamic: str = "", **params: object) -> Path:
    """``root/name``: the gate Python model (see ``GATE``), FP32 INPUT0 [-1] → OUTPUT0 [-1]."""
    return _write_python_model(root, name, GATE, max_batch_size, instances, dynamic,
                               {"log_file": log_file, "gate_file": gate_file, **params})


def gate_batches(log_file: Path) -> list[list[float]]:
    """The row ids of every batch the gate model started, in start order."""
    if not Path(log_file).exists():
        return []
    return [[float(v) for v in line.split()] for line in Path(log_file).read_text().splitlines() if line]


# The dispatcher's own DEADLINE_EXCEEDED messages (trtserve.batching.dispatcher): a request dropped
# from the queue, and one answered while its batch still ran. A test of a server-side deadline sets
# it with the ``timeout`` parameter and gives the gRPC call a far longer deadline, so that the status
# can only come from the server (a client whose own deadline passes makes DEADLINE_EXCEEDED itself).
EXPIRED_IN_QUEUE = "it was not run"
EXPIRED_WHILE_RUNNING = "deadline passed while its batch was still running"
UNMEETABLE = ("takes at least", "even on an idle server")  # refused at admission (front end, engine core)


def deadline_answer(details: str) -> str:
    """Which of the server's DEADLINE_EXCEEDED answers ``details`` is: "queue" (dropped from the
    queue), "running" (answered while its batch ran), "admission" (refused as unmeetable), or
    the text itself when it is none of them (not the server's)."""
    if EXPIRED_IN_QUEUE in details:
        return "queue"
    if EXPIRED_WHILE_RUNNING in details:
        return "running"
    return "admission" if any(m in details for m in UNMEETABLE) else details


def with_timeout(request: pb.ModelInferRequest, seconds: float) -> pb.ModelInferRequest:
    """``request`` with its ``timeout`` parameter (the server-side deadline) set to ``seconds``."""
    request.parameters["timeout"].int64_param = round(seconds * 1e6)
    return request


def timed_call(stub, request: pb.ModelInferRequest, timeout: float = 60.0):
    """One ModelInfer with a gRPC deadline of ``timeout`` s: (code, response or details, seconds)."""
    t0 = time.monotonic()
    try:
        response = stub.ModelInfer(request, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", time.monotonic() - t0
    return grpc.StatusCode.OK, response, time.monotonic() - t0




def deadline_exceeded(srv, model: str) -> dict[str, float]:
    """``trtserve_deadline_exceeded_total`` of ``model`` by ``when`` (``before_run``: dropped from
    the queue or refused at admission; ``finished_late``: answered while its batch ran), from the
    metrics endpoint of an in-process server started with ``metrics_port=0``."""
    metrics = scrape(srv.metrics_at())
    return {when: metrics.get(("trtserve_deadline_exceeded_total", (("model", model), ("when", when))), 0.0)
            for when in ("before_run", "finished_late")}
