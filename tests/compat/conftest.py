"""Compatibility tests: the unchanged tritonclient against a trtserve process.

This directory runs in a pytest process of its own (see the Makefile): tritonclient's
generated modules register the same protobuf symbols (``inference.*``) as trtserve's, so the
two cannot be imported together. The server is a real ``trtserve serve`` subprocess on
127.0.0.1 with an ephemeral port.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_trtserve(repository: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start ``python -m trtserve serve --port 0`` and return (process, "127.0.0.1:PORT")."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtserve", "serve", "--model-repository", str(repository), "--host", "127.0.0.1", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"listening on ([\d.]+):(\d+)", line)
        if match:
            return proc, f"{match.group(1)}:{match.group(2)}"
    proc.kill()
    raise RuntimeError("trtserve did not start:\n" + "".join(lines))


@pytest.fixture(scope="session")
def trtserve_url():
    proc, url = start_trtserve(ROOT / "engines")
    yield url
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
