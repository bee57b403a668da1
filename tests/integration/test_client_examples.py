"""clients/python/example.py (trtserve.client), run as its own process against a live server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_client_example_runs(server):
    done = subprocess.run(
        [sys.executable, str(ROOT / "clients" / "python" / "example.py"), server.url],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100 of 100 ids answered" in done.stdout
    assert "INVALID_ARGUMENT" in done.stdout
