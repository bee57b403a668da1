"""CPU time and resident memory of a process and its whole process tree, from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PROC = Path("/proc")
MIB = 1 << 20


def _fields(stat: str) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses, so fields are counted from
    # the last ")": field 3 (state) is index 0.
    return stat[stat.rindex(")") + 2 :].split()


def _tree(stats: Mapping[int, str], root: int) -> Iterator[list[str]]:
    """The stat fields (index 0 = field 3) of ``root`` and of every descendant in ``stats``;
    nothing when ``root`` is missing."""
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(int(_fields(stat)[1]), []).append(pid)
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        yield _fields(stats[pid])
        todo.extend(children.get(pid, ()))


def tree_cpu_seconds_of(stats: Mapping[int, str], root: int, ticks_per_s: int = CLOCK_TICKS_PER_S) -> float:
    """User + system CPU seconds of process ``root`` and every descendant in ``stats``
    (pid → ``/proc/<pid>/stat`` text, a snapshot of the live processes); times are fields
    14-17 of stat, in clock ticks.

    Each process adds its own time (utime, stime) and that of its children it has already
    reaped (cutime, cstime, fields 16 and 17), so a CPU second counts once whether the
    process that spent it is alive or gone, and a front end that exits and is restarted
    does not make the total go back. A root missing from ``stats`` counts 0.
    """
    return sum(sum(int(f) for f in fields[11:15]) for fields in _tree(stats, root)) / ticks_per_s


def tree_rss_bytes_of(stats: Mapping[int, str], root: int, page_size: int = PAGE_SIZE) -> int:
    """Resident set size in bytes of process ``root`` plus every live descendant in ``stats``
    (field 24 of stat, in pages). Pages shared between processes of the tree (libraries,
    shared memory) count once per process, as ``ps`` sums them; the figure is for watching
    growth, not for sizing a host. A root missing from ``stats`` counts 0."""
    return sum(int(fields[21]) for fields in _tree(stats, root)) * page_size


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


def tree_rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` and its live descendants now, in MiB (see
    :func:`tree_rss_bytes_of`)."""
    return tree_rss_bytes_of(_live_stats(), pid) / MIB
