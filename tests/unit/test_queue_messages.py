"""The queue door's message format (:mod:`trtserve.protocol.queue`), pure: what a message may say,
what makes it garbage, and the flags that configure the door."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtserve.cli import _queue, build_parser
from trtserve.client import build_request
from trtserve.protocol.queue import Garbage, entry_ms, parse

BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()


def test_json_message_with_every_field():
    q = parse("m", b"1700000000000-3", {b"body": BODY, b"id": b"r1", b"version": b"2", b"priority": b"1",
                                        b"timeout_us": b"5000", b"reply_to": b"out", b"result_ttl_s": b"1.5"}, 60.0)
    assert (q.id, q.reply_to, q.ttl_ms) == ("r1", "out", 1500)
    assert (q.request.model_name, q.request.model_version, q.request.id) == ("m", "2", "r1")
    assert q.request.parameters["priority"].int64_param == 1
    assert q.request.parameters["timeout"].int64_param == 5000
    assert entry_ms(b"1700000000000-3") == 1700000000000


def test_proto_message_defaults_its_id_to_the_entry_id():
    body = build_request("", {"INPUT0": np.ones((1, 2), np.float32)}).SerializeToString()
    q = parse("m", b"5-0", {b"body": body, b"format": b"proto"}, 60.0)
    assert (q.id, q.rest, q.ttl_ms, q.request.model_name) == ("5-0", None, 60_000, "m")


@pytest.mark.parametrize(("fields", "says"), [
    ({b"body": BODY, b"colour": b"x"}, "unknown field(s) colour"),
    ({}, "no 'body'"),
    ({b"body": BODY, b"format": b"xml"}, "'format' is 'xml'"),
    ({b"body": BODY, b"model": b"other"}, "names model 'other'"),
    ({b"body": BODY, b"priority": b"0"}, "'priority' must be a whole number >= 1"),
    ({b"body": BODY, b"timeout_us": b"soon"}, "'timeout_us' must be a whole number >= 1"),
    ({b"body": BODY, b"result_ttl_s": b"-1"}, "'result_ttl_s' must be a number of seconds > 0"),
    ({b"body": b"{", b"id": b"x"}, "not valid JSON"),
    ({b"body": b"\xff", b"format": b"proto"}, "not a serialized ModelInferRequest"),
    ({b"body": BODY, b"format": b"proto", b"header_length": b"3"}, "for the json format only"),
])
def test_garbage_says_why(fields, says):
    with pytest.raises(Garbage) as info:
        parse("m", b"1-0", fields, 60.0)
    assert says in str(info.value)


def test_priority_as_field_and_parameter_is_refused():
    body = json.dumps({"inputs": json.loads(BODY)["inputs"], "parameters": {"priority": 2}}).encode()
    with pytest.raises(Garbage, match="both as a message field"):
        parse("m", b"1-0", {b"body": body, b"priority": b"1"}, 60.0)


def test_redis_flags_need_the_url_and_are_honoured():
    args = build_parser().parse_args(["serve", "--redis-claim-idle", "2"])
    with pytest.raises(ValueError, match="--redis-claim-idle need --redis-url"):
        _queue(args)
    args = build_parser().parse_args(["serve", "--redis-url", "redis://127.0.0.1:1/0", "--redis-max-deliveries", "2"])
    settings = _queue(args)
    assert (settings.max_deliveries, settings.claim_idle, settings.result_ttl) == (2, 30.0, 3600.0)
    with pytest.raises(ValueError, match="redis://"):
        _queue(build_parser().parse_args(["serve", "--redis-url", "http://x"]))


def test_the_queue_client_leaves_the_grpc_clients_stream_working():
    """The Redis queue client once lived in ``trtserve.client.queue``: importing it made the package's
    ``queue`` name that submodule, and every later ``Client.stream_infer`` in the process failed
    (``module 'trtserve.client.queue' has no attribute 'Queue'``)."""
    import queue

    import trtserve.client as client
    import trtserve.client.redis_queue  # noqa: F401

    assert client.queue is queue
