"""The engine beside other work: the free-core watch, and no collapse when another process keeps a core busy.

The watch is checked on written ``/proc/stat`` files with a clock and CPU time the test sets. The
collapse test runs the ``qwen3-tts-edge speak`` command beside a PyTorch matmul loop (the
competing load that made the engine 13-33 times slower than one thread), at the default threads and
at one, and compares the two in one run: a ratio, not a wall-clock threshold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_omni.bench import competing_load
from vllm_omni.cpu.free_cores import CoreWatch, busy_seconds
from vllm_omni.results.provenance import usable_cpus
from vllm_omni.tts.random_checkpoint import write_random_checkpoint

SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)
HZ = os.sysconf("SC_CLK_TCK")


class Host:
    """A /proc/stat of two CPUs whose busy ticks the test advances, with its clock and our CPU time."""

    def __init__(self, path: Path, cpus: int = 2):
        self.path, self.cpus = path, cpus
        self.t, self.own, self.busy = 0.0, 0.0, [0] * cpus
        self.write()

    def write(self) -> None:
        lines = [f"cpu  {sum(self.busy)} 0 0 1000 0 0 0 0 0 0"]
        lines += [f"cpu{i} {b} 0 0 500 0 0 0 0 0 0" for i, b in enumerate(self.busy)]
        self.path.write_text("\n".join(lines + ["intr 0", "procs_running 1"]) + "\n")

    def run(self, seconds: float, others: float, ours: float = 0.0) -> None:
        """``seconds`` pass while other work uses ``others`` cores and this process ``ours``."""
        self.t += seconds
        self.own += ours * seconds
        for i in range(self.cpus):
            self.busy[i] += round((others + ours) * seconds * HZ / self.cpus)
        self.write()

    def watch(self) -> CoreWatch:
        return CoreWatch(cpus=frozenset(range(self.cpus)), stat=self.path, clock=lambda: self.t, own=lambda: self.own)


def test_busy_seconds_reads_only_the_given_cpus(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {3 * HZ} 0 0 0 0 0 0 0\ncpu0 {HZ} 0 0 9 0 0 0 0\ncpu1 0 0 {2 * HZ} 9 0 0 0 {HZ}\n")
    assert busy_seconds(frozenset({0}), stat) == 1.0
    assert busy_seconds(frozenset({1}), stat) == 3.0  # system and steal count as busy
    assert busy_seconds(frozenset({0, 1}), tmp_path / "missing") is None


def test_a_busy_core_is_taken_and_given_back(tmp_path):
    host = Host(tmp_path / "stat")
    watch = host.watch()
    assert watch.threads(2) == 2  # no reading yet: nothing taken
    host.run(0.3, others=0.1, ours=1.9)
    assert watch.threads(2) == 2 and watch.others == pytest.approx(0.1, abs=0.05)
    host.run(0.3, others=1.0, ours=1.0)
    assert watch.threads(2) == 1 and watch.taken == 1
    host.run(0.05, others=0.0, ours=1.0)  # within the period: the last reading stands
    assert watch.threads(2) == 1
    host.run(0.3, others=0.4, ours=1.0)  # under half a core but above the release line: still taken
    assert watch.threads(2) == 1
    host.run(0.3, others=0.2, ours=1.5)
    assert watch.threads(2) == 2 and watch.taken == 0
    host.run(0.3, others=2.0)
    assert watch.threads(2) == 1  # never fewer than one thread
    assert watch.threads(1) == 1


def test_our_own_work_never_counts_as_others(tmp_path):
    host = Host(tmp_path / "stat")
    watch = host.watch()
    host.run(0.5, others=0.0, ours=2.0)
    assert watch.threads(2) == 2 and watch.others == pytest.approx(0.0, abs=0.05)


def test_the_first_reading_comes_early(tmp_path):
    host = Host(tmp_path / "stat")
    watch = host.watch()
    host.run(0.12, others=1.0, ours=1.0)
    assert watch.threads(2) == 1


def test_without_proc_stat_nothing_is_taken(tmp_path):
    watch = CoreWatch(cpus=frozenset({0, 1}), stat=tmp_path / "missing")
    assert watch.threads(2) == 2 and watch.others is None


def test_competing_load_refuses_an_unknown_kind():
    assert competing_load.parse("idle") == [] and competing_load.parse("spin+torch") == ["spin", "torch"]
    with pytest.raises(ValueError, match="'spin\\+spn'"):
        competing_load.parse("spin+spn")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("busy") / "tiny", "0.6B", dtype="fp32", **SHAPE)


def test_fit_threads_moves_every_part_of_the_step(tiny_dir, tmp_path):
    from vllm_omni.tts.pipeline import Speech

    speech = Speech.load(tiny_dir, weights="fp32", threads=2, max_positions=128)
    gen = speech.generator
    host = Host(tmp_path / "stat")
    gen.cores = host.watch()
    host.run(0.3, others=1.0, ours=1.0)
    before = torch.get_num_threads()
    try:
        speech.synthesize("Hello there.", speaker="ryan", language="english", max_frames=3, greedy=True)
        assert speech.last_stats.generation.threads == [1, 1, 1]
        assert gen.talker.threads == gen.predictor.threads == torch.get_num_threads() == 1
        host.run(0.3, others=0.0, ours=2.0)
        speech.synthesize("Hello there.", speaker="ryan", language="english", max_frames=3, greedy=True)
        assert speech.last_stats.generation.threads == [2, 2, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    fixed = Speech(speech.ckpt, weights="fp32", threads=2, max_positions=128, share_cores=False)
    assert fixed.generator.cores is None and fixed.generator.fit_threads() == 2


def _speak(tiny_dir: Path, tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.wav"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    cmd = [str(Path(sys.executable).parent / "qwen3-tts-edge"), "speak", "--model", str(tiny_dir), "--text",
           "Hello there, this is a test of the engine.", "--speaker", "ryan", "--language", "english",
           "--max-frames", "24", "--out", str(out), "--quiet", "--stats-json", str(tmp_path / f"{name}.json"), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())


@pytest.mark.skipif(usable_cpus() < 2, reason="a busy core beside the engine needs two usable CPUs")
def test_no_collapse_beside_a_busy_process(tiny_dir, tmp_path):
    _speak(tiny_dir, tmp_path, "warm-up")  # packs and caches the int4 weights
    with competing_load.running("torch"):
        default = _speak(tiny_dir, tmp_path, "default")
        one = _speak(tiny_dir, tmp_path, "one", "--threads", "1")
    ratio = default["total_s"] / one["total_s"]
    # before the engine fitted its threads to the free cores this was 4-30 on a 2-core Xeon
    assert ratio < 2.5, (f"beside a PyTorch matmul loop the default threads took {default['total_s']:.2f} s, "
                         f"{ratio:.1f} times one thread's {one['total_s']:.2f} s (threads per frame: "
                         f"{default['threads']})")
    assert default["max_threads"] == usable_cpus() and one["threads"] == [1] * 24
