"""clients/python/tritonclient_example.py, run as its own process against the compat server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tritonclient_example_runs(trtserve_url):
    done = subprocess.run(
        [sys.executable, str(ROOT / "clients" / "python" / "tritonclient_example.py"), trtserve_url],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100 of 100 ids answered" in done.stdout
