"""The refusals mode's pure part: ρ from an answered and a refused loop, the goodput bound it
implies and the ρ a goodput target needs. Exact answers from small fixed inputs; nothing here
times anything."""

from __future__ import annotations

import numpy as np
import pytest

from trtserve.harness.benchlib.refusals import (
    LOOP_MODES,
    format_refusal_table,
    goodput_bound,
    measure_rho,
    refusal_targets,
    rho_needed,
    rhos,
)
from trtserve.harness.benchlib.report import Measurement, Point, Snapshot, summarize


def loop(mode: str, codes: list[str], server_cpu_s: float, model: str = "tiny") -> Point:
    return summarize(Measurement(
        model=model, mode=mode, load=64, fraction=None, window_s=1.0, rows_per_request=1,
        latency_us=np.full(len(codes), 1000.0), codes=codes, late=0, deadline_us=None, send_lag_us=np.array([]),
        before=Snapshot(10.0, 0.0, 0, 0, {}), after=Snapshot(10.0 + server_cpu_s, 0.0, 0, 0, {}),
    ), 1000.0)


def test_the_goodput_bound_is_one_minus_k_rho_over_one_minus_rho():
    assert goodput_bound(0.0, 3.0) == 1.0  # free refusals: the whole capacity is kept
    assert goodput_bound(0.1, 2.0) == pytest.approx(0.8 / 0.9)
    assert goodput_bound(0.1, 3.0) == pytest.approx(0.7 / 0.9)
    assert goodput_bound(0.5, 3.0) == 0.0  # refusals alone take the whole CPU
    assert goodput_bound(0.5, 1.0) == 1.0  # nothing to refuse at capacity
    with pytest.raises(ValueError):
        goodput_bound(1.0, 2.0)


def test_the_rho_a_target_needs_is_where_the_bound_meets_it():
    assert rho_needed(0.8, 3.0) == pytest.approx(0.2 / 2.2)  # 0.0909: the 0.09
    assert goodput_bound(rho_needed(0.8, 3.0), 3.0) == pytest.approx(0.8)
    assert goodput_bound(rho_needed(0.5, 2.0), 2.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        rho_needed(0.8, 1.0)


def test_rho_charges_the_refused_loops_answers_at_the_answered_loops_price():
    answered = loop(LOOP_MODES["grpc"]["answered"], ["OK"] * 1000, 1.0)  # 1000 us an answer
    # 100 answers slipped through (100 x 1000 us), 900 refusals took the other 0.27 s: 300 us each.
    refused = loop(LOOP_MODES["grpc"]["refused"], ["OK"] * 100 + ["RESOURCE_EXHAUSTED"] * 900, 0.37)
    rho = measure_rho(answered, refused)
    assert rho is not None
    assert (rho.door, rho.answer_us, rho.refused, rho.requests) == ("grpc", pytest.approx(1000.0), 900, 1000)
    assert rho.refusal_us == pytest.approx(300.0) and rho.rho == pytest.approx(0.3)
    assert rho.bound(3.0) == pytest.approx(0.1 / 0.7)
    # Statuses that are not overload refusals are not counted as refusals.
    assert measure_rho(answered, loop(LOOP_MODES["grpc"]["refused"], ["INVALID_ARGUMENT"] * 10, 0.1)) is None


def test_each_door_pairs_its_refused_loop_with_the_answered_loop_before_it():
    points = [
        loop(LOOP_MODES["grpc"]["answered"], ["OK"] * 100, 0.1),
        loop(LOOP_MODES["grpc"]["refused"], ["RESOURCE_EXHAUSTED"] * 100, 0.05),
        loop(LOOP_MODES["http"]["answered"], ["OK"] * 100, 0.2),
        loop(LOOP_MODES["http"]["refused"], ["HTTP 429"] * 50 + ["HTTP 503"] * 50, 0.01),
        loop(LOOP_MODES["http"]["answered"], ["OK"] * 100, 0.2, model="minilm"),  # no refused loop: no rho
    ]
    found = {(r.model, r.door): r.rho for r in rhos(points)}
    assert found == {("tiny", "grpc"): pytest.approx(0.5), ("tiny", "http"): pytest.approx(0.05)}
    targets = refusal_targets(points)
    assert [t.verdict for t in targets] == ["MISS", "PASS"]  # 0.5 and 0.05 against 0.091
    assert "0.00 at 3x" in targets[0].detail
    table = format_refusal_table(points)
    assert "| tiny | grpc | 64 | 1000 | 500 | 100/100 | 0.500 | 0.00 | 0.00 |" in table
    assert "| tiny | http | 64 | 2000 | 100 | 100/100 | 0.050 | 0.95 | 0.89 |" in table
    assert format_refusal_table(points[:1]) == ""
