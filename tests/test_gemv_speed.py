"""GEMV sweeps (``vo_gemv_sweeps``), their plain reads (``vo_read_sweeps``) and ``vllm-omni-bench gemv``.

The sweeps exist to time the row dots; what is checked here is that they compute the same
GEMVs as ``vo_linear`` (bit for bit: the same row dots, and a row's result does not depend on
the tile or thread it falls to; each matrix swept alone, then the output a sweep of both
leaves, the last one's), that the plain-read sweeps read every byte the GEMVs read once
per sweep (a checksum of the words read), that bad shapes are refused, and that the benchmark
writes a valid artifact. Speeds are the artifact's business, not the tests'.
"""

from __future__ import annotations

import ctypes
import json

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu import native  # noqa: E402
from vllm_omni.cpu.gemv_speed import (  # noqa: E402
    ROW_MULTIPLE, WeightSet, gemv_sweep_seconds, pass_weight_set, read_sweep_seconds, weight_set,
)
from vllm_omni.cpu.hugepages import into_huge_arena  # noqa: E402
from vllm_omni.cpu.predictor import vo_mat  # noqa: E402
from vllm_omni.cpu.quant import quantize  # noqa: E402
from vllm_omni.results.provenance import cache_bytes  # noqa: E402


def _sweep_output(fmt, mats, x, threads=1):
    c_mats = (native.VoMat * len(mats))(*[vo_mat(m) for m in mats])
    y = torch.full((max(m.rows for m in mats),), float("nan"))
    secs = (ctypes.c_double * 3)()
    rc = native.load().vo_gemv_sweeps(native.FMT_CODES[fmt], c_mats, len(mats), x.data_ptr(), x.numel(),
                                      y.data_ptr(), 3, threads, secs)
    return rc, y, list(secs)


def _linear(fmt, m, x):
    y = torch.empty(m.rows)
    xc = x[: m.cols].contiguous()
    assert native.load().vo_linear(native.FMT_CODES[fmt], ctypes.byref(vo_mat(m)), xc.data_ptr(), 1, y.data_ptr(), 1) == 0
    return y


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_sweeps_compute_the_same_gemv_as_vo_linear(fmt, threads):
    g = torch.Generator().manual_seed(3)
    # the last matrix is narrower than x (17 pairs of int4 groups): it takes the first 1088 inputs
    mats = [quantize(torch.randn(rows, cols, generator=g), fmt) for rows, cols in ((160, 3072), (224, 1088))]
    x = torch.randn(3072, generator=g) * 0.5
    for m in mats:
        rc, y, _ = _sweep_output(fmt, [m], x, threads)
        assert rc == 0 and torch.equal(y, _linear(fmt, m, x))
    rc, y, secs = _sweep_output(fmt, mats, x, threads)
    assert rc == 0
    assert torch.equal(y[: mats[-1].rows], _linear(fmt, mats[-1], x))  # y holds the last matrix's output
    assert all(s > 0 for s in secs)


