"""A config that leaves max_batch_size to the server (omitted, with dynamic_batching): the
ModelConfig answer, over gRPC and HTTP from a real server, reports the hard limit (the model
file's, else the search ceiling), and the dispatcher batches under a live cap that starts at the
warm-up's knee; a model file with a fixed batch axis bounds both; an explicit max_batch_size is
kept and fixes the cap. (Where the cap starts and how it moves depend on measured run times and
are tested on a fake clock: tests/unit/test_warmup.py, test_batch_cap.py, test_learning.py.)"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.engine.warmup import SEARCH_CEILING
from trtserve.testing.models import config_text, identity, write_model


def chosen_config(name: str, dims: tuple[int, ...], max_batch_size: int | None) -> str:
    """An identity's config with ``max_batch_size`` (None: the line left out)."""
    tensors = [("INPUT0", "FP32", dims)], [("OUTPUT0", "FP32", dims)]
    text = config_text(name, *tensors, max_batch_size=max_batch_size or 0)
    return text if max_batch_size is not None else text.replace("max_batch_size: 0\n", "")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from servers import ServerThread

    root = tmp_path_factory.mktemp("choice")
    write_model(root, "free", identity("FP32", (4,)), chosen_config("free", (4,), None))
    # Exported without a dynamic batch axis: every tensor is [1, 4].
    write_model(root, "one", identity("FP32", (1, 4), batched=False), chosen_config("one", (4,), None))
    write_model(root, "fixed", identity("FP32", (4,)), chosen_config("fixed", (4,), 8))
    with ServerThread(root, frontends=1, http=True) as server:
        yield server


def served_cap(srv, name: str) -> tuple[int, int, bool]:
    """(the served spec's max_batch_size, the dispatcher's cap in force, whether it is live)."""
    model = srv.registry.get(name)
    assert model.dispatcher.policy.max_batch_size == model.spec.policy.max_batch_size
    return model.spec.policy.max_batch_size, model.dispatcher.cap.value, model.dispatcher.cap.live


def reported(srv, name: str) -> tuple[int, int]:
    """ModelConfig's max_batch_size over (gRPC, HTTP)."""
    with srv.client() as c:
        grpc_value = c.stub.ModelConfig(pb.ModelConfigRequest(name=name)).config.max_batch_size
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/{name}/config", timeout=10) as r:
        http_value = json.loads(r.read())["max_batch_size"]
    return grpc_value, http_value


def test_modelconfig_reports_the_hard_limit_and_the_cap_is_live_below_it(srv):
    limit, cap, live = served_cap(srv, "free")
    assert limit == SEARCH_CEILING and 1 <= cap <= limit and live
    assert reported(srv, "free") == (limit, limit)
    # It batches: a request of more rows than the cap is split, and answered whole.
    x = np.arange(4 * (cap + 1), dtype=np.float32).reshape(-1, 4)
    with srv.client() as c:
        np.testing.assert_array_equal(c.infer("free", {"INPUT0": x})["OUTPUT0"], x)


def test_a_fixed_batch_axis_in_the_file_bounds_the_choice(srv):
    assert served_cap(srv, "one") == (1, 1, True)
    assert reported(srv, "one") == (1, 1)


def test_an_explicit_max_batch_size_is_kept(srv):
    assert served_cap(srv, "fixed") == (8, 8, False)
    assert reported(srv, "fixed") == (8, 8)
