"""Read bandwidth this host sustains at a given thread count: the bandwidth floor's denominator.

Streaming probes, the larger wins (a floor some engine beats would be a wrong floor):

- native: OpenMP threads each stream their own slice of a >= 1 GiB buffer with the widest
  vector loads the CPU has (``vo_read_bandwidth`` in ``csrc/vo_kernels.cpp``), pages first
  touched by their reader, best of several sweeps after a warm-up sweep, each thread reading
  its slice as one to four concurrent streams (``PROBE_STREAMS``: a core can sustain more
  bandwidth with several, and a kernel could read that way, so the floor must allow for it; on
  an AVX2-only development host one core read about a third faster as three streams than as
  one, and the 1 GiB buffer as two or four streams, their starts a power of two apart, more
  slowly than as one);
- torch: a read-only ``sum`` over a float32 buffer of the same size with ``threads`` intra-op
  threads, best of several runs.

A third probe, for a pass whose bytes are given, reads one buffer of that size again and again,
as the kernels read their weights pass after pass. A working set of a few tens of MB is partly
served from the L3 cache on every sweep (the 0.6B int4 predictor pass reads 45 MB; the
development host has 32 MiB of L3 per core complex), so it reads faster than memory streams
(the *working-set* and *stream bandwidth* columns of the predictor artifacts), and on that host
the fused int4 pass on two threads outran the streaming probes. Where it is asked for, this
probe takes part in ``best``: a floor some pass beats is not a floor.

All probes ask for transparent huge pages on their buffer before touching it, as the packed
weights do (``vllm_omni.cpu.hugepages``). GB/s are 1e9 bytes per second. ``quick`` uses a 256 MiB
buffer and fewer sweeps: for tests and doc examples, not for figures (a Xeon here reports an L3
of 480 MiB, larger than that buffer).
"""

from __future__ import annotations

import ctypes
import statistics
import time

import torch

from vllm_omni.cpu import native
from vllm_omni.cpu.hugepages import HUGE_PAGE, advise_huge, fresh_buffer

GIB = 1 << 30
PROBE_STREAMS = (1, 2, 3, 4)  # concurrent read streams per thread, each a candidate for the best


def _sizes(quick: bool) -> tuple[int, int]:
    return (256 << 20, 3) if quick else (GIB, 7)


def _native_sweeps(nbytes: int, threads: int, reps: int, streams: tuple[int, ...]) -> dict[int, list[float]]:
    """GB/s of each timed sweep of the native probe over one buffer of ``nbytes``, per stream count."""
    out = {}
    for s in streams:
        gbs = (ctypes.c_double * reps)()
        best = native.load().vo_read_bandwidth(int(nbytes), int(threads), int(reps), int(s), gbs)
        if best <= 0:
            raise RuntimeError(f"native read probe failed ({best}) on {nbytes} bytes with {s} stream(s) per thread")
        out[s] = list(gbs)
    return out


def _best(sweeps: dict[int, list[float]]) -> float:
    return max(max(v) for v in sweeps.values())


def native_read_bandwidth(threads: int, quick: bool = False, streams: tuple[int, ...] = PROBE_STREAMS) -> float:
    """Best GB/s of the native probe over ``streams`` concurrent read streams per thread."""
    nbytes, reps = _sizes(quick)
    return _best(_native_sweeps(nbytes, threads, reps, streams))


def working_set_read_sweeps(threads: int, nbytes: int, quick: bool = False) -> dict[int, list[float]]:
    """GB/s of every sweep of the native probe re-reading one buffer of ``nbytes`` (to the
    nearest 2 MiB), per stream count (``PROBE_STREAMS`` per thread)."""
    size = max(1, round(int(nbytes) / HUGE_PAGE)) * HUGE_PAGE
    # a small buffer takes little time per sweep: more sweeps, so one quiet one is among them
    reps = max(3, min(64, (GIB // 4) // size)) if quick else max(7, min(256, (4 * GIB) // size))
    return _native_sweeps(size, threads, reps, PROBE_STREAMS)


def working_set_read_bandwidth(threads: int, nbytes: int, quick: bool = False) -> float:
    """Best GB/s of the native probe re-reading one buffer of ``nbytes`` (to the nearest 2 MiB)."""
    return _best(working_set_read_sweeps(threads, nbytes, quick))


def torch_read_bandwidth(threads: int, quick: bool = False) -> float:
    nbytes, reps = _sizes(quick)
    old = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        x = fresh_buffer(nbytes).view(torch.float32)
        advise_huge(x.data_ptr(), nbytes)  # before the first touch, as the native probe
        x.fill_(1.0)
        x.sum()  # warm-up
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t0)
        del x
    finally:
        torch.set_num_threads(old)
    return nbytes / best / 1e9


def read_bandwidth_probes(threads: int, quick: bool = False, working_set: int | None = None) -> dict[str, float]:
    """{"native": GB/s, "torch": GB/s, "best": the largest} at ``threads`` threads; with
    ``working_set`` (bytes a pass reads), also "working_set": the best GB/s re-reading a buffer
    that size, and "working_set_median": its median sweep (the best of its stream counts).
    The median is not a candidate for "best"; it says how fast a pass that only read its bytes
    would typically go, against a floor that takes the best sweep."""
    out = {"native": native_read_bandwidth(threads, quick), "torch": torch_read_bandwidth(threads, quick)}
    if working_set is not None:
        sweeps = working_set_read_sweeps(threads, working_set, quick)
        out["working_set"] = _best(sweeps)
    out["best"] = max(out.values())
    if working_set is not None:
        out["working_set_median"] = max(statistics.median(v) for v in sweeps.values())
    return out


def measure_read_bandwidth(threads: int, quick: bool = False) -> float:
    """The best read bandwidth (GB/s) of the native and torch probes at ``threads`` threads."""
    return read_bandwidth_probes(threads, quick)["best"]
