"""The harness behind its `bench` extra: a harness command without it says so in one line, and
the rest of the command line still works (the CLI imports a harness module only when chosen)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"

# aiohttp made unimportable, as where the `bench` extra is not installed.
WITHOUT_AIOHTTP = ("import sys; sys.modules['aiohttp'] = None; "
                   "from trtserve.cli import main; sys.exit(main(sys.argv[1:]))")


def trtserve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SERVICE)}
    return subprocess.run([sys.executable, "-c", WITHOUT_AIOHTTP, *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_bench_without_its_extra_is_one_line_naming_the_extra():
    done = trtserve("bench", "--help")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "trtserve bench: needs the bench extra (pip install 'trtserve[bench]'): import of aiohttp halted; "
        "None in sys.modules"
    ]


@pytest.mark.parametrize("command", ["serve", "simulate", "check"])
def test_other_commands_do_not_import_the_bench_dependencies(command):
    done = trtserve(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: trtserve {command}")
