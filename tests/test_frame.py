"""The frame loop with a shallow stack: codes, feedback of the embedding sum, stats, env."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu import frame as fr  # noqa: E402
from vllm_omni.cpu.reference import ReferencePredictor, ReferenceTalker  # noqa: E402
from vllm_omni.cpu.sampler import FastSampler, SamplerConfig  # noqa: E402
from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights  # noqa: E402
from vllm_omni.models.spec import get_model  # noqa: E402

SPEC = get_model("0.6B")


@pytest.fixture(scope="module")
def parts():
    tw = random_talker_weights(SPEC, layers=1)
    pw = random_predictor_weights(SPEC, layers=1)
    return tw, ReferenceTalker(tw), ReferencePredictor(pw)


class RecordingTalker:
    """Wraps a talker and keeps every input it was given."""

    def __init__(self, inner):
        self.inner, self.inputs = inner, []

    def step(self, x):
        self.inputs.append(x.clone())
        return self.inner.step(x)


def _loop(parts, talker=None, seed=0):
    tw, t, p = parts
    t.reset()
    return fr.FrameLoop(talker or t, p, FastSampler(SamplerConfig.for_model(SPEC), seed=seed), tw.codec_embedding,
                        seed=seed, sync=False)


def test_frames_codes_and_feedback(parts):
    tw, talker, pred = parts
    rec = RecordingTalker(talker)
    loop = _loop(parts, rec)
    res = loop.run(3, stop_at_eos=False)
    assert res.codes.shape == (3, 16)
    assert ((res.codes[:, 0] < 2048) | (res.codes[:, 0] == 2150)).all()
    assert ((res.codes[:, 1:] >= 0) & (res.codes[:, 1:] < 2048)).all()
    assert talker.position == 3 and len(res.stats) == 3
    text = loop.text_terms(3)
    # the input of frame t+1 is the sum of frame t's 16 embeddings plus the frame's text term
    for t in range(2):
        c = res.codes[t]
        want = tw.codec_embedding[c[0]] + text[t + 1]
        want = want + sum(pred.weights.codec_embedding[k - 1, c[k]] for k in range(1, 16))
        assert torch.allclose(rec.inputs[t + 1], want, atol=1e-4)
    assert torch.equal(rec.inputs[0], tw.codec_embedding[fr.BOS_ID] + text[0])


def test_deterministic_for_a_seed(parts):
    a = _loop(parts, seed=3).run(2, stop_at_eos=False).codes
    b = _loop(parts, seed=3).run(2, stop_at_eos=False).codes
    assert torch.equal(a, b)


def test_stats_median_and_total(parts):
    res = _loop(parts).run(2, stop_at_eos=False)
    s = res.stats[0]
    assert min(s.talker_ms, s.predictor_ms, s.sampler_ms, s.bookkeeping_ms) >= 0
    assert s.total_ms == pytest.approx(s.talker_ms + s.predictor_ms + s.sampler_ms + s.bookkeeping_ms)
    stats = [fr.StepStats(1, 10, 3, 0.5), fr.StepStats(3, 30, 1, 0.1), fr.StepStats(2, 20, 2, 0.3)]
    m = fr.StepStats.median(stats)
    assert (m.talker_ms, m.predictor_ms, m.sampler_ms, m.bookkeeping_ms) == (2, 20, 2, 0.3)
    with pytest.raises(ValueError):
        fr.StepStats.median([])


class QueuedTalker:
    """A talker step that queues ``gpu_ms`` of GPU work and returns without waiting for it,
    as a CUDA talker does (None: no GPU work)."""

    def __init__(self, gpu_ms: float | None = None):
        self.gpu_ms = gpu_ms

    def step(self, x):
        if self.gpu_ms:  # GPU clocks stay under 3 GHz (an H200's peaks near 2): at least gpu_ms
            torch.cuda._sleep(int(self.gpu_ms * 3e6))
        return torch.zeros(3072), torch.zeros(8)


class ZeroPredictor:
    def frame(self, hidden, c0_embed, *, greedy, noise_key):
        return torch.zeros(15, dtype=torch.int64), torch.zeros(8)


class FirstCodeSampler:
    def sample(self, logits):
        return 0


def test_stops_at_eos():
    class EosSampler:
        def sample(self, logits):
            return 2150

    class NoPredictor:
        def frame(self, *a, **k):
            raise AssertionError("the EOS frame is dropped before the predictor runs")

    loop = fr.FrameLoop(QueuedTalker(), NoPredictor(), EosSampler(), torch.zeros(3072, 8), sync=False)
    res = loop.run(4)
    assert res.stopped_at_eos and res.codes.shape == (0, 16) and res.stats == []


@pytest.mark.parametrize("value,want", [("1", True), ("true", True), (" ON ", True), ("yes", True),
                                        ("0", False), ("", False), ("false", False), ("no", False), ("Off", False)])
def test_sync_env_parsing(value, want, monkeypatch):
    assert fr.sync_enabled({fr.SYNC_ENV: value}) is want
    monkeypatch.setenv(fr.SYNC_ENV, value)
    assert fr.sync_enabled() is want
    loop = fr.FrameLoop(None, None, None, torch.zeros(4, 2))
    assert loop.sync is want


def test_sync_env_unset(monkeypatch):
    monkeypatch.delenv(fr.SYNC_ENV, raising=False)
    assert fr.sync_enabled() is False


@pytest.mark.parametrize("value", ["yse", "2", "enable"])
def test_sync_env_typo_is_refused(value, monkeypatch, tmp_path, capsys):
    from vllm_omni.bench.cli import main

    monkeypatch.setenv(fr.SYNC_ENV, value)
    message = f"{fr.SYNC_ENV}={value!r} is not understood; set it to one of 1, true"
    with pytest.raises(ValueError, match=message):
        fr.FrameLoop(None, None, None, torch.zeros(4, 2))
    assert main(["frame", "--quick", "--threads", "1", "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err and not any(tmp_path.iterdir())


@pytest.mark.parametrize("frames", [0, -1, 2.0])
def test_run_refuses_a_frame_count_below_one(frames):
    loop = fr.FrameLoop(None, None, None, torch.zeros(4, 2), sync=False)
    with pytest.raises(ValueError, match="frames must be a whole number >= 1"):
        loop.run(frames)


def test_sync_on_cpu_is_a_no_op(monkeypatch):
    """On the CPU (or no device) nothing waits, even where CUDA is available; a CUDA device waits."""
    waits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(str(device)))
    fr._synchronize("cpu")
    fr._synchronize(torch.device("cpu"))
    fr._synchronize(None)
    assert waits == []
    fr._synchronize("cuda:1")
    assert waits == ["cuda:1"]


@pytest.mark.parametrize("sync", [True, False])
def test_sync_waits_around_each_timer_on_a_cuda_device(sync, monkeypatch):
    """With sync on and a CUDA device, each of a frame's six timestamps waits for the device first."""
    waits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(str(device)))
    loop = fr.FrameLoop(QueuedTalker(), ZeroPredictor(), FirstCodeSampler(), torch.zeros(3072, 8),
                        device="cuda:0", sync=sync)
    assert len(loop.run(2).stats) == 2
    assert waits == (["cuda:0"] * 12 if sync else [])


