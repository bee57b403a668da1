"""CPU time of a process, from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(stat: str, ticks_per_s: int = CLOCK_TICKS_PER_S) -> float:
    """User + system CPU seconds of a process (all its threads) from its ``/proc/<pid>/stat`` text.

    The command name (field 2) may hold spaces and parentheses, so fields are counted from
    the last ``)``: utime and stime are fields 14 and 15, in clock ticks.
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used since it started."""
    return proc_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
