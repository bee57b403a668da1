"""The benchmark's peer server: NVIDIA PyTriton (Triton Inference Server) on the same
model files, set up in a virtual environment of its own under the bench's output directory.

The environment is created once (``python -m venv``, then ``pip install``) and reused while
its package list is unchanged; the server itself is :mod:`.pytriton_server`, started as a
:class:`~trtserve.testing.child_server.ChildServer` so that tritonserver and its Python workers
go with it.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import trtserve
from trtserve.spec import ModelSpec
from trtserve.testing import ChildServer

PEERS = ("triton", "infinity")
"""Peers ``trtserve bench --peer`` knows: ``triton`` here, ``infinity`` in :mod:`.infinity`."""
REQUIREMENTS = ("nvidia-pytriton", "onnxruntime", "numpy", "tokenizers", "ml_dtypes", "protobuf")
"""The peer's packages (PyPI): PyTriton (which ships tritonserver), ONNX Runtime, and what
the trtserve modules it imports need (repository, handlers, ``pack``)."""
MAX_QUEUE_DELAY_US = 100
"""Triton's dynamic batcher: longest wait for more requests (µs), the small delay Triton's
documentation starts from."""
SETUP_TIMEOUT_S = 900.0
START_TIMEOUT_S = 180.0


class PeerSetupError(RuntimeError):
    """The peer's environment could not be made (the message holds pip's last lines)."""


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path, requirements: Sequence[str] = REQUIREMENTS) -> Path:
    """A peer's virtual environment at ``venv`` with the PyPI ``requirements`` (pip
    specifiers; created and installed if missing or its package list changed); returns its
    ``python``.

    Raises:
        PeerSetupError: venv or pip failed.
    """
    stamp = venv / ".trtserve-peer"
    wanted = "\n".join(requirements)
    if stamp.is_file() and stamp.read_text() == wanted and _python(venv).exists():
        return _python(venv)
    print(f"peer: setting up {venv} (pip install {' '.join(requirements)}; once)", flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [
        [base, "-m", "venv", "--clear", str(venv)],
        [str(_python(venv)), "-m", "pip", "install", "-q", *requirements],
    ]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise PeerSetupError(f"peer set-up failed: {' '.join(cmd[:4])} ... exited {done.returncode}:\n{tail}")
    stamp.write_text(wanted)
    return _python(venv)


def _package_path(work: Path) -> Path:
    """A directory holding only a link to the ``trtserve`` package: the peer imports it
    without the rest of this environment's site-packages (whose numpy is not the peer's)."""
    path = work / "path"
    path.mkdir(parents=True, exist_ok=True)
    link = path / "trtserve"
    target = Path(trtserve.__file__).resolve().parent
    if link.is_symlink() and link.resolve() != target:
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(target, target_is_directory=True)
    return path


def triton_peer(work: Path, specs: Sequence[ModelSpec]) -> ChildServer:
    """PyTriton serving the models of ``specs``, set up under ``work`` (a ``with``
    block starts it; the venv is made first, which may take a minute the first time).

    Raises:
        PeerSetupError: the venv could not be made.
    """
    work = work.resolve()
    python = ensure_venv(work / "venv")
    env = {**os.environ, "PYTHONPATH": str(_package_path(work))}
    specs_file = work / "models.pickle"
    # The raw parsed config (a protobuf message) stays behind: the peer cannot import it.
    specs_file.write_bytes(pickle.dumps([dataclasses.replace(s, config=None) for s in specs]))
    cmd = [str(python), "-m", f"{__package__}.pytriton_server", str(work / "workspace"), str(MAX_QUEUE_DELAY_US),
           str(specs_file)]
    return ChildServer(cmd, env=env, start_timeout=START_TIMEOUT_S, name="the Triton peer (PyTriton)")
