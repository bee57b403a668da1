"""The unchanged tritonclient's model control calls against ``trtserve serve`` in explicit mode:
load_model (with a config override), unload_model, get_model_repository_index; and their
refusal in the default mode (none)."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from trtserve.testing import ServerProcess


@pytest.fixture(scope="module")
def explicit_url(tmp_path_factory, engines):
    root = tmp_path_factory.mktemp("repository")
    for name in ("tiny", "identity_fp32"):
        shutil.copytree(engines / name, root / name)
    with ServerProcess(root, "--frontends", "2", "--model-control-mode", "explicit", "--load-model", "tiny") as server:
        yield server.url


def states(client: tc.InferenceServerClient) -> dict[str, tuple[str, str]]:
    index = client.get_model_repository_index(as_json=True)["models"]
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in index}


def infer_identity(client: tc.InferenceServerClient) -> np.ndarray:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = tc.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")


def test_load_unload_and_the_index(explicit_url):
    c = tc.InferenceServerClient(explicit_url)
    assert states(c) == {"tiny": ("READY", ""), "identity_fp32": ("UNAVAILABLE", "not loaded")}
    assert c.is_server_ready() and not c.is_model_ready("identity_fp32")
    c.load_model("identity_fp32")
    assert states(c)["identity_fp32"] == ("READY", "")
    assert c.is_model_ready("identity_fp32")
    np.testing.assert_array_equal(infer_identity(c), np.arange(4, dtype=np.float32).reshape(1, 4))
    c.unload_model("identity_fp32")
    assert states(c)["identity_fp32"] == ("UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException) as err:
        infer_identity(c)
    assert "StatusCode.UNAVAILABLE" in str(err.value.status())


def test_load_with_a_config_override(explicit_url):
    c = tc.InferenceServerClient(explicit_url)
    config = c.get_model_config("tiny", as_json=True)["config"]
    config["max_batch_size"] = 8
    c.load_model("tiny", config=json.dumps(config))
    assert c.get_model_config("tiny").config.max_batch_size == 8
    config["optimization"] = {"priority": "PRIORITY_MAX"}
    with pytest.raises(InferenceServerException) as err:
        c.load_model("tiny", config=json.dumps(config))
    assert "optimization" in err.value.message()
    assert c.get_model_config("tiny").config.max_batch_size == 8  # the failed reload changed nothing
    c.load_model("tiny")
    assert c.get_model_config("tiny").config.max_batch_size == 64


def test_load_and_unload_are_refused_in_mode_none(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    for call in (c.load_model, c.unload_model):
        with pytest.raises(InferenceServerException) as err:
            call("tiny")
        assert "model control mode 'none'" in err.value.message()
        assert "StatusCode.UNAVAILABLE" in str(err.value.status())
    assert c.is_model_ready("tiny")


def test_a_model_removed_after_its_unload_is_not_found(tmp_path, engines):
    """Explicit mode: unload a model, then delete its directory: it leaves RepositoryIndex and a
    request for it is NOT_FOUND (as for any unknown name), not UNAVAILABLE "unloaded"."""
    root = tmp_path / "repository"
    for name in ("tiny", "identity_fp32"):
        shutil.copytree(engines / name, root / name)
    with ServerProcess(root, "--frontends", "2", "--model-control-mode", "explicit", "--load-model", "*") as server:
        c = tc.InferenceServerClient(server.url)
        c.unload_model("identity_fp32")
        shutil.rmtree(root / "identity_fp32")

        def status() -> str:
            try:
                infer_identity(c)
            except InferenceServerException as exc:
                return str(exc.status())
            return "OK"

        deadline = time.monotonic() + 30  # the engine core looks for removed models every second
        while (code := status()) == "StatusCode.UNAVAILABLE" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert code == "StatusCode.NOT_FOUND"
        assert states(c) == {"tiny": ("READY", "")}
        with pytest.raises(InferenceServerException) as err:
            c.load_model("identity_fp32")
        assert "StatusCode.NOT_FOUND" in str(err.value.status())
