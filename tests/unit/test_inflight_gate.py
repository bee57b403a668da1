"""A front end's in-flight gate (frontend/inflight.py ``InflightGate``): the in-flight bound and the
drain refuse with the status that says which, and only what was admitted is ever released."""

from __future__ import annotations

from trtserve.errors import InflightFull, ShuttingDown
from trtserve.frontend.inflight import InflightGate


def test_the_bound_refuses_one_more_and_a_release_makes_room():
    counts: list[int] = []
    admission = InflightGate(on_change=counts.append)
    admission.limit, admission.limit_source = 2, "--max-inflight-rpcs 2"
    assert admission.admit() is None and admission.admit() is None
    refusal = admission.admit()
    assert isinstance(refusal, InflightFull) and refusal.refusal == "inflight_bound"
    assert "already has 2 requests in progress, its bound (--max-inflight-rpcs 2)" in str(refusal)
    assert admission.active == 2 and counts == [1, 2]  # a refusal changes nothing
    admission.release(None)
    assert admission.admit() is None and admission.active == 2


def test_a_lowered_bound_refuses_new_requests_until_the_admitted_drain_below_it():
    admission = InflightGate()
    for _ in range(3):
        assert admission.admit() is None
    admission.limit = 1  # the models changed: the admitted three still run
    assert isinstance(admission.admit(), InflightFull)
    admission.release(None)
    admission.release(None)
    assert isinstance(admission.admit(), InflightFull)
    admission.release(None)
    assert admission.admit() is None


def test_draining_refuses_with_unavailable_before_the_bound():
    admission = InflightGate()
    admission.limit = 0
    admission.begin_drain()
    assert isinstance(admission.admit(), ShuttingDown) and admission.active == 0


def test_a_held_request_is_released_once_however_its_block_ends():
    gate = InflightGate()
    gate.limit = 1
    try:
        with gate.held(None) as refusal:
            assert refusal is None and gate.active == 1
            with gate.held(None) as second:  # over the bound: refused, and never released
                assert isinstance(second, InflightFull) and gate.active == 1
            assert gate.active == 1
            raise RuntimeError("the handler failed")
    except RuntimeError:
        pass
    assert gate.active == 0
