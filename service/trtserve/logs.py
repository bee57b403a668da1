"""Log set-up for the command line: plain text or one JSON object per line.

The per-request line comes from the ``trtserve.requests`` logger (:data:`REQUEST_LOGGER`) at
DEBUG, with ``request_id``, ``model``, ``status`` and ``duration_ms`` as record attributes; the
gRPC layer checks ``isEnabledFor`` once per request, so a disabled request log costs one
cached lookup. ``--log-requests`` turns it on without making every other logger verbose.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

REQUEST_LOGGER = "trtserve.requests"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    the ``extra`` fields (request id, model, status, timings) and ``exc_info`` if any."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (values that are not JSON types as ``str``)."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(level: str = "INFO", fmt: str = "text", requests: bool = False) -> None:
    """Configure the root logger once (replacing earlier handlers).

    Args:
        level: the root level name (DEBUG, INFO, ...).
        fmt: ``text`` or ``json``.
        requests: log one line per request (``trtserve.requests`` at DEBUG) whatever ``level`` is.

    Raises:
        ValueError: an unknown level or format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {list(FORMATS)}, got '{fmt}'")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level '{level}'")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=numeric, handlers=[handler], force=True)
    if requests:
        logging.getLogger(REQUEST_LOGGER).setLevel(logging.DEBUG)
