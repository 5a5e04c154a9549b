"""How much of the machine a benchmark did not have: hypervisor steal and other processes.

On a shared VM a run can lose a core to the hypervisor (steal) or to another process, and a
frame loop with a barrier every few microseconds then takes many times its quiet time. Each
measured artifact records both shares over the run (``run.host_steal_share`` and
``run.host_other_busy_share``, fractions of all CPUs' time), read from ``/proc/stat`` and this
process's own CPU time, so that a slow run carries its own evidence. Off Linux both are null.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Snapshot:
    total: int  # all CPUs' ticks: user, nice, system, idle, iowait, irq, softirq, steal
    steal: int
    busy: int  # total less idle, iowait and steal
    own: float  # this process's CPU time (and its waited-for children's), in ticks


def _own_ticks() -> float:
    from vllm_omni.cpu.free_cores import own_cpu_seconds

    return own_cpu_seconds() * os.sysconf("SC_CLK_TCK")


def snapshot(stat: Path = PROC_STAT) -> Snapshot | None:
    """The machine's CPU counters now, or None where ``/proc/stat`` cannot be read."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return Snapshot(total=total, steal=steal, busy=total - idle - iowait - steal, own=_own_ticks())


def shares(start: Snapshot | None, end: Snapshot | None) -> dict[str, float | None]:
    """Steal and other processes' busy time between two snapshots, as fractions of all CPU time."""
    if start is None or end is None or end.total <= start.total:
        return {"host_steal_share": None, "host_other_busy_share": None}
    total = end.total - start.total
    other = max(0.0, (end.busy - start.busy) - (end.own - start.own))
    return {"host_steal_share": round((end.steal - start.steal) / total, 4),
            "host_other_busy_share": round(min(other / total, 1.0), 4)}


_mark = snapshot()


def mark() -> None:
    """Start the window that :func:`since_mark` reports (the CLI calls this before a command)."""
    global _mark
    _mark = snapshot()


def since_mark() -> dict[str, float | None]:
    return shares(_mark, snapshot())
