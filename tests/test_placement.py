"""The core-to-core round trip and the placement timeline (vllm_omni.cpu.placement)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_omni.bench import cli
from vllm_omni.cpu import placement
from vllm_omni.results import provenance

TWO_CPUS = pytest.mark.skipif(provenance.usable_cpus() < 2, reason="a round trip between two cores needs two CPUs")


def measured(fn, *args, **kwargs):
    """``fn``'s result, or a skip saying why when a busy host kept the probe's two threads apart (a
    figure that cannot be taken is not a failure; a broken probe still fails)."""
    try:
        return fn(*args, **kwargs)
    except placement.PlacementUnmeasured as exc:
        pytest.skip(str(exc))


@TWO_CPUS
def test_round_trip_between_two_cores_is_plausible():
    ns = measured(placement.round_trip_ns, trips=2000)
    # a cache line handed over and back: more than a few ns, far less than a scheduler's timeslice
    assert 5 < ns < 20_000


def test_the_native_probe_refuses_no_trips():
    from vllm_omni.cpu import native

    assert native.load().vo_core_round_trip_ns(0) == 0.0


class FakeProbe:
    def __init__(self, values):
        self.values = list(values)

    def vo_core_round_trip_ns(self, trips):
        return self.values.pop(0)


@pytest.mark.parametrize("values, expect", [
    ([-1.0, -1.0, -1.0], placement.PlacementUnmeasured),  # busy host: no figure, reported as such
    ([-1.0, 80.0, 90.0], 85.0),  # the probes that ran at once give the figure
    ([0.0, 80.0, 90.0], placement.PlacementError),  # a probe returning nothing for trips is broken
    ([-7.0, -1.0, -1.0], placement.PlacementError),
])
def test_an_unmeasurable_round_trip_is_told_apart_from_a_broken_probe(monkeypatch, values, expect):
    from vllm_omni.cpu import native

    monkeypatch.setattr(provenance, "usable_cpus", lambda: 2)
    monkeypatch.setattr(native, "load", lambda: FakeProbe(values))
    if isinstance(expect, float):
        assert placement.round_trip_ns(trips=10, probes=3) == expect
        return
    with pytest.raises(expect) as info:
        placement.round_trip_ns(trips=10, probes=3)
    assert (info.type is placement.PlacementUnmeasured) == (expect is placement.PlacementUnmeasured)


def test_two_threads_on_one_cpu_give_up_rather_than_time_the_scheduler():
    cpu = min(os.sched_getaffinity(0))
    code = ("import os; os.sched_setaffinity(0, {%d}); from vllm_omni.cpu import native; "
            "print(native.load().vo_core_round_trip_ns(100000))" % cpu)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout.split()[-1]) == -1.0


def test_one_usable_cpu_is_refused_with_what_to_do(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(provenance, "usable_cpus", lambda: 1)
    with pytest.raises(placement.PlacementError, match="two usable CPUs"):
        placement.round_trip_ns()
    assert cli.main(["placement", "--quick", "--output", str(tmp_path)]) == 2
    assert "two usable CPUs" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


@TWO_CPUS
def test_quick_timeline_writes_every_sample(tmp_path, capsys):
    rc = cli.main(["placement", "--quick", "--samples", "2", "--output", str(tmp_path)])
    if rc == 2 and "could not be measured" in capsys.readouterr().err:
        pytest.skip("a busy host kept the round-trip probe's two threads apart")
    assert rc == 0
    art = json.loads((tmp_path / "cpu-path" / "placement-t2-quick.json").read_text())
    names = [c["name"] for c in art["columns"]]
    assert names == ["sample", "seconds", "round trip before", "stream read", "round trip between",
                     "working-set read", "round trip after"]
    assert [r[0] for r in art["rows"]] == [0, 1]
    for row in art["rows"]:
        values = dict(zip(names, row))
        assert all(values[k] > 0 for k in names[2:])
    assert art["rows"][0][1] < art["rows"][1][1]  # samples in time order
    run = art["provenance"]["run"]
    assert run["round_trip_trips"] == placement.TRIPS and run["working_set_bytes"] > 40e6
    assert "core_clock_ghz" in run


def test_recorded_round_trip_is_none_where_it_cannot_tell(monkeypatch):
    assert placement.recorded_round_trip(1) is None
    monkeypatch.setattr(provenance, "usable_cpus", lambda: 1)
    assert placement.recorded_round_trip(2) is None


@TWO_CPUS
def test_two_thread_runs_record_each_rounds_round_trip(tmp_path):
    assert cli.main(["predictor", "--quick", "--impl", "fused", "--weights", "int4", "--thread-counts", "1,2",
                     "--rounds", "2", "--output", str(tmp_path), "--name", "p"]) == 0
    trips = json.loads((tmp_path / "cpu-path" / "p-quick.json").read_text())["provenance"]["run"]["core_round_trip_ns"]
    assert list(trips) == ["2"] and len(trips["2"]) == 2  # one thread has no pair of cores to time
    assert all(len(pair) == 2 and all(v > 0 for v in pair) for pair in trips["2"])
    assert cli.main(["frame", "--quick", "--impl", "fused", "--weights", "int4", "--threads", "2",
                     "--output", str(tmp_path), "--name", "f"]) == 0
    trips = json.loads((tmp_path / "cpu-path" / "f-quick.json").read_text())["provenance"]["run"]["core_round_trip_ns"]
    assert set(trips) == {"frames_start", "frames_end", "probes_end"} and all(v > 0 for v in trips.values())