def test_sweeps_refuse_bad_shapes():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1024, generator=g)
    wide = quantize(torch.randn(64, 2048, generator=g), "int4")  # wider than x
    assert _sweep_output("int4", [wide], x)[0] == -1
    odd = native.VoMat(wide.data.data_ptr(), None, 64, 1000)  # not a multiple of 64
    y = torch.empty(64)
    secs = (ctypes.c_double * 1)()
    lib = native.load()
    assert lib.vo_gemv_sweeps(native.FMT_CODES["int4"], ctypes.byref(odd), 1, x.data_ptr(), 1024, y.data_ptr(), 1, 1, secs) == -1
    good = native.VoMat(wide.data.data_ptr(), None, 64, 1024)  # a shape the sweeps take: one fault per call below
    assert lib.vo_gemv_sweeps(native.FMT_CODES["int4"], ctypes.byref(good), 1, x.data_ptr(), 1024, y.data_ptr(), 1, 1, secs) == 0
    assert lib.vo_gemv_sweeps(7, ctypes.byref(good), 1, x.data_ptr(), 1024, y.data_ptr(), 1, 1, secs) == -1  # no format 7
    assert lib.vo_gemv_sweeps(native.FMT_CODES["int4"], ctypes.byref(good), 1, x.data_ptr(), 1024, y.data_ptr(), 0, 1, secs) == -1
    short_tile = native.VoMat(wide.data.data_ptr(), None, 40, 1024)  # int4 rows come in tiles of 32
    assert lib.vo_gemv_sweeps(native.FMT_CODES["int4"], ctypes.byref(short_tile), 1, x.data_ptr(), 1024, y.data_ptr(), 1, 1, secs) == -1


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
def test_weight_set_has_the_asked_size_in_whole_row_blocks(fmt):
    ws = weight_set(fmt, 5 << 20)
    assert all(m.rows % ROW_MULTIPLE == 0 and m.cols == 1024 for m in ws.mats)
    assert len(ws.mats) >= 2  # 2 MiB matrices, the last one shorter
    assert ws.nbytes == sum(m.nbytes for m in ws.mats)
    row = ws.mats[0].nbytes // ws.mats[0].rows
    assert abs(ws.nbytes - (5 << 20)) <= ROW_MULTIPLE * row / 2
    # copies of one packed matrix: the second matrix starts as the first
    assert torch.equal(ws.mats[1].data[:64], ws.mats[0].data[:64])
    with pytest.raises(ValueError, match="positive size"):
        weight_set(fmt, 0)
    with pytest.raises(ValueError, match="unknown native weight format"):
        weight_set("bf16", 1 << 20)


def test_pass_weight_set_is_the_pass_bytes():
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import MODELS

    p = FusedPredictor(random_predictor_weights(MODELS["0.6B"], seed=0), "int4", threads=1)
    ws = pass_weight_set(p)
    assert isinstance(ws, WeightSet) and len(ws.mats) == 5 * 4 + 1
    norms = sum(n.numel() * 4 for item in p.native._keep if isinstance(item, list) for n in item) + p.native.norm.numel() * 4
    assert ws.nbytes == p.pass_bytes - norms  # every byte the pass reads but its norm vectors
    assert len(gemv_sweep_seconds(ws, 1, 2)) == 2
    with pytest.raises(ValueError, match="threads and sweeps"):
        gemv_sweep_seconds(ws, 0, 2)


def test_cache_bytes_is_a_size_or_unknown():
    for level in (1, 2, 3):
        size = cache_bytes(level)
        assert size is None or (size > 0 and size % 1024 == 0)
    assert cache_bytes(9) is None


def test_bench_gemv_writes_a_valid_artifact(tmp_path):
    from vllm_omni.bench.cli import main

    assert main(["gemv", "--quick", "--weights", "int4", "--thread-counts", "1", "--output", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "cpu-path" / "gemv-speed-t1-quick.json").read_text())
    names = [c["name"] for c in data["columns"]]
    rows = [dict(zip(names, r)) for r in data["rows"]]
    assert [r["weight set"] for r in rows] == ["in L2", "in L3", "pass matrices", "memory"]
    for r in rows:
        assert r["GEMVs best"] >= r["GEMVs median"] > 0 and r["read probe"] > 0
        assert (r["pass median"] is None) == (r["weight set"] != "pass matrices")
        assert r["plain reads best"] >= r["plain reads median"] > 0
        assert r["plain reads best / probe"] == pytest.approx(r["plain reads best"] / r["read probe"], rel=0.01)
        assert r["GEMVs / plain reads"] == pytest.approx(r["GEMVs median"] / r["plain reads median"], rel=0.01)
    pass_row = rows[2]
    assert 0 < pass_row["GEMVs / pass"] < 2  # the GEMVs are part of the pass (call jitter aside)
    assert data["provenance"]["run"]["sets"]["int4/t1"]["pass matrices"]["matrices"] == 21
    assert data["provenance"]["run"]["sets"]["int4/t1"]["pass matrices"]["read_sweeps"] > 0


