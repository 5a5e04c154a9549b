"""How many threads to run while other work keeps some of this process's cores busy.

Why: the fused passes end every GEMV in a barrier, hundreds of them a frame. When another
process keeps one of two cores busy, the scheduler takes one of our threads off its core for
whole time slices and every barrier waits for it; worse, the waiting thread spins (OpenMP's
default wait) and keeps the core from the thread it waits for. On a 2-core Xeon a PyTorch
matmul loop beside ``qwen3-tts-edge speak`` made it 13 to 33 times slower than at one thread
(``docs/analysis/busy-cores.md``). A shorter spin or a passive wait policy cost a sixth to a
half of the idle speed; running on the cores that are actually free cost nothing idle and
matched one thread under load, so that is what the engine does.

``CoreWatch`` reads, at most every ``period_s``, how much CPU time the CPUs this process may run
on (its affinity) spent busy -- user, nice, system, irq, softirq and the hypervisor's steal --
beyond this process's own, from ``/proc/stat`` and ``getrusage``: the load of everything else,
in cores. A core counts as taken once others use more than half of it (``TAKE``: measured, one
thread beat two above that share and lost below it) and as free again once they use less than
``RELEASE`` of it, so a load near the line does not make the count flap. ``threads(wanted)``
is ``wanted`` less the taken cores, at least one. Off Linux (no ``/proc/stat``) nothing is
taken.
"""

from __future__ import annotations

import math
import os
import resource
import time
from pathlib import Path
from typing import Callable

PROC_STAT = Path("/proc/stat")
TAKE = 0.5  # others' share of a core above which it counts as taken
RELEASE = 0.3  # ... and below which a taken core is free again
PERIOD_S = 0.25  # /proc/stat counts in ticks of 10 ms: 25 a core a period
FIRST_PERIOD_S = 0.1  # the first reading comes sooner, so that a short first utterance is not spoken on taken cores


def own_cpu_seconds() -> float:
    """This process's CPU time (all its threads, and its waited-for children)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def busy_seconds(cpus: frozenset[int], stat: Path = PROC_STAT) -> float | None:
    """Seconds the CPUs in ``cpus`` have been busy since boot (steal counted as busy: a vCPU the
    hypervisor runs elsewhere is as unavailable as one another process holds); None off Linux."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        try:
            cpu = int(fields[0][3:])
        except ValueError:
            continue
        if cpu in cpus and len(fields) >= 9:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


def affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


class CoreWatch:
    """The cores other work leaves this process (see the module doc)."""

    def __init__(self, cpus: frozenset[int] | None = None, period_s: float = PERIOD_S, stat: Path = PROC_STAT,
                 clock: Callable[[], float] = time.monotonic, own: Callable[[], float] = own_cpu_seconds):
        self.cpus = affinity() if cpus is None else frozenset(cpus)
        self.period_s, self.stat, self.clock, self.own = period_s, stat, clock, own
        self.taken = 0  # cores counted as taken by other work
        self.others: float | None = None  # others' load over the last window, in cores
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        busy = busy_seconds(self.cpus, self.stat)
        return None if busy is None else (self.clock(), busy, self.own())

    def update(self) -> int:
        """Re-read the counters if a period has passed since the last reading; the cores taken."""
        wait = self.period_s if self.others is not None else min(self.period_s, FIRST_PERIOD_S)
        if self._last is None or self.clock() - self._last[0] < wait:
            return self.taken
        now = self._read()
        if now is None:
            return self.taken
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        self.others = min(max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0), float(len(self.cpus)))
        more, fewer = math.floor(self.others + 1 - TAKE), math.floor(self.others + 1 - RELEASE)
        if more > self.taken:
            self.taken = more
        elif fewer < self.taken:
            self.taken = fewer
        return self.taken

    def threads(self, wanted: int) -> int:
        """``wanted`` less the cores others hold now (at least one, at most the free CPUs)."""
        return max(1, min(wanted, len(self.cpus) - self.update()))
