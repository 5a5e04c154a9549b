"""The core clock a CPU benchmark records at its start and end (vllm_omni.cpu.clock)."""

from __future__ import annotations

import json
import platform

import pytest

from vllm_omni.bench import cli
from vllm_omni.cpu import clock

X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.mark.skipif(not X86, reason="the dependent-add chain is x86-64 only; elsewhere the clock is null")
def test_probe_reads_a_plausible_clock():
    ghz = clock.probe()
    assert ghz is not None and 0.5 < ghz < 7.0


def test_the_native_probe_refuses_a_chain_too_short_to_time():
    from vllm_omni.cpu import native

    assert native.load().vo_clock_ghz(999) == 0.0


def test_mark_and_clear_decide_what_an_artifact_records(monkeypatch):
    readings = iter([2.4, 2.1])
    monkeypatch.setattr(clock, "probe", lambda: next(readings))
    clock.mark()
    assert clock.since_mark() == {"core_clock_ghz": {"start": 2.4, "end": 2.1}}
    clock.clear()
    assert clock.since_mark() == {}


def test_timed_cpu_runs_record_the_clock_and_other_commands_do_not(tmp_path):
    assert cli.main(["sampler", "--quick", "--threads", "1", "--output", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "cpu-path" / "sampler-t1-quick.json").read_text())["provenance"]["run"]
    assert set(run["core_clock_ghz"]) == {"start", "end"}
    if X86:
        assert all(0.5 < v < 7.0 for v in run["core_clock_ghz"].values())
    assert cli.main(["env", "--output", str(tmp_path)]) == 0
    (env,) = (tmp_path / "environment").glob("*.json")
    assert "core_clock_ghz" not in json.loads(env.read_text())["provenance"]["run"]


def test_which_subcommands_record_the_clock():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    timed = {name for name, p in sub.choices.items() if p.get_default("core_clock")}
    assert timed == {"batch-steps", "bandwidth", "busy-cores", "clone", "decoder-split", "engines", "frame", "gemv", "llamacpp", "placement", "predictor", "sampler",
                     "serve-formats", "serve-load", "speak", "talker", "vllm-inprocess", "vllm-two-engines"}
