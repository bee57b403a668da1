"""CPU time of a process and of its whole process tree, from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _fields(stat: str) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses, so fields are counted from
    # the last ")": field 3 (state) is index 0.
    return stat[stat.rindex(")") + 2 :].split()


def tree_cpu_seconds_of(stats: Mapping[int, str], root: int, ticks_per_s: int = CLOCK_TICKS_PER_S) -> float:
    """User + system CPU seconds of process ``root`` and every descendant in ``stats``
    (pid → ``/proc/<pid>/stat`` text, a snapshot of the live processes); times are fields
    14-17 of stat, in clock ticks.

    Each process adds its own time (utime, stime) and that of its children it has already
    reaped (cutime, cstime, fields 16 and 17), so a CPU second counts once whether the
    process that spent it is alive or gone, and a front end that exits and is restarted
    does not make the total go back. A root missing from ``stats`` counts 0.
    """
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(int(_fields(stat)[1]), []).append(pid)
    total, todo = 0, [root] if root in stats else []
    while todo:
        pid = todo.pop()
        fields = _fields(stats[pid])
        total += sum(int(f) for f in fields[11:15])
        todo.extend(children.get(pid, ()))
    return total / ticks_per_s


def _live_stats() -> dict[int, str]:
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text()
            except OSError:
                pass  # exited while the directory was read
    return stats


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` and all its descendants have used (see
    :func:`tree_cpu_seconds_of`): a server's whole process tree."""
    return tree_cpu_seconds_of(_live_stats(), pid)
