"""Compatibility tests: the unchanged tritonclient against a trtserve process.

This directory runs in a pytest process of its own (see the Makefile): tritonclient's
generated modules register the same protobuf symbols (``inference.*``) as trtserve's, so the
two cannot be imported into one process. The server is a real ``trtserve serve`` child
process on 127.0.0.1 with an ephemeral port (``trtserve.testing`` imports no protobuf module).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtserve.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def trtserve_url():
    with ServerProcess(ROOT / "engines", "--frontends", "2") as server:
        yield server.url
