"""The bench's open-loop load generator against a real server, with either client (the
``grpc.aio`` one in the bench process and the Go binary, skipped while it is not built): each
request's own deadline travels as its gRPC deadline when asked (over the HTTP door, with the Go
binary, as the ``trtserve-timeout-us`` header), and each answer is traced back to its message.

The ``slow`` model sleeps 20 ms + 1 ms per row, so an answer within 2 ms is impossible on any
machine and one within 30 s is certain on a healthy one: nothing here depends on speed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from trtserve.client import CHANNEL_OPTIONS, build_request
from trtserve.harness.benchlib.goclient import GoLoadgen
from trtserve.harness.benchlib.httpclient import RestClient, rest_request
from trtserve.harness.benchlib.load import LoadGenerator, open_channels

TIGHT_S, LOOSE_S = 0.002, 30.0
ARRIVALS = np.linspace(0.5, 0.8, 8)
"""Seconds from the start of the point: inside the window (it opens after 0.2 s of warm-up and
lasts 1 s)."""


@pytest.fixture(params=["python", "go"])
def client(request):
    """The open loop's client: None for grpc.aio, else the Go binary (see ``loadgen_binary``)."""
    return request.getfixturevalue("loadgen_binary") if request.param == "go" else None


def deadlines_by_message() -> list[float]:
    return [TIGHT_S if k % 2 == 0 else LOOSE_S for k in range(len(ARRIVALS))]


def run_open_loop(url: str, grpc_deadline: bool, client=None):
    # No timeout parameter: only the gRPC deadline (when given) can end a tight call early.
    messages = [
        build_request("slow", {"INPUT0": np.full((1, 4), k, np.float32)}).SerializeToString()
        for k in range(len(ARRIVALS))
    ]
    deadlines = deadlines_by_message()

    async def go():
        channels = open_channels(url, 2, CHANNEL_OPTIONS)
        try:
            gen = LoadGenerator(channels, lambda: 0.0, warmup_s=0.2, duration_s=1.0, server_rss_mib=lambda: 123.0,
                                go=GoLoadgen(url, client) if client else None)
            return await gen.open_unary("slow", messages, ARRIVALS, deadlines, grpc_deadline=grpc_deadline)
        finally:
            for c in channels:
                await c.close()

    return asyncio.run(go())


def test_open_loop_calls_carry_their_own_deadline_as_the_grpc_deadline(server, client):
    window = run_open_loop(server.url, grpc_deadline=True, client=client)
    assert sorted(window.keys.tolist()) == list(range(len(ARRIVALS)))  # every arrival answered once
    codes = dict(zip(window.keys.tolist(), window.codes))
    assert {codes[k] for k in range(0, len(ARRIVALS), 2)} == {"DEADLINE_EXCEEDED"}
    assert {codes[k] for k in range(1, len(ARRIVALS), 2)} == {"OK"}
    assert window.late == 0
    assert window.before.server_rss_mib == 123.0 and window.after.server_rss_mib == 123.0


def test_without_grpc_deadlines_a_tight_request_is_answered_late(server, client):
    window = run_open_loop(server.url, grpc_deadline=False, client=client)
    late = dict(zip(window.keys.tolist(), window.late_mask.tolist()))
    assert set(window.codes) == {"OK"}
    assert [late[k] for k in range(len(ARRIVALS))] == [k % 2 == 0 for k in range(len(ARRIVALS))]


def test_over_http_the_open_loop_sends_each_deadline_as_the_timeout_header(http_server, loadgen_binary):
    # No timeout parameter in the bodies: only the header (and the client's own deadline) can end a tight call early.
    messages = [rest_request("slow", {"INPUT0": np.full((1, 4), k, np.float32)}, binary=False)
                for k in range(len(ARRIVALS))]

    async def go():
        channels = open_channels(http_server.url, 2, CHANNEL_OPTIONS)  # the counters are read over gRPC
        try:
            gen = LoadGenerator(channels, lambda: 0.0, warmup_s=0.2, duration_s=1.0)
            async with RestClient(http_server.http_url, 2) as rest:
                with pytest.raises(ValueError, match="Go load generator only"):
                    await gen.over_http(rest).open_unary("slow", messages, ARRIVALS, LOOSE_S)
                over_http = gen.over_http(rest, GoLoadgen(http_server.http_url, loadgen_binary))
                return await over_http.open_unary("slow", messages, ARRIVALS, deadlines_by_message(),
                                                  grpc_deadline=True)
        finally:
            for c in channels:
                await c.close()

    window = asyncio.run(go())
    assert window.door == "http"
    assert sorted(window.keys.tolist()) == list(range(len(ARRIVALS)))
    codes = dict(zip(window.keys.tolist(), window.codes))
    assert [codes[k] for k in range(len(ARRIVALS))] == ["DEADLINE_EXCEEDED", "OK"] * (len(ARRIVALS) // 2)
    assert window.late == 0
