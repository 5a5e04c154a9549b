"""The read-bandwidth probe: correctness only (a positive figure, an artifact that validates)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_quick_probe_returns_positive_gbps():
    from vllm_omni.cpu.bandwidth import measure_read_bandwidth, read_bandwidth_probes

    gbs = measure_read_bandwidth(1, quick=True)
    assert isinstance(gbs, float) and gbs > 0
    probes = read_bandwidth_probes(1, quick=True)
    assert set(probes) == {"native", "torch", "best"}
    assert probes["best"] == max(probes["native"], probes["torch"])
    assert probes["native"] > 0 and probes["torch"] > 0


def test_bench_bandwidth_writes_a_valid_artifact(tmp_path):
    from vllm_omni.bench.cli import main

    assert main(["bandwidth", "--quick", "--threads", "1", "--output", str(tmp_path)]) == 0
    path = tmp_path / "cpu-path" / "read-bandwidth-quick.json"
    data = json.loads(path.read_text())
    assert data["origin"] == "measured"
    assert data["rows"][0][0] == 1 and data["rows"][0][3] > 0
