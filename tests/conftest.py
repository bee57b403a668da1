"""Shared fixtures.

trtserve is imported lazily here: tests/compat runs in a process of its own with tritonclient,
whose generated protobuf modules register the same ``inference.*`` symbols as trtserve's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ENGINES = Path(__file__).resolve().parent.parent / "engines"


@pytest.fixture(scope="session")
def loadgen_binary() -> Path:
    """The Go open-loop load generator, built by `make loadgen`. Skipped while it is not built
    (`make test` runs before CI installs Go); `clients/run_all.sh go` sets
    TRTSERVE_REQUIRE_LOADGEN=1, which turns that skip into a failure."""
    from trtserve.harness.benchlib.goclient import LOADGEN, unavailable_reason

    reason = unavailable_reason(LOADGEN)
    if reason is not None:
        if os.environ.get("TRTSERVE_REQUIRE_LOADGEN") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return LOADGEN


@pytest.fixture(scope="session")
def engines() -> Path:
    """The project's model repository, built by `make engine`."""
    missing = [m for m in ("tiny", "identity_fp32", "echo_bytes") if not (ENGINES / m / "1" / "model.onnx").exists()]
    assert not missing, f"models {missing} are not built: run `make engine` first"
    return ENGINES


@pytest.fixture(scope="session")
def server(engines):
    """A real trtserve on 127.0.0.1 (ephemeral port) serving engines/, shared by the session."""
    from servers import ServerThread

    with ServerThread(engines) as srv:
        yield srv


@pytest.fixture
def make_server():
    """Start real servers over other repositories (e.g. tmp_path); stopped after the test."""
    from servers import ServerThread

    started: list[ServerThread] = []

    def start(root: Path, **kw) -> ServerThread:
        srv = ServerThread(root, **kw).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
