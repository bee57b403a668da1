"""The bench's peers run scripts by path out of ``harness/benchlib`` (the Infinity peer's server, in
a venv without trtserve), so that folder is first on their ``sys.path``: a module there named like a
standard-library module shadows it in the peer. ``benchlib/queue.py`` did: uvicorn's ``import
queue`` (through ``logging.handlers``) got the bench's queue mode, and the Infinity peer died
importing redis."""

from __future__ import annotations

import sys
from pathlib import Path

import trtserve.harness.benchlib as benchlib


def test_no_benchlib_module_shadows_the_standard_library():
    names = {p.stem for p in Path(benchlib.__file__).parent.glob("*.py")}
    assert names & set(sys.stdlib_module_names) == set()
