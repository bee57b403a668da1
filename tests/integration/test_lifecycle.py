"""Model lifecycle against a real server (issue 18): version policies, several versions served at
once, model control modes (explicit load/unload with a config override, poll), a reload under
steady load with no failed request, an unload that drains, readiness.

Repositories are copies of the built test models in ``tmp_path``. Waits are on state (the
index, a version answering), with a generous limit, never on a fixed time.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import Client, build_request
from trtserve.engine.lifecycle import ControlMode, LifecycleConfig
from trtserve.repository import ConfigError, fingerprint, load_specs

ROWS = np.ones((1, 64), np.float32)
if TYPE_CHECKING:
    from typing_extensions import Self

WAIT_S = 60.0


def make_repo(root: Path, engines: Path, models: dict[str, list[int]], policy: dict[str, str] | None = None) -> Path:
    """``root`` holding a copy of each built model with the given version directories (each a
    copy of its version 1), and ``policy[name]`` appended to its config."""
    for name, versions in models.items():
        (root / name).mkdir(parents=True)
        config = (engines / name / "config.pbtxt").read_text()
        (root / name / "config.pbtxt").write_text(config + "\n" + (policy or {}).get(name, ""))
        for handler in (engines / name).glob("handler.py"):
            shutil.copy(handler, root / name)
        for v in versions:
            add_version(root, name, v, engines / name / "1")
    return root


def add_version(root: Path, name: str, version: int, source: Path | None = None) -> None:
    """Add ``root/name/<version>`` atomically (copied beside it, then renamed: a poll never
    sees half a directory)."""
    staging = root / f".{name}-{version}"
    shutil.copytree(source or root / name / "1", staging)
    staging.rename(root / name / str(version))


def infer(client: Client, model: str = "tiny", version: str = "", timeout: float = 30.0) -> pb.ModelInferResponse:
    request = build_request(model, {"INPUT": ROWS})
    request.model_version = version
    return client.stub.ModelInfer(request, timeout=timeout)


def index(client: Client) -> dict[tuple[str, str], tuple[str, str]]:
    response = client.stub.RepositoryIndex(pb.RepositoryIndexRequest())
    return {(m.name, m.version): (m.state, m.reason) for m in response.models}


def wait_for(predicate, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < end, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.05)


def load(client: Client, model: str, parameters: dict[str, str] | None = None) -> None:
    request = pb.RepositoryModelLoadRequest(model_name=model)
    for key, value in (parameters or {}).items():
        request.parameters[key].string_param = value
    client.stub.RepositoryModelLoad(request, timeout=120)


def unload(client: Client, model: str) -> None:
    client.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=model), timeout=120)


EXPLICIT = LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("tiny",))


# -- version policies -----------------------------------------------------------------------

@pytest.mark.parametrize("policy, served", [
    ("", ["3"]),
    ("version_policy { latest { } }", ["3"]),
    ("version_policy { latest { num_versions: 2 } }", ["2", "3"]),
    ("version_policy { all { } }", ["1", "2", "3"]),
    ("version_policy { specific { versions: [ 1, 3 ] } }", ["1", "3"]),
])
def test_version_policy_picks_the_versions_triton_would(tmp_path, engines, policy, served):
    make_repo(tmp_path, engines, {"tiny": [1, 2, 3]}, {"tiny": policy})
    assert [s.version for s in load_specs(tmp_path / "tiny")] == served


def test_a_specific_version_without_its_directory_is_refused_naming_it(tmp_path, engines):
    make_repo(tmp_path, engines, {"tiny": [1, 2]}, {"tiny": "version_policy { specific { versions: [ 2, 7 ] } }"})
    with pytest.raises(ConfigError, match=r"versions \[7\] with no directory"):
        load_specs(tmp_path / "tiny")


def test_several_versions_serve_at_once_each_answering_as_itself(tmp_path, engines, make_server):
    make_repo(tmp_path, engines, {"tiny": [1, 2, 3]}, {"tiny": "version_policy { latest { num_versions: 2 } }"})
    srv = make_server(tmp_path)
    with srv.client() as c:
        assert infer(c).model_version == "3"  # no version: the highest served
        assert infer(c, version="2").model_version == "2"
        with pytest.raises(grpc.RpcError) as err:
            infer(c, version="1")  # in the directory, not served by the policy
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "serving version(s) 2, 3" in err.value.details()
        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="tiny", version="2"))
        assert list(meta.versions) == ["2", "3"]
        assert c.stub.ModelReady(pb.ModelReadyRequest(name="tiny", version="2")).ready
        assert not c.stub.ModelReady(pb.ModelReadyRequest(name="tiny", version="1")).ready
        stats = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="tiny"))
        by_version = {s.version: s.inference_count for s in stats.model_stats}
        assert by_version == {"2": 1, "3": 1}
        only = c.stub.ModelStatistics(pb.ModelStatisticsRequest(name="tiny", version="3"))
        assert [s.version for s in only.model_stats] == ["3"]
        assert set(index(c)) == {("tiny", "2"), ("tiny", "3")}
    dispatchers = {m.dispatcher for m in srv.registry.models["tiny"].versions.values()}
    assert len(dispatchers) == 2  # each version its own dispatcher and slots


def test_a_version_being_copied_in_under_a_hidden_name_is_not_a_change(tmp_path, engines):
    make_repo(tmp_path, engines, {"tiny": [1]})
    model = tmp_path / "tiny"
    before = fingerprint(model)
    shutil.copytree(model / "1", model / ".2")
    assert fingerprint(model) == before
    (model / ".2").rename(model / "2")
    assert fingerprint(model) != before
    assert [path for path, _size, _mtime in fingerprint(model, skip_versions=True)] == ["config.pbtxt"]


# -- model control modes --------------------------------------------------------------------

def test_explicit_mode_loads_only_what_is_asked_then_load_and_unload(tmp_path, engines, make_server):
    make_repo(tmp_path, engines, {"tiny": [1], "identity_fp32": [1]})
    srv = make_server(tmp_path, lifecycle=EXPLICIT)
    with srv.client() as c:
        assert index(c) == {("tiny", "1"): ("READY", ""), ("identity_fp32", ""): ("UNAVAILABLE", "not loaded")}
        with pytest.raises(grpc.RpcError) as err:
            c.infer("identity_fp32", {"INPUT0": np.ones((1, 4), np.float32)})
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        load(c, "identity_fp32")
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        # The core answers once it serves the model and has sent every front end the new table;
        # each builds its part as the table arrives (or on its first request for it).
        for s in srv.services:
            wait_for(lambda s=s: s.table.ready("identity_fp32", ""), "every front end serves the loaded model")
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        unload(c, "tiny")
        assert index(c)[("tiny", "")] == ("UNAVAILABLE", "unloaded")
        with pytest.raises(grpc.RpcError) as err:
            infer(c)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "model 'tiny' is unavailable: unloaded" in err.value.details()
        assert c.is_ready()  # strict readiness counts the models asked for; tiny no longer is
        with pytest.raises(grpc.RpcError) as err:
            load(c, "no_such_model")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        load(c, "tiny")
        assert infer(c).model_version == "1"


def test_load_with_a_config_override_is_honoured_or_refused(tmp_path, engines, make_server):
    make_repo(tmp_path, engines, {"tiny": [1]})
    srv = make_server(tmp_path, lifecycle=EXPLICIT)
    config = {
        "name": "tiny", "platform": "onnxruntime_onnx", "max_batch_size": 8,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [16]}],
    }
    with srv.client() as c:
        load(c, "tiny", {"config": json.dumps(config)})
        assert c.stub.ModelConfig(pb.ModelConfigRequest(name="tiny")).config.max_batch_size == 8
        assert srv.registry.get("tiny").dispatcher.policy.max_batch_size == 8
        refused = {
            "unsupported field": ({"config": json.dumps({**config, "sequence_batching": {}})},
                                  grpc.StatusCode.INVALID_ARGUMENT, "sequence_batching"),
            "not JSON": ({"config": "max_batch_size: 4"}, grpc.StatusCode.INVALID_ARGUMENT, "not a model config"),
            "file override": ({"file:1/model.onnx": "x"}, grpc.StatusCode.UNIMPLEMENTED, "repository only"),
            "unknown parameter": ({"colour": "red"}, grpc.StatusCode.INVALID_ARGUMENT, "no parameter 'colour'"),
            # Shapes the model file does not have would load and then fail every request.
            "input dims": ({"config": json.dumps({**config, "input": [{**config["input"][0], "dims": [65]}]})},
                           grpc.StatusCode.INVALID_ARGUMENT,
                           "config input 'INPUT' has dims [65] but the model file has [64]"),
            "output dims": ({"config": json.dumps({**config, "output": [{**config["output"][0], "dims": [17]}]})},
                            grpc.StatusCode.INVALID_ARGUMENT, "config output 'OUTPUT' has dims [17]"),
            "no batch axis": ({"config": json.dumps({**config, "max_batch_size": 0})},
                              grpc.StatusCode.INVALID_ARGUMENT, "has dims [64] but the model file has [-1, 64]"),
        }
        for case, (parameters, code, words) in refused.items():
            with pytest.raises(grpc.RpcError) as err:
                load(c, "tiny", parameters)
            assert (err.value.code(), words in err.value.details()) == (code, True), case
        # A failed reload leaves the served model as it was.
        assert c.stub.ModelConfig(pb.ModelConfigRequest(name="tiny")).config.max_batch_size == 8
        assert infer(c).model_version == "1"
        load(c, "tiny")  # without the override: config.pbtxt again
        assert c.stub.ModelConfig(pb.ModelConfigRequest(name="tiny")).config.max_batch_size == 64


@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.POLL])
def test_load_and_unload_are_refused_outside_explicit_mode(tmp_path, engines, make_server, mode):
    make_repo(tmp_path, engines, {"tiny": [1]})
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(mode=mode, poll_secs=60))
    with srv.client() as c:
        for call in (lambda: load(c, "tiny"), lambda: unload(c, "tiny")):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"model control mode '{mode.value}'" in err.value.details()
        assert infer(c).model_version == "1"


def test_poll_mode_picks_up_an_added_version_and_a_removed_model(tmp_path, engines, make_server):
    make_repo(tmp_path, engines, {"tiny": [1], "identity_fp32": [1]})
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(mode=ControlMode.POLL, poll_secs=0.1))
    with srv.client() as c:
        assert infer(c).model_version == "1"
        add_version(tmp_path, "tiny", 2)
        wait_for(lambda: infer(c).model_version == "2", "tiny version 2 served")
        assert set(index(c)) == {("tiny", "2"), ("identity_fp32", "1")}  # latest 1: version 1 retired
        shutil.rmtree(tmp_path / "identity_fp32")
        wait_for(lambda: all(name != "identity_fp32" for name, _v in index(c)), "identity_fp32 gone")
        with pytest.raises(grpc.RpcError) as err:
            c.infer("identity_fp32", {"INPUT0": np.ones((1, 4), np.float32)})
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert c.is_ready()


# -- reload and unload under load -----------------------------------------------------------

class SteadyClients:
    """``threads`` clients each sending ``request`` back to back, recording per answer (client
    number, version answered, sent at (perf_counter s), seconds to the answer), and errors."""

    def __init__(self, url: str, request: pb.ModelInferRequest, threads: int = 4) -> None:
        self.url = url
        self.request = request
        self.threads = threads
        self.stop = threading.Event()
        self.results: list[tuple[int, str, float, float]] = []
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, number: int) -> None:
        with Client(self.url) as c:
            while not self.stop.is_set():
                sent = time.perf_counter()
                try:
                    version = c.stub.ModelInfer(self.request, timeout=60).model_version
                except grpc.RpcError as exc:
                    self.errors.append(f"{exc.code().name}: {exc.details()}")
                    continue
                self.results.append((number, version, sent, time.perf_counter() - sent))

    def count(self, version: str) -> int:
        return sum(1 for _n, v, _t, _s in self.results if v == version)

    def switches(self, number: int) -> tuple[str, str, int]:
        """Client ``number``'s first and last version answered and how often it changed."""
        versions = [v for n, v, _t, _s in self.results if n == number]
        return versions[0], versions[-1], sum(1 for a, b in itertools.pairwise(versions) if a != b)

    def longest_across(self, start: float, end: float) -> float:
        """The longest wait (s) of a request in flight at any time between ``start`` and ``end``."""
        return max(s for _n, _v, t, s in self.results if t < end and t + s > start)