def test_bench_gemv_refuses_bad_lists(capsys):
    from vllm_omni.bench.cli import main

    assert main(["gemv", "--quick", "--weights", "int4,bf16"]) == 2
    assert "got 'int4,bf16'" in capsys.readouterr().err
    assert main(["gemv", "--quick", "--thread-counts", "1,x"]) == 2
    assert "expected a whole number, got 'x'" in capsys.readouterr().err
    assert main(["gemv", "--quick", "--thread-counts", "0"]) == 2


def _word_sum(t, word) -> int:
    """Sum of a tensor's bytes read as signed words of ``word`` (torch.int64 or torch.int32), mod 2^64."""
    return sum(t.contiguous().reshape(-1).view(torch.uint8).view(word).tolist()) % (1 << 64)


def _read_sweeps(fmt, mats, sweeps, threads, variant="native"):
    c_mats = (native.VoMat * len(mats))(*[vo_mat(m) for m in mats])
    secs = (ctypes.c_double * sweeps)()
    checksum = ctypes.c_int64()
    rc = native.load(variant).vo_read_sweeps(native.FMT_CODES[fmt], c_mats, len(mats), sweeps, threads, secs,
                                      ctypes.byref(checksum))
    return rc, checksum.value % (1 << 64), list(secs)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", list(native.VARIANT_FLAGS))
def test_read_sweeps_read_every_byte_the_gemvs_read_once_per_sweep(fmt, threads, variant):
    g = torch.Generator().manual_seed(5)
    packed = [quantize(torch.randn(rows, cols, generator=g), fmt) for rows, cols in ((160, 3072), (224, 1088))]
    arena, mats, _ = into_huge_arena(packed)  # 64-byte aligned, as the GEMV sweeps' sets are
    sweeps = 3
    rc, checksum, secs = _read_sweeps(fmt, mats, sweeps, threads, variant)
    assert rc == 0
    assert all(s > 0 for s in secs)
    per_sweep = sum(_word_sum(m.data, torch.int64) for m in mats)
    if fmt == "int8":  # the row scales, one 32-bit word per row
        per_sweep += sum(_word_sum(m.scale, torch.int32) for m in mats)
    assert checksum == per_sweep * sweeps % (1 << 64)
    ws = WeightSet(fmt, mats, (native.VoMat * len(mats))(*[vo_mat(m) for m in mats]), 0, arena)
    assert len(read_sweep_seconds(ws, threads, 2, variant)) == 2


def test_read_sweeps_refuse_bad_shapes_and_unaligned_rows():
    g = torch.Generator().manual_seed(6)
    arena, (m,), _ = into_huge_arena([quantize(torch.randn(64, 1024, generator=g), "int4")])
    assert _read_sweeps("int4", [m], 1, 1)[0] == 0
    lib = native.load()
    secs, checksum = (ctypes.c_double * 1)(), ctypes.c_int64()
    shifted = native.VoMat(m.data.data_ptr() + 32, None, 64, 1024)  # not on a 64-byte boundary
    assert lib.vo_read_sweeps(native.FMT_CODES["int4"], ctypes.byref(shifted), 1, 1, 1, secs, ctypes.byref(checksum)) == -1
    short_tile = native.VoMat(m.data.data_ptr(), None, 40, 1024)
    assert lib.vo_read_sweeps(native.FMT_CODES["int4"], ctypes.byref(short_tile), 1, 1, 1, secs, ctypes.byref(checksum)) == -1
    assert lib.vo_read_sweeps(native.FMT_CODES["int4"], ctypes.byref(short_tile), 0, 1, 1, secs, ctypes.byref(checksum)) == -1
    bad = WeightSet("int4", [m], (native.VoMat * 1)(shifted), 0, arena)
    with pytest.raises(RuntimeError, match="64-byte boundary"):
        read_sweep_seconds(bad, 1, 1)
    with pytest.raises(ValueError, match="threads and sweeps"):
        read_sweep_seconds(bad, 0, 1)
