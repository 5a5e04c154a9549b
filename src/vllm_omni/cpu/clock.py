"""The clock a CPU benchmark's core ran at, at the run's start and at its end.

On a shared VM one vCPU's clock moves between periods: a chain of dependent adds ran at about
1.9 GHz in one period and 2.5 GHz in another, minutes apart, on the project's 2-core host
(development measurement). A kernel's time moves with it, and neither the hypervisor's steal
nor other processes' load (``vllm_omni.results.host_load``) shows it. So the CPU benchmarks
record ``run.core_clock_ghz = {"start": ..., "end": ...}``: each the median of a few short
chains of dependent integer adds (``vo_clock_ghz`` in the native library) on the calling
thread's core, each adding a register, not an immediate: one Xeon's core folds chained adds of
an immediate and ran them about four per cycle, which read as a 16 GHz clock. Either is null
where the native library cannot be built or the CPU is not x86-64. The CLI takes the start
before the command runs (:func:`mark`) and the end as the artifact is written
(:func:`since_mark`).
"""

from __future__ import annotations

import statistics

PROBES = 5
ADDS = 5_000_000  # about 2 ms a probe at 2.5 GHz

_start: float | None = None
_marked = False


def probe() -> float | None:
    """The calling thread's core clock now, in GHz (median of PROBES chains), or None."""
    try:
        from vllm_omni.cpu import native

        lib = native.load()
    except Exception:  # noqa: BLE001 - no compiler or no library: the clock is unknown, not an error
        return None
    values = [lib.vo_clock_ghz(ADDS) for _ in range(PROBES)]
    return round(statistics.median(values), 3) if min(values) > 0 else None


def mark() -> None:
    """Take the start clock; :func:`since_mark` then reports it with the end clock."""
    global _start, _marked
    _start, _marked = probe(), True


def clear() -> None:
    """Forget the start clock: the next artifact records none (a command that is not a CPU run)."""
    global _start, _marked
    _start, _marked = None, False


def since_mark() -> dict[str, dict[str, float | None]]:
    """``{"core_clock_ghz": {"start": ..., "end": ...}}`` after :func:`mark`, else ``{}``."""
    if not _marked:
        return {}
    return {"core_clock_ghz": {"start": _start, "end": probe()}}