@pytest.mark.gpu
def test_sync_puts_queued_gpu_work_in_the_talker_time():
    """Without sync, work a talker queued on the GPU lands in no timer of the frame; with sync it
    lands in the talker's. The GPU work is at least 100 ms; the margins are tens of milliseconds."""
    def talker_ms(sync: bool) -> float:
        loop = fr.FrameLoop(QueuedTalker(gpu_ms=100), ZeroPredictor(), FirstCodeSampler(), torch.zeros(3072, 8),
                            device="cuda", sync=sync)
        torch.cuda.synchronize()
        stats = loop.run(1).stats[0]
        torch.cuda.synchronize()
        return stats.talker_ms

    talker_ms(True)  # the first launch loads the kernel
    assert talker_ms(True) >= 90
    assert talker_ms(False) < 50


def test_talker_benchmark_quick_writes_artifact(tmp_path):
    import json

    from vllm_omni.bench.cli import main

    argv = ["talker", "--quick", "--layers", "1", "--cache", "4", "--repeats", "2", "--threads", "1",
            "--impl", "reference", "--output", str(tmp_path)]
    assert main(argv) == 0
    # a shallow stack is named for its depth, so it never takes a full run's file
    data = json.loads((tmp_path / "cpu-path" / "talker-reference-fp32-t1-l1-quick.json").read_text())
    layers, kv_first, kv_last, repeats = data["rows"][0][:4]
    assert (layers, kv_first, kv_last, repeats) == (1, 6, 7, 2)


def test_benchmark_rejects_bad_layers(capsys):
    from vllm_omni.bench.cli import main

    assert main(["talker", "--quick", "--layers", "99", "--impl", "reference"]) == 2
    assert "--layers must be in 1..28" in capsys.readouterr().err