def reload_under_load(srv, root: Path, model: str, other: str, request: pb.ModelInferRequest,
                      version_dir: Path | None = None) -> tuple[SteadyClients, float, float]:
    """Clients send ``request`` steadily; version 2 of ``model`` is added and loaded while
    ``other`` is unloaded. Returns the clients (stopped) and when the load began and ended."""
    with srv.client() as c, SteadyClients(srv.url, request) as clients:
        wait_for(lambda: clients.count("1") >= 50, "requests answered before the reload")
        add_version(root, model, 2, version_dir)
        done = []
        unloading = threading.Thread(target=lambda: done.append(unload(c, other)))
        start = time.perf_counter()
        unloading.start()
        load(c, model)  # builds and warms version 2 while version 1 serves
        end = time.perf_counter()
        unloading.join(120)
        assert done, f"the unload of {other} did not finish"
        wait_for(lambda: clients.count("2") >= 50, "requests answered after the reload")
    return clients, start, end


def test_reload_under_steady_load_fails_nothing_and_switches_once(tmp_path, engines, make_server):
    make_repo(tmp_path, engines, {"tiny": [1], "identity_fp32": [1]})
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("*",)))
    request = build_request("tiny", {"INPUT": ROWS})
    clients, start, end = reload_under_load(srv, tmp_path, "tiny", "identity_fp32", request)
    assert clients.errors == []
    for number in range(clients.threads):
        assert clients.switches(number) == ("1", "2", 1), f"client {number}"
    assert srv.registry.models["tiny"].versions.keys() == {"2"}
    print(f"reload under load: {len(clients.results)} requests, 0 failed, "
          f"longest wait across the switch {clients.longest_across(start, end) * 1e3:.1f} ms")


