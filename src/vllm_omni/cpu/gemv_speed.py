"""How fast the fused GEMVs decode packed weights, by where those weights sit.

A predictor pass is held against a read floor: its bytes over the best read bandwidth of the
host. When a pass misses that floor, two limits can be the cause: the reads themselves, or the
row dots' work in the core (loads of activations, unpacking, integer dots, scales). This module
tells them apart. It times the same GEMVs as the pass (``vo_gemv_sweeps`` in
``csrc/vo_kernels.cpp``: matrix after matrix, each ending in a barrier) over weight sets of
chosen sizes, from one that fits in a core's L2 cache to one many times the L3. Where the
weights fit in a cache, the reads are cheap and the time is the core's; where they do not, the
reads dominate. The read probe at the same size (``vllm_omni.cpu.bandwidth``) is the other
half of each comparison. Between the two sit the *plain reads* (``vo_read_sweeps``): the
GEMVs' own reads, same rows, shares, streams and barriers, with no arithmetic on the bytes.
GEMVs as fast as their plain reads are limited by how they read, not by what they compute.

A weight set is a run of packed matrices of the predictor's input width (1024), about 2 MiB
each, the size of the pass's matrices, in one huge-page arena as the pass keeps its weights.
One matrix is packed from random values and copied: speed does not depend on the values.
"""

from __future__ import annotations

import ctypes
import dataclasses
import statistics

import torch

from vllm_omni.cpu import native
from vllm_omni.cpu.hugepages import into_huge_arena
from vllm_omni.cpu.predictor import vo_mat
from vllm_omni.cpu.quant import QuantMatrix, check_format, quantize
from vllm_omni.models import linear_bytes

COLS = 1024  # the predictor's hidden size: the input width of most of its matrices
MATRIX_BYTES = 2 << 20  # about the size of one of the pass's matrices (1.2 to 3.5 MB in int4)
ROW_MULTIPLE = 64


@dataclasses.dataclass
class WeightSet:
    """Packed matrices in one arena, as the native kernels take them."""

    fmt: str
    mats: list[QuantMatrix]
    c_mats: ctypes.Array
    nbytes: int
    arena: object  # keeps the views' storage alive


def weight_set(fmt: str, nbytes: int, cols: int = COLS, seed: int = 0) -> WeightSet:
    """About ``nbytes`` of ``fmt`` matrices [rows, ``cols``] (rows a multiple of 64, at least 64)."""
    check_format(fmt)
    if nbytes < 1:
        raise ValueError(f"a weight set needs a positive size, got {nbytes} bytes")
    per_row = linear_bytes(1, cols, fmt)
    total_rows = max(ROW_MULTIPLE, round(nbytes / per_row / ROW_MULTIPLE) * ROW_MULTIPLE)
    full_rows = max(ROW_MULTIPLE, MATRIX_BYTES // per_row // ROW_MULTIPLE * ROW_MULTIPLE)
    sizes = [full_rows] * (total_rows // full_rows) + ([total_rows % full_rows] if total_rows % full_rows else [])
    g = torch.Generator().manual_seed(seed)
    proto = quantize(torch.randn(max(sizes), cols, generator=g), fmt)
    pieces = [_first_rows(proto, r) for r in sizes]
    arena, mats, _ = into_huge_arena(pieces)
    c_mats = (native.VoMat * len(mats))(*[vo_mat(m) for m in mats])
    return WeightSet(fmt, mats, c_mats, sum(m.nbytes for m in mats), arena)


def pass_weight_set(predictor) -> WeightSet:
    """The matrices one predictor pass reads, in its order (5 x qkv, o, gate_up, down; one head)."""
    mats = [m for m in predictor.native._keep if isinstance(m, QuantMatrix)] + [predictor.heads[0]]
    c_mats = (native.VoMat * len(mats))(*[vo_mat(m) for m in mats])
    return WeightSet(predictor.fmt, mats, c_mats, sum(m.nbytes for m in mats), predictor)


def _first_rows(m: QuantMatrix, rows: int) -> QuantMatrix:
    """The first ``rows`` rows of a packed matrix (its data and scales are stored row by row)."""
    scale = None if m.scale is None else m.scale[:rows]
    return dataclasses.replace(m, data=m.data[:rows], scale=scale, rows=rows)


def gemv_sweep_seconds(ws: WeightSet, threads: int, sweeps: int, variant: str = "native") -> list[float]:
    """Wall seconds of ``sweeps`` sweeps over the set's GEMVs (the first one included: drop it)."""
    _check_sweeps(threads, sweeps)
    k = max(m.cols for m in ws.mats)
    x = torch.randn(k, generator=torch.Generator().manual_seed(1)) * 0.5
    y = torch.empty(max(m.rows for m in ws.mats))
    seconds = (ctypes.c_double * sweeps)()
    rc = native.load(variant).vo_gemv_sweeps(native.FMT_CODES[ws.fmt], ws.c_mats, len(ws.mats), x.data_ptr(), k,
                                             y.data_ptr(), sweeps, threads, seconds)
    if rc != 0:
        raise RuntimeError(f"vo_gemv_sweeps failed ({rc}) on {len(ws.mats)} {ws.fmt} matrices")
    return list(seconds)


def read_sweep_seconds(ws: WeightSet, threads: int, sweeps: int, variant: str = "native") -> list[float]:
    """Wall seconds of ``sweeps`` sweeps that make the GEMVs' reads and nothing else (first one included).

    Same matrices, rows, thread shares, read streams and barriers as ``gemv_sweep_seconds``;
    each row's bytes are loaded and summed, with no dots (``vo_read_sweeps``). GEMVs that
    sweep as fast as this are held back by their reads, not by their arithmetic.
    """
    _check_sweeps(threads, sweeps)
    seconds = (ctypes.c_double * sweeps)()
    checksum = ctypes.c_int64()
    rc = native.load(variant).vo_read_sweeps(native.FMT_CODES[ws.fmt], ws.c_mats, len(ws.mats), sweeps, threads,
                                             seconds, ctypes.byref(checksum))
    if rc != 0:
        raise RuntimeError(f"vo_read_sweeps failed ({rc}) on {len(ws.mats)} {ws.fmt} matrices "
                           "(shapes the GEMVs take, each starting on a 64-byte boundary)")
    return list(seconds)


def _check_sweeps(threads: int, sweeps: int) -> None:
    if threads < 1 or sweeps < 1:
        raise ValueError(f"threads and sweeps must be >= 1, got {threads} and {sweeps}")


def sweeps_for(nbytes: int, quick: bool = False) -> int:
    """Sweeps enough to read about 4 GiB (quick: 256 MiB), within 6..4000."""
    target = (256 << 20) if quick else (4 << 30)
    return max(6, min(4000, target // max(1, nbytes)))


def gemv_read_speed(ws: WeightSet, threads: int, quick: bool = False, variant: str = "native") -> dict[str, float]:
    """{"best": GB/s, "median": GB/s} of packed bytes decoded per second, warm-up sweep dropped."""
    secs = gemv_sweep_seconds(ws, threads, sweeps_for(ws.nbytes, quick) + 1, variant)[1:]
    return {"best": ws.nbytes / min(secs) / 1e9, "median": ws.nbytes / statistics.median(secs) / 1e9}
