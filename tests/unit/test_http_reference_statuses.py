"""docs/reference/http.md's error table is held to the code (issue 37 item 5): every HTTP status
the door can answer is in the table, and the table lists no status the door cannot answer. The
statuses the code can answer are read from its one table (``HTTP_STATUS``, every status name of
``trtserve.frontend.status``) and from the literal statuses of the door's own refusals."""

from __future__ import annotations

import re
from pathlib import Path

from trtserve.frontend.http.app import HTTP_STATUS
from trtserve.frontend.status import STATUS_NAMES

ROOT = Path(__file__).resolve().parents[2]
DOOR = ROOT / "service" / "trtserve" / "frontend" / "http"
REFUSAL = re.compile(r"(?:HttpError|_Refused|_refuse|_error)\(\s*(\d{3})\b")


def documented() -> set[int]:
    text = (ROOT / "docs" / "reference" / "http.md").read_text()
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    return {int(s) for s in re.findall(r"^\| (\d{3}) \|", section, re.M)}


def answered() -> set[int]:
    literal = {int(s) for path in DOOR.glob("*.py") for s in REFUSAL.findall(path.read_text())}
    return literal | set(HTTP_STATUS.values())


def test_every_status_name_has_an_http_status():
    assert set(STATUS_NAMES.values()) <= set(HTTP_STATUS)


def test_the_reference_error_table_lists_exactly_the_statuses_the_door_answers():
    code, docs = answered(), documented()
    assert code - docs == set(), f"answered by the HTTP door but missing from docs/reference/http.md: {code - docs}"
    assert docs - code == set(), f"in docs/reference/http.md but never answered: {docs - code}"
    assert {408, 413, 415, 431} <= code  # the refusals the reports found missing or untested