@pytest.mark.timing
def test_reload_gap_of_minilm_under_load(tmp_path, engines, make_server):
    """The measurement docs/benchmarks.md gives: MiniLM (handler and all) reloaded to a new version
    under 4 steady clients while tiny is unloaded; the longest any request waited across the
    switch, against the longest before it. ``pytest -m timing -s -k reload_gap``."""
    make_repo(tmp_path, engines, {"tiny": [1]})
    (tmp_path / "minilm" / "1").mkdir(parents=True)
    for f in (engines / "minilm").glob("*.*"):
        shutil.copy(f, tmp_path / "minilm")
    (tmp_path / "minilm" / "1" / "model.onnx").symlink_to(engines / "minilm" / "1" / "model.onnx")
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("*",)))
    text = np.array([[b"a sentence of an ordinary length, to embed"]], dtype=object)
    clients, start, end = reload_under_load(srv, tmp_path, "minilm", "tiny", build_request("minilm", {"TEXT": text}),
                                            tmp_path / "minilm" / "1")
    assert clients.errors == []
    before = max(s for _n, _v, t, s in clients.results if t + s < start)
    gap = clients.longest_across(start, end)
    print(f"minilm reload: {len(clients.results)} requests, 0 failed, load {end - start:.2f} s, "
          f"longest wait across the switch {gap * 1e3:.0f} ms (longest before it {before * 1e3:.0f} ms)")
    assert gap < 2.0


