"""The per-request records of one bench point, filled by either load generator: the
``grpc.aio`` one of :mod:`.load` as answers come, the Go binary's (:mod:`.goclient`) from its
record file after the run. Times are ``time.perf_counter()`` seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Recorder:
    """Per-request records of one point (appended on the event loop only; times in seconds)."""

    keys: list[int] = field(default_factory=list)
    scheduled: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    late: list[bool] = field(default_factory=list)
    window_end: float = math.inf
    """The measuring window's end (set when it closes): the open loop sends every arrival
    scheduled before it."""

    def add(self, key: int, scheduled: float, sent: float, done: float, code: str, deadline_s: float | None) -> None:
        """One answer to message ``key``; it is late if OK but more than ``deadline_s`` after it was sent."""
        self.keys.append(key)
        self.scheduled.append(scheduled)
        self.sent.append(sent)
        self.done.append(done)
        self.codes.append(code)
        self.late.append(code == "OK" and deadline_s is not None and done - sent > deadline_s)
