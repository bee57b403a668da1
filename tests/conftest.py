"""Shared fixtures. trtserve is imported lazily: tests/compat runs in its own process with
tritonclient, whose protobuf symbols clash with trtserve's generated modules."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
