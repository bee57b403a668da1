"""The GPU check's package list covers the server: a dependency of the ``server`` extra that
tests/gpu/requirements.txt does not name is neither carried to the GPU machine nor known to be
there, and the first server the check starts dies on its import (as ``redis`` once did)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_every_server_dependency_is_named_in_the_gpu_requirements():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["server"]}
    lines = (ROOT / "tests" / "gpu" / "requirements.txt").read_text().splitlines()
    named = {_name(line) for line in lines if line.strip() and not line.lstrip().startswith("#")}
    assert needed - named == set()
