"""The contract between front ends and the engine core (trtserve/ipc): every message kind
survives its header encoding, tensors cross as raw frames (never pickled), specs and queue
hints cross whole, errors keep their class, and every query has its answer in the engine core."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtserve import errors
from trtserve.config import BatchingPolicy, QueuePolicy
from trtserve.datatypes import DATATYPES
from trtserve.engine.queries import CoreQueries
from trtserve.ipc import framing
from trtserve.ipc.admission import Ask, QueueHint, transport_deadline_of
from trtserve.ipc.messages import (
    CLASS_OF,
    KIND_OF,
    Cancel,
    Error,
    Hello,
    Infer,
    Kind,
    ModelState,
    Outcome,
    Query,
    Records,
    Reply,
    Result,
    Table,
    TableEntry,
    decode,
    encode,
    pickled,
    spec_in,
    spec_out,
    unpickled,
)
from trtserve.ipc.queries import EngineQuery, Statistics
from trtserve.spec import ModelSpec, TensorSpec

HINT = QueueHint(0.002, BatchingPolicy(max_batch_size=8, default_queue=QueuePolicy(default_timeout=0.5)), 12.5,
                 ((1, 13.0, 13.1),), ((1, 14.0),))
SAMPLES = [
    Hello(4242, 3),
    Infer(7, "minilm", "", Ask(2, 0.25, math.inf, 12.5), ((("TEXT", "BYTES", (2, 1)),),)),
    Cancel(7),
    Records(5, (Outcome("tiny", "OK", 0.004, None, False), Outcome("_unknown", "NOT_FOUND", 0.0001, None, False),
                Outcome("tiny", "RESOURCE_EXHAUSTED", 0.0002, "queue_full", False)), {"tiny": 2}),
    Query(8, Statistics("tiny", "1")),
    Table(True, False, True, (TableEntry("broken", ModelState.UNAVAILABLE, "no version directory", ()),)),
    Result(7, 100.5, ((("EMBEDDING", "<f4", (2, 384)),),), "1", "minilm", pickled(HINT)),
    Error(9, errors.ErrorCode.QUEUE_FULL, "the queue of model 'tiny' is full", "tiny", pickled(HINT)),
    Error(10, errors.ErrorCode.MODEL_NOT_FOUND, "unknown model 'nope'"),
    Reply(8, b"\x0a\x04tiny"),
    Reply(11, "failed to load model 'x': no config", errors.ErrorCode.INVALID_REQUEST),
]


def test_every_kind_has_one_class_and_a_sample_here():
    assert set(KIND_OF.values()) == set(Kind)
    assert {int(k) for k in Kind} == set(CLASS_OF)
    assert {type(m) for m in SAMPLES} == set(KIND_OF)


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_its_header(message):
    again = decode(encode(message))
    assert type(again) is type(message)
    assert again == message


def test_a_header_holds_the_kind_and_plain_fields_only():
    kind, *fields = pickle.loads(encode(Cancel(3)))
    assert kind == Kind.CANCEL and fields == [3]


def test_an_unknown_kind_is_refused():
    with pytest.raises(KeyError):
        decode(pickle.dumps((99, 1)))


def test_tensors_cross_as_raw_frames_and_come_back_as_views():
    segments = [
        {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64)},
        {"x": np.ones((1, 4), dtype=np.float16), "ids": np.zeros((1, 2), dtype=np.int64)},
        {"bf": np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16), "empty": np.zeros((0, 4), dtype=np.float32)},
    ]
    layout, frames = framing.pack(segments)
    assert all(isinstance(f, (bytes, np.ndarray)) for f in frames)
    back = framing.unpack(layout, [bytes(f) if isinstance(f, np.ndarray) else f for f in frames])
    for sent, got in zip(segments, back):
        assert sent.keys() == got.keys()
        for name in sent:
            assert got[name].dtype == sent[name].dtype and got[name].shape == sent[name].shape
            np.testing.assert_array_equal(got[name].astype(np.float64), sent[name].astype(np.float64))
    assert not back[0]["x"].flags.writeable  # a view of the frame, not a copy


def test_a_non_contiguous_array_crosses_with_its_values():
    wide = np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]
    layout, frames = framing.pack([{"v": wide}])
    np.testing.assert_array_equal(framing.unpack(layout, frames)[0]["v"], wide)


def test_bytes_tensors_cross_in_the_kserve_raw_form():
    text = np.array([[b"a sentence"], [b""], ["caf\u00e9".encode()]], dtype=object)
    layout, frames = framing.pack([{"TEXT": text}])
    assert layout == ((("TEXT", "BYTES", (3, 1)),),)
    assert bytes(frames[0])[:4] == len(b"a sentence").to_bytes(4, "little")
    back = framing.unpack(layout, frames)[0]["TEXT"]
    assert back.shape == (3, 1) and list(back.reshape(-1)) == [b"a sentence", b"", "caf\u00e9".encode()]


def test_a_spec_crosses_with_its_config_message():
    from trtserve._proto.inference import model_config_pb2 as mc

    config = mc.ModelConfig(name="tiny", max_batch_size=8)
    spec = ModelSpec("tiny", "1", "onnxruntime_onnx", (TensorSpec("x", DATATYPES["FP32"], (4,)),),
                     (TensorSpec("y", DATATYPES["FP32"], (2,)),), BatchingPolicy(max_batch_size=8), 1,
                     Path("engines/tiny"), Path("engines/tiny/1"), {"batching": "adaptive"}, config)
    sent = decode(encode(Table(True, True, True, (TableEntry("tiny", ModelState.READY, "", (spec_out(spec),)),))))
    assert sent.models[0].state is ModelState.READY
    back = spec_in(*sent.models[0].specs[0])
    assert back == spec


def test_a_queue_hint_crosses_whole():
    assert unpickled(pickled(HINT)) == HINT


@pytest.mark.parametrize("name", ["QueueFull", "Overloaded", "ModelNotFound", "DeadlineUnmeetable", "InflightFull"])
def test_an_error_crosses_as_its_code_and_keeps_its_class_and_sentence(name):
    sent = getattr(errors, name)("why")
    message = decode(encode(Error(1, sent.error_code, str(sent))))
    exc = errors.error_for(message.code, message.message)
    assert type(exc) is type(sent) and str(exc) == "why"


def test_every_error_code_names_one_class_and_an_unknown_code_is_internal():
    for code in errors.ErrorCode:
        assert errors.error_for(code, "x").error_code is code
    assert type(errors.error_for(999, "boom")) is errors.BackendError  # a peer of a newer version


def test_every_query_has_its_answer_in_the_engine_core():
    answers = CoreQueries(None, None, None, lambda: True).answers  # type: ignore[arg-type]
    assert set(answers) == set(EngineQuery.__subclasses__())


def test_a_deadline_is_absolute_on_the_shared_monotonic_clock():
    assert transport_deadline_of(None, 50.0) == math.inf
    assert transport_deadline_of(0.25, 50.0) == 50.25