def test_unload_answers_everything_queued_then_refuses(tmp_path, engines, make_server):
    slower = 'parameters { key: "batch_ms" value: { string_value: "300" } }'  # 3 batches of 8: about 1 s
    make_repo(tmp_path, engines, {"slow": [1], "tiny": [1]}, {"slow": slower})
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(mode=ControlMode.EXPLICIT, load_models=("*",)))
    x = np.ones((1, 4), np.float32)
    outcomes: list[str] = []

    def call() -> None:
        with srv.client() as c:
            try:
                np.testing.assert_array_equal(c.infer("slow", {"INPUT0": x}, timeout=60)["OUTPUT0"], x)
                outcomes.append("OK")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)

    callers = [threading.Thread(target=call) for _ in range(24)]
    for t in callers:
        t.start()
    wait_for(lambda: sum(len(p.pending) for p in srv.core.peers.values()) == 24, "every request queued or running")
    assert len(srv.registry.get("slow").dispatcher.queue.entries) >= 8
    with srv.client() as c:
        unload(c, "slow")  # answered once everything queued has been answered
        assert len(outcomes) == 24
        with pytest.raises(grpc.RpcError) as err:
            c.infer("slow", {"INPUT0": x})
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    for t in callers:
        t.join(60)
    assert outcomes == ["OK"] * 24


# -- readiness ------------------------------------------------------------------------------

