"""``vllm-omni-bench hosts``: one row per host, from every measured run on it.

The committed artifact's freshness is tests/test_computed_artifacts.py's; here, the rows are
checked against the artifacts they come from, and against an edited copy of the results tree.
"""

from __future__ import annotations

import shutil
import statistics

import pytest

from vllm_omni.bench import hosts
from vllm_omni.bench.common import BenchError
from vllm_omni.bench.targets import host_label
from vllm_omni.results import load_all
from vllm_omni.testing.results_tree import copy_results, edit_artifact

NAMES = [c["name"] for c in hosts.COLUMNS]


def _by_host(root=None) -> dict[str, dict]:
    return {r[0]: dict(zip(NAMES, r)) for r in hosts.rows(root)}




def test_each_row_is_the_median_and_range_of_its_hosts_frames():
    arts = load_all()
    frames: dict[str, list[float]] = {}
    for art_id, art in arts.items():
        p = art.provenance
        if (art.origin == "measured" and p.get("source") == "vllm-omni-bench frame (fused)" and p.get("model") == hosts.MODEL
                and p.get("quantization") == "int4" and p.get("threads") == 2):
            total = next(r[1] for r in art.rows if r[0] == "total")
            frames.setdefault(host_label(p["host"]), []).append(total)
    table = _by_host()
    assert len(frames) >= 4 and set(frames) <= set(table)
    for label, values in frames.items():
        row = table[label]
        assert row["frame runs"] == len(values)
        assert row["int4 frame"] == pytest.approx(statistics.median(values), abs=1e-3)
        assert (row["frame min"], row["frame max"]) == (min(values), max(values))
        assert row["frame RTF"] == pytest.approx(row["int4 frame"] / 80, abs=1e-3)
    for row in table.values():  # every row names its sources, and a host without a kind of run has nulls there
        assert row["artifacts"] and all(a in arts for a in row["artifacts"].split(", "))
        if row["frame runs"] == 0:
            assert row["int4 frame"] is None and row["frame RTF"] is None
        if row["speech runs"] == 0:
            assert row["speech RTF"] is None and row["first audio"] is None


def test_speech_takes_the_decoder_speak_picks():
    zen4 = _by_host()["AMD EPYC (family 25, model 17), AVX-512, 2 cores"]
    art = load_all()["end-to-end/speak-0.6b-zen4"]
    rtf = {r[0]: r[art.column_index("RTF")] for r in art.rows}
    assert zen4["speech RTF"] == rtf["ours int4 t2 streaming bf16 decoder"] != rtf["ours int4 t2 streaming"]


def test_a_run_on_another_build_is_not_its_hosts():
    """``speak --build no-bf16`` runs this Xeon as a CPU without AMX and BF16: not the Xeon's own speed."""
    arts = load_all()
    other = [i for i, a in arts.items() if (a.provenance.get("run") or {}).get("build", "native") != "native"]
    assert "end-to-end/speak-0.6b-f6m167-no-bf16" in other
    listed = ", ".join(r["artifacts"] for r in _by_host().values())
    assert not any(i in listed.split(", ") for i in other)


def test_a_new_run_joins_its_hosts_row(tmp_path):
    root = copy_results(tmp_path)
    shutil.copy(root / "cpu-path/frame-fused-int4-t2-zen1.json", root / "cpu-path/frame-fused-int4-t2-zen1-run9.json")
    edit_artifact(root, "cpu-path/frame-fused-int4-t2-zen1-run9", lambda d: d.update(id="cpu-path/frame-fused-int4-t2-zen1-run9"))
    before = _by_host()["AMD EPYC (family 23, model 1), AVX2, 2 cores"]
    after = _by_host(root)["AMD EPYC (family 23, model 1), AVX2, 2 cores"]
    assert after["frame runs"] == before["frame runs"] + 1
    assert "cpu-path/frame-fused-int4-t2-zen1-run9" in after["artifacts"]


def test_a_frame_without_its_total_is_refused_naming_the_file(tmp_path):
    root = copy_results(tmp_path)
    edit_artifact(root, "cpu-path/frame-fused-int4-t2-zen1", lambda d: d.update(rows=[r for r in d["rows"] if r[0] != "total"]))
    with pytest.raises(BenchError, match=r"frame-fused-int4-t2-zen1.json: rows: no 'total' row"):
        hosts.rows(root)
