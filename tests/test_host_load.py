"""Steal and other load over a run: read from /proc/stat, this process's time taken out."""

from __future__ import annotations

import pytest

from vllm_omni.bench import cli
from vllm_omni.results import host_load
from vllm_omni.results.host_load import Snapshot, shares, snapshot


def _stat(tmp_path, user, idle, steal, system=0):
    path = tmp_path / "stat"
    path.write_text(f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    return path


def test_snapshot_reads_the_aggregate_line(tmp_path):
    snap = snapshot(_stat(tmp_path, user=300, idle=600, steal=100, system=50))
    assert (snap.total, snap.steal, snap.busy) == (1050, 100, 350)
    assert snap.own >= 0


@pytest.mark.parametrize("text", ["", "intr 1 2 3\n", "cpu 1 2 3\n"])
def test_an_unreadable_stat_gives_nulls(tmp_path, text):
    path = tmp_path / "stat"
    path.write_text(text)
    assert snapshot(path) is None
    assert shares(None, snapshot()) == {"host_steal_share": None, "host_other_busy_share": None}
    assert snapshot(tmp_path / "missing") is None


def test_shares_take_this_process_out_of_the_busy_time():
    start = Snapshot(total=1000, steal=10, busy=300, own=100.0)
    end = Snapshot(total=2000, steal=60, busy=900, own=400.0)  # 600 busy ticks, 300 of them ours
    assert shares(start, end) == {"host_steal_share": 0.05, "host_other_busy_share": 0.3}
    mine_only = Snapshot(total=2000, steal=10, busy=900, own=800.0)  # rounding of our own time
    assert shares(start, mine_only)["host_other_busy_share"] == 0.0
    assert shares(end, start) == {"host_steal_share": None, "host_other_busy_share": None}


def test_measured_provenance_carries_both_shares():
    from vllm_omni.results import provenance

    run = provenance.capture(source="test", model=None, weights=None, quantization=None, threads=1)["run"]
    assert set(run) >= {"peak_rss_mib", "host_steal_share", "host_other_busy_share"}
    if snapshot() is not None:  # Linux
        assert 0 <= run["host_steal_share"] <= 1 and 0 <= run["host_other_busy_share"] <= 1


def test_the_cli_starts_the_window_before_each_command(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(host_load, "mark", lambda: calls.append("mark"))
    assert cli.main(["targets", "--no-write"]) == 0
    assert calls == ["mark"]
