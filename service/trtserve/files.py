"""Crash-safe file writes for build outputs (ONNX hashes, TensorRT plans and sidecars, configs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | memoryview, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one:
    a temp file in the same directory, fsync, ``chmod mode`` (``mkstemp`` creates 0600, and the
    server may run as another user), then ``os.replace`` (atomic on POSIX). Creates the parent
    directory. On any error the temp file is removed and the error re-raised (``OSError``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
