"""The CPU container image (deploy/container/Containerfile), run with podman as a user would.

Opt-in: runs only with TRTSERVE_IMAGE_TEST=1 (`.ci/run` sets it after `make image`), since it
needs podman and the built image; otherwise every test here is skipped with that reason. The
image is $TRTSERVE_IMAGE (default ``localhost/trtserve:cpu``, what `make image` tags). Each
container publishes its ports on 127.0.0.1 only, on host ports podman picks; tritonclient talks
to it over gRPC and HTTP. Runs in a pytest process of its own (tritonclient; see the Makefile).
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TRTSERVE_IMAGE", "localhost/trtserve:cpu")
READY_TIMEOUT_S = 180.0  # minilm loads in ~2 s on an idle core; a loaded 2-core CI box is slower

pytestmark = pytest.mark.skipif(
    os.environ.get("TRTSERVE_IMAGE_TEST") != "1",
    reason="container image test: set TRTSERVE_IMAGE_TEST=1 (after make image)",
)


def podman(*args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run podman with this repository's containers.conf (unless CONTAINERS_CONF names another)."""
    env = {**os.environ}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "container" / "containers.conf"))
    return subprocess.run(["podman", *args], env=env, check=check, capture_output=True, text=True, timeout=timeout)


@dataclass
class Container:
    name: str
    grpc: str
    http: str
    metrics: str

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr


@contextmanager
def running_container(*options: str) -> Iterator[Container]:
    """A container of IMAGE (with these extra `podman run` options), ready (every model loaded),
    removed afterwards whatever happened."""
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.fail(f"image {IMAGE} does not exist: run `make image` first")
    name = f"trtserve-test-{uuid.uuid4().hex[:8]}"
    # As deploy/k8s runs it: a read-only root file system (podman mounts a tmpfs on /tmp) and the
    # process tree of two front ends. No systemd here to schedule the HEALTHCHECK: the test runs
    # it itself (podman healthcheck run).
    podman("run", "--detach", "--name", name, "--runtime", "runc", "--read-only", "--health-interval", "disable",
           "--env", "TRTSERVE_FRONTENDS=2", *options,
           "-p", "127.0.0.1::8001", "-p", "127.0.0.1::8000", "-p", "127.0.0.1::8002", IMAGE)
    try:
        ports = {p: podman("port", name, f"{p}/tcp").stdout.strip() for p in (8001, 8000, 8002)}
        container = Container(name, grpc=ports[8001], http=ports[8000], metrics=ports[8002])
        wait_ready(container)
        yield container
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def wait_ready(container: Container) -> None:
    client = httpclient.InferenceServerClient(container.http)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        state = podman("inspect", "--format", "{{.State.Status}}", container.name).stdout.strip()
        if state != "running":
            pytest.fail(f"container {state} before ready:\n{container.logs()}")
        try:
            if client.is_server_ready():
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.5)
    pytest.fail(f"container not ready within {READY_TIMEOUT_S:.0f} s:\n{container.logs()}")


def scrape(container: Container) -> dict[str, float]:
    """The container's Prometheus endpoint: sample (``name{labels}``) -> value."""
    with urllib.request.urlopen(f"http://{container.metrics}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


@pytest.fixture(scope="module")
def container() -> Iterator[Container]:
    with running_container() as c:
        yield c


def test_runs_as_non_root_behind_tini(container):
    top = podman("top", container.name, "pid", "user", "args").stdout.splitlines()[1:]
    processes = {int(fields[0]): (fields[1], " ".join(fields[2:])) for fields in (line.split() for line in top)}
    assert processes[1][1].startswith("/usr/bin/tini -- trtserve serve"), processes
    assert {user for user, _ in processes.values()} == {"trtserve"}, processes


def test_health_over_both_doors_and_the_healthcheck(container):
    grpc = grpcclient.InferenceServerClient(container.grpc)
    http = httpclient.InferenceServerClient(container.http)
    assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready("minilm")
    assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("minilm")
    assert podman("healthcheck", "run", container.name, check=False).returncode == 0
    # The baked repository is engines/ less minilm_torch and minilm_pt (torch is not in the image).
    index = {m["name"] for m in http.get_model_repository_index()}
    assert not {"minilm_torch", "minilm_pt"} & index and {"minilm", "tiny", "slow"} <= index


def test_inference_over_grpc_and_http(container):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    g.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(container.grpc).infer("identity_fp32", [g], client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    h = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    h.set_data_from_numpy(x, binary_data=False)
    result = httpclient.InferenceServerClient(container.http).infer("identity_fp32", [h])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"a container serves this"]], dtype=object))
    embedding = httpclient.InferenceServerClient(container.http).infer("minilm", [text]).as_numpy("EMBEDDING")
    assert embedding.shape == (1, 384) and abs(float(np.linalg.norm(embedding)) - 1.0) < 1e-4


def test_a_repository_mounted_read_only_replaces_the_baked_one(tmp_path):
    """The other way to give the image its models: a directory mounted read-only at /models.
    The server runs as uid 10001, so the files must be readable by it (`make engine` writes
    some 0600: the copy is made world-readable, as docs/deploy.md says)."""
    repository = tmp_path / "models"
    shutil.copytree(ROOT / "engines" / "identity_fp32", repository / "identity_fp32",
                    ignore=shutil.ignore_patterns("build.py", "__pycache__"))
    for path in [repository, *repository.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    with running_container("--volume", f"{repository}:/models:ro") as container:
        http = httpclient.InferenceServerClient(container.http)
        assert [m["name"] for m in http.get_model_repository_index()] == ["identity_fp32"]
        x = np.ones((1, 3), dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)


def test_sigterm_answers_queued_work_then_exits_0():
    """SIGTERM to the container (what `podman stop`, `docker stop` and the kubelet send) reaches
    the server through tini: requests already queued are answered, then the exit status is 0."""
    requests = 200  # `slow` runs 8 rows in 28 ms: ~5 s of queued work
    with running_container() as container:
        client = grpcclient.InferenceServerClient(container.grpc)
        answers: queue.Queue = queue.Queue()
        sent = []
        for i in range(requests):
            x = np.full((1, 4), i, dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            client.async_infer("slow", [inp], callback=lambda result, error, i=i: answers.put((i, result, error)),
                               client_timeout=120)
            sent.append(x)
        # SIGTERM once every request is admitted (in progress: queued or running) and some are
        # queued; a request still on its way when the drain begins is refused UNAVAILABLE instead.
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(container)
            admitted = samples["trtserve_inflight_requests"] + answers.qsize()
            queued = sum(v for k, v in samples.items() if k.startswith("trtserve_queue_depth{") and 'model="slow"' in k)
            if admitted == requests and queued > 0:
                break
            assert answers.qsize() < requests, "every request was answered before the drain could begin"
            assert time.monotonic() < deadline, f"{admitted:.0f} of {requests} requests admitted within 60 s"
            time.sleep(0.02)
        podman("kill", "--signal", "TERM", container.name)
        got = [answers.get(timeout=120) for _ in range(requests)]
        errors = [(i, str(error)) for i, _, error in got if error is not None]
        assert not errors, errors[:5]
        for i, result, _ in got:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent[i])
        status = podman("wait", container.name, timeout=60).stdout.strip()
        logs = container.logs()
        assert status == "0", logs
        assert "draining" in logs and "stopped" in logs, logs
