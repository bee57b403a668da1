"""The unchanged tritonclient[grpc] from PyPI against trtserve."""

from __future__ import annotations

import queue
import sys

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException


def test_trtserve_protos_are_not_imported_here():
    assert not any(name.startswith("trtserve._proto") for name in sys.modules)


def test_health_metadata_and_config(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("tiny")
    assert not c.is_model_ready("no_such_model")
    meta = c.get_model_metadata("tiny", as_json=True)
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": ["-1", "16"]}]
    config = c.get_model_config("tiny").config
    assert config.max_batch_size == 64 and list(config.input[0].dims) == [64]
    server = c.get_server_metadata()
    assert server.name == "trtserve"


def test_infer_and_async_infer(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    inp = tc.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = c.infer("identity_fp32", [inp], outputs=[tc.InferRequestedOutput("OUTPUT0")], client_timeout=10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    done: queue.Queue = queue.Queue()
    c.async_infer("identity_fp32", [inp], callback=lambda result, error: done.put((result, error)))
    r, e = done.get(timeout=10)
    assert e is None
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_bytes_infer(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    x = np.array([["hello", "wörld", ""]], dtype=object)
    inp = tc.InferInput("INPUT0", list(x.shape), "BYTES")
    inp.set_data_from_numpy(x)
    out = c.infer("echo_bytes", [inp]).as_numpy("OUTPUT0")
    assert [v.decode() for v in out.reshape(-1)] == ["hello", "wörld", ""]


def test_invalid_argument_reaches_tritonclient(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    inp = tc.InferInput("INPUT", [64], "FP32")  # no batch dimension
    inp.set_data_from_numpy(np.ones(64, np.float32))
    with pytest.raises(InferenceServerException) as err:
        c.infer("tiny", [inp])
    assert "StatusCode.INVALID_ARGUMENT" in str(err.value.status())
    assert "[-1, 64]" in err.value.message()


def test_async_stream_infer(trtserve_url):
    c = tc.InferenceServerClient(trtserve_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    sent = {}
    for i in range(200):
        x = np.full((1, 1 + i % 5), i, dtype=np.float32)
        inp = tc.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        c.async_stream_infer("identity_fp32", [inp], request_id=str(i))
        sent[str(i)] = x
    bad = tc.InferInput("INPUT0", [1, 2], "INT32")
    bad.set_data_from_numpy(np.ones((1, 2), np.int32))
    c.async_stream_infer("identity_fp32", [bad], request_id="bad")
    got, errors = {}, []
    for _ in range(201):
        r, e = results.get(timeout=30)
        if e is not None:
            errors.append(e)
        else:
            got[r.get_response().id] = r.as_numpy("OUTPUT0")
    c.stop_stream()
    assert sorted(got) == sorted(sent)
    for key, x in sent.items():
        np.testing.assert_array_equal(got[key], x)
    assert len(errors) == 1 and "INT32" in errors[0].message()
