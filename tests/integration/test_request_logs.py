"""Request logs (issue 8): one log line per request with its id, model, status and duration, and
the JSON log format carrying those fields.
"""

from __future__ import annotations

import json
import logging

from integration.helpers import row
from trtserve.client import build_request


def test_request_log_line_has_id_model_status_and_duration(server, caplog):
    caplog.set_level(logging.DEBUG, logger="trtserve.requests")
    with server.client() as c:
        c.stub.ModelInfer(build_request("identity_fp32", row(3), request_id="req-42"))
    lines = [r for r in caplog.records if r.name == "trtserve.requests" and getattr(r, "request_id", "") == "req-42"]
    assert len(lines) == 1
    assert (lines[0].model, lines[0].status) == ("identity_fp32", "OK") and lines[0].duration_ms > 0


def test_json_log_format_carries_the_extra_fields():
    from trtserve.logs import JsonFormatter

    record = logging.LogRecord("trtserve.requests", logging.DEBUG, __file__, 1, "OK %s", ("m",), None)
    record.request_id, record.model, record.status, record.duration_ms = "r1", "m", "OK", 1.5
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "OK m" and out["level"] == "DEBUG" and out["logger"] == "trtserve.requests"
    assert (out["request_id"], out["model"], out["status"], out["duration_ms"]) == ("r1", "m", "OK", 1.5)
