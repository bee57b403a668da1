"""``trtserve serve`` (HTTP on by default) as a child process, one front end (in process) and two
(the process tree): the HTTP door answers ``tritonclient.http`` as the gRPC door answers;
SIGTERM drains it (a request admitted before the signal is answered 200, new ones are refused
503, the process exits 0); uvicorn logs in the server's format; an HTTP port without the door, or
an HTTP or metrics port in use, stops with one sentence (exit 2); the doors and ports are
Triton's by default. HTTPS: ``test_http_tls.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from integration.helpers import write_gate
from trtserve.client import Client
from trtserve.testing import ServerProcess


@pytest.fixture
def repo(engines, tmp_path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny").symlink_to(engines / "tiny", target_is_directory=True)
    return root


def request(url: str, method: str, path: str, body: str | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def gate_body(x: np.ndarray) -> str:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]})


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_http_infer_and_sigterm_drain(repo, frontends):
    started, release = write_gate(repo)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    held_x = np.array([[7.0, 0.25, -3.0]], np.float32)
    with ServerProcess(repo, "--frontends", frontends, "--allow-http", "true", "--http-port", "0",
                       "--grace-period", "60") as srv:
        url = srv.http_url
        assert url, "no 'trtserve HTTP on HOST:PORT' line:\n" + "".join(srv.output)
        c = th.InferenceServerClient(url)
        try:
            assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("tiny")
            assert c.get_model_metadata("tiny")["inputs"][0]["shape"] == [-1, 64]
            tensor = th.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            got = c.infer("tiny", [tensor]).as_numpy("OUTPUT")
        finally:
            c.close()
        with Client(srv.url) as g:
            assert got.tobytes() == g.infer("tiny", {"INPUT": x})["OUTPUT"].tobytes()

        # A request admitted (running in the model) when SIGTERM comes.
        held: dict[str, object] = {}
        thread = threading.Thread(target=lambda: held.update(answer=request(url, "POST", "/v2/models/gate/infer",
                                                                               gate_body(held_x))), daemon=True)
        thread.start()
        end = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < end and thread.is_alive(), "the held request never reached the model"
            time.sleep(0.01)
        os.kill(srv.pid, signal.SIGTERM)
        try:
            # New requests are refused 503 once the front end that takes them drains (with two,
            # one may take a request before its signal arrives: that one is answered, and asked again).
            refused = None
            end = time.monotonic() + 60
            while refused is None and time.monotonic() < end:
                try:
                    status, headers, body = request(url, "POST", "/v2/models/tiny/infer", json.dumps(
                        {"inputs": [{"name": "INPUT", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}))
                except ConnectionError:  # a front end that finished draining closed the connection
                    continue
                if status == 503:
                    refused = headers, json.loads(body)
                else:
                    assert status == 200, body
            assert refused is not None, "no request was refused while draining"
            headers, doc = refused
            assert headers.get("retry-after") == "1" and "shutting down" in doc["error"]
            if frontends == "1":  # one door: ready drops, live stays while the held request runs
                assert request(url, "GET", "/v2/health/ready")[0] == 503
                assert request(url, "GET", "/v2/health/live")[0] == 200
            assert "answer" not in held  # still held: what was admitted is being waited for
        finally:
            release.touch()
        thread.join(120)
        status, _, body = held["answer"]  # type: ignore[misc]
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == held_x.reshape(-1).tolist()
        exit_code = srv.proc.wait(60)
        assert srv.output_closed.wait(30)
    output = "".join(srv.output)
    assert exit_code == 0, output
    assert "Traceback" not in output, output


def test_an_http_port_without_the_http_door_exits_2_with_one_sentence(repo):
    done = subprocess.run(
        [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(repo), "--port", "0",
         "--allow-http", "false", "--http-port", "8123"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "--http-port 8123 needs --allow-http true" in message, message


def serve_with_a_taken_port(repo, *flags: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """``trtserve serve`` with ``flags``, where ``{port}`` in a flag is a port another socket holds.
    Returns (the finished command, that port)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(repo), "--port", "0",
             "--frontends", "1", *(f.format(port=port) for f in flags)],
            capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    return done, port


def test_an_http_port_in_use_exits_2_naming_it(repo):
    done, port = serve_with_a_taken_port(repo, "--allow-http", "true", "--http-port", "{port}", "--metrics-port", "0")
    assert f"cannot listen on 127.0.0.1:{port} (HTTP)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_metrics_port_in_use_exits_2_naming_it(repo):
    done, port = serve_with_a_taken_port(repo, "--http-port", "0", "--metrics-port", "{port}")
    message = done.stderr.strip()
    assert "\n" not in message and f"cannot listen on 127.0.0.1:{port} (metrics)" in message, message


@pytest.mark.parametrize("flags, ports", [
    ([], (8001, 8000, 8002)),
    (["--allow-http", "false", "--allow-metrics", "false"], (8001, None, None)),
    (["--port", "9001", "--http-port", "9000", "--metrics-port", "0"], (9001, 9000, 0)),
])
def test_the_doors_and_ports_are_tritons_by_default(repo, monkeypatch, flags, ports):
    """Triton listens on gRPC 8001, HTTP 8000 and metrics 8002 unless told otherwise, with
    ``--allow-http`` and ``--allow-metrics`` turning a door off: so does ``trtserve serve``."""
    from trtserve import cli
    from trtserve.serving import supervisor

    served = []
    monkeypatch.setattr(supervisor, "serve", lambda config: served.append(config) or 0)
    for name in ("TRTSERVE_PORT", "TRTSERVE_HTTP_PORT", "TRTSERVE_METRICS_PORT", "TRTSERVE_ALLOW_HTTP",
                 "TRTSERVE_ALLOW_METRICS"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["serve", "--model-repository", str(repo), *flags]) == 0
    (config,) = served
    assert (config.port, config.http_port, config.metrics_port) == ports


def test_uvicorn_logs_in_the_servers_log_format(repo):
    """uvicorn's own lines (here: a request it cannot parse) go through ``--log-format json``
    as every other line does, not uvicorn's default text format."""
    with ServerProcess(repo, "--frontends", "1", "--allow-http", "true", "--http-port", "0",
                       env={**os.environ, "TRTSERVE_LOG_FORMAT": "json"}) as srv:
        host, port = srv.http_url.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        assert srv.stop() == 0
    lines = [line for line in srv.output if "Invalid HTTP request" in line]
    assert lines, "".join(srv.output)
    for line in lines:
        assert json.loads(line)["level"] == "WARNING", line
