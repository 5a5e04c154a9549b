"""Where a 2-thread run's two cores sit relative to each other, and what that does to its reads.

On the project's Zen 4 host (2 vCPUs of an EPYC) the 2-thread read bandwidth came in two
kinds of period: two threads streamed about what one does, or nearly twice as much. A cache
line handed back and forth between the two threads tells the placements apart: where both
cores share an L3 the round trip stays inside it; across core complexes it crosses the fabric
and takes several times as long, and then each thread also reads through its own L3 and its
own link to memory. :func:`timeline` samples the round trip and the 2-thread reads side by
side (``vllm-omni-bench placement``); a round trip taken just before and just after each read
says which placement the read met, where the two agree.

The round trip comes from ``vo_core_round_trip_ns`` in the native library (two spinning
threads of one OpenMP team). Reads come from :mod:`vllm_omni.cpu.bandwidth`'s native probe.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

TRIPS = 20_000  # about 1.5 ms between cores sharing an L3, 7 ms across core complexes
PROBES = 3


class PlacementError(RuntimeError):
    """The round trip cannot be measured here."""


class PlacementUnmeasured(PlacementError):
    """The probe works, but its two threads never ran at once (another process held a core): there is
    no figure to report, which is not a fault of the probe."""


def round_trip_ns(trips: int = TRIPS, probes: int = PROBES) -> float:
    """Median round trip of one cache line between the two threads of a team of two, in ns."""
    from vllm_omni.cpu import native
    from vllm_omni.results.provenance import usable_cpus

    if usable_cpus() < 2:
        raise PlacementError("a round trip between two cores needs two usable CPUs; this process has one "
                             "(see its CPU affinity, e.g. taskset)")
    lib = native.load()
    values = [lib.vo_core_round_trip_ns(int(trips)) for _ in range(probes)]
    broken = [v for v in values if v <= 0 and v != -1.0]  # -1: the threads did not run at once
    if broken:
        raise PlacementError(f"the round-trip probe is broken: it returned {broken[0]} for {trips} trips")
    timed = [v for v in values if v > 0]
    if not timed:
        raise PlacementUnmeasured(f"the round trip could not be measured: in {probes} probes the two threads never "
                                  "ran on two CPUs at once (another process held one)")
    return statistics.median(timed)


def recorded_round_trip(threads: int) -> float | None:
    """The round trip (ns, one decimal) for a benchmark to record beside its reads where it runs
    ``threads`` >= 2, so that a multi-thread figure says which placement it met; None at one
    thread, or where the probe cannot run (the figure is then unknown, not an error)."""
    if threads < 2:
        return None
    try:
        return round(round_trip_ns(), 1)
    except Exception:  # noqa: BLE001 - no second CPU, no compiler: the placement is unknown
        return None


def timeline(samples: int, working_set: int, quick: bool = False) -> list[dict[str, Any]]:
    """``samples`` readings, one after another: the round trip, the best 2-thread stream read of
    a large buffer, the round trip, the best 2-thread re-read of ``working_set`` bytes, the
    round trip. Each read thus has a round trip just before and just after it."""
    from vllm_omni.cpu.bandwidth import native_read_bandwidth, working_set_read_bandwidth

    out = []
    t0 = time.perf_counter()
    for i in range(samples):
        start = time.perf_counter() - t0
        before = round_trip_ns()
        stream = native_read_bandwidth(2, quick=True)
        middle = round_trip_ns()
        working = working_set_read_bandwidth(2, working_set, quick=quick)
        after = round_trip_ns()
        out.append({"sample": i, "seconds": start, "round trip before": before, "stream read": stream,
                    "round trip between": middle, "working-set read": working, "round trip after": after})
    return out