@pytest.mark.parametrize("strict", [True, False])
def test_readiness_with_a_broken_model_follows_strict_readiness(tmp_path, engines, make_server, strict):
    make_repo(tmp_path, engines, {"tiny": [1]})
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text("name: 'broken' max_batch_size: 4 optimization { }")
    (tmp_path / "broken" / "1").mkdir()
    srv = make_server(tmp_path, lifecycle=LifecycleConfig(strict_readiness=strict))
    with srv.client() as c:
        assert c.is_ready() is not strict
        health = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(service=""))
        serving = health.status == health_pb2.HealthCheckResponse.SERVING
        assert serving is not strict
        assert infer(c).model_version == "1"  # the other model serves either way


# -- memory -----------------------------------------------------------------------------------

EMBED_CONFIG = """name: "embed"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] } ]
"""


def rss_bytes() -> int:
    """This process's resident set (the server runs in it), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_unload_returns_the_memory_of_the_model(tmp_path, engines, make_server):
    """MiniLM's engine (90 MB of weights) without its handler: loading it grows the RSS by
    its session; unloading brings it back near the level before. A first load and unload
    goes before the baseline, so that what stays for good (ONNX Runtime's own start-up, the
    thread pools) is not counted as the model's."""
    make_repo(tmp_path, engines, {"tiny": [1]})
    (tmp_path / "embed" / "1").mkdir(parents=True)
    (tmp_path / "embed" / "config.pbtxt").write_text(EMBED_CONFIG)
    (tmp_path / "embed" / "1" / "model.onnx").symlink_to(engines / "minilm" / "1" / "model.onnx")
    srv = make_server(tmp_path, lifecycle=EXPLICIT)
    with srv.client() as c:
        load(c, "embed")
        unload(c, "embed")
        before = rss_bytes()
        load(c, "embed")
        loaded = rss_bytes()
        unload(c, "embed")
        after = rss_bytes()
    mib = 1 << 20
    print(f"RSS: before load {before / mib:.0f} MiB, loaded {loaded / mib:.0f} MiB, after unload {after / mib:.0f} MiB")
    grown = loaded - before
    assert grown > 40 * mib, f"loading MiniLM grew the RSS by only {grown / mib:.0f} MiB"
    assert after - before < 0.5 * grown, (before / mib, loaded / mib, after / mib)


# -- flags --------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, words", [
    (["--load-model", "tiny"], "--load-model needs --model-control-mode explicit"),
    (["--model-control-mode", "explicit", "--load-model", "nosuch"], "--load-model nosuch: no such model"),
    (["--repository-poll-secs", "5"], "--repository-poll-secs needs --model-control-mode poll"),
    (["--model-control-mode", "poll", "--repository-poll-secs", "0"], "must be a number of seconds > 0"),
])
def test_lifecycle_flags_that_cannot_be_honoured_are_refused_at_start(tmp_path, engines, capsys, flags, words):
    from trtserve.cli import main

    make_repo(tmp_path, engines, {"tiny": [1]})
    assert main(["serve", "--model-repository", str(tmp_path), "--port", "0", *flags]) == 2
    assert words in capsys.readouterr().err


def test_strict_readiness_flag_takes_true_or_false(engines):
    from trtserve.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["serve", "--strict-readiness", "false"]).strict_readiness is False
    assert parse(["serve"]).strict_readiness is True
    with pytest.raises(SystemExit):
        parse(["serve", "--strict-readiness", "maybe"])


def test_one_process_server_loads_and_unloads_too(tmp_path, engines):
    """``trtserve serve --frontends 1`` (the default on 2 cores): the front end calls the
    engine core in its own process, and follows its table the same way."""
    from trtserve.testing import ServerProcess

    make_repo(tmp_path, engines, {"tiny": [1], "identity_fp32": [1]})
    flags = ("--frontends", "1", "--model-control-mode", "explicit", "--load-model", "tiny")
    with ServerProcess(tmp_path, *flags) as server, Client(server.url) as c:
        load(c, "identity_fp32")
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        np.testing.assert_array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        add_version(tmp_path, "tiny", 2)
        load(c, "tiny")
        assert infer(c).model_version == "2"
        unload(c, "identity_fp32")
        assert index(c) == {("tiny", "2"): ("READY", ""), ("identity_fp32", ""): ("UNAVAILABLE", "unloaded")}
        assert c.is_ready()
