"""Talker samplers (eager and fast pick the same ids) and residual-code sampling."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu import sampler as sm  # noqa: E402


def _logits(g, scale=3.0):
    return torch.randn(3072, generator=g) * scale


@pytest.mark.parametrize("seed", range(40))
def test_eager_and_fast_choose_identical_ids(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    eager, fast = sm.EagerSampler(seed=seed), sm.FastSampler(seed=seed)
    for _ in range(8):
        logits = _logits(g)
        # bias a few ids upward so the repetition penalty has repeats to act on
        logits[:4] += 6.0
        assert eager.sample(logits) == fast.sample(logits)
    assert eager.history == fast.history


def test_identical_with_top_p_below_one():
    cfg = sm.SamplerConfig(top_p=0.8)
    g = torch.Generator().manual_seed(0)
    eager, fast = sm.EagerSampler(cfg, seed=1), sm.FastSampler(cfg, seed=1)
    for _ in range(20):
        logits = _logits(g)
        assert eager.sample(logits) == fast.sample(logits)


@pytest.mark.parametrize("kind", ["eager", "fast"])
def test_codebook0_mask_and_min_new_tokens(kind):
    s = sm.make_sampler(kind, seed=0)
    logits = torch.full((3072,), -5.0)
    logits[2150] = 50.0  # EOS dominates ...
    logits[2500] = 60.0  # ... and a suppressed special id dominates even more
    first = [s.sample(logits) for _ in range(2)]
    assert all(t < 2048 for t in first)  # EOS masked for min_new_tokens = 2 steps
    assert s.sample(logits) == 2150  # then allowed; 2500 never
    assert all(t != 2500 for t in s.history)


@pytest.mark.parametrize("kind", ["eager", "fast"])
def test_top_k_only_samples_among_top_50(kind):
    s = sm.make_sampler(kind, sm.SamplerConfig(repetition_penalty=1.0), seed=2)
    logits = torch.linspace(0, 1, 3072)[torch.randperm(3072, generator=torch.Generator().manual_seed(0))]
    logits[2048:] = -100
    top = set(torch.topk(logits, 50).indices.tolist())
    assert all(s.sample(logits) in top for _ in range(100))
    assert len(set(s.history)) > 10  # flat logits: it really samples


def test_repetition_penalty_hf_semantics():
    """Penalty divides positive and multiplies negative logits of already generated ids."""
    cfg = sm.SamplerConfig(temperature=1.0, top_k=2, repetition_penalty=2.0, min_new_tokens=0)
    for kind in ("eager", "fast"):
        s = sm.make_sampler(kind, cfg, seed=0)
        s._record(7), s._record(9)  # as if 7 and 9 had been generated
        logits = torch.full((3072,), -1000.0)
        logits[7], logits[9], logits[11], logits[12] = 30.0, -0.5, 16.0, -0.9
        # after the penalty: 7 -> 15 (< 16), 9 -> -1.0 (< -0.9): the top 2 are {11, 7}
        picks = {s.sample(logits.clone()) for _ in range(50)}
        assert picks <= {11, 7}, kind


def test_same_seed_same_stream_and_reset():
    s = sm.FastSampler(seed=5)
    g = torch.Generator().manual_seed(9)
    logits = [_logits(g) for _ in range(5)]
    a = [s.sample(x) for x in logits]
    s.reset()
    assert [s.sample(x) for x in logits] == a
    s.reset(seed=6)
    assert [s.sample(x) for x in logits] != a


def test_make_sampler_rejects_unknown():
    with pytest.raises(ValueError, match="unknown sampler"):
        sm.make_sampler("nope")


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 0.0, "temperature must be a finite number > 0"),
    ("temperature", -1.0, "temperature must be a finite number > 0"),
    ("temperature", float("nan"), "temperature must be a finite number > 0"),
    ("top_k", 0, "top_k must be a whole number in 1..3072"),
    ("top_k", 3073, "top_k must be a whole number in 1..3072"),
    ("top_k", 2.5, "top_k must be a whole number in 1..3072"),
    ("top_p", 0.0, "top_p must be in"),
    ("top_p", 1.5, "top_p must be in"),
    ("repetition_penalty", 0.0, "repetition_penalty must be a finite number > 0"),
    ("min_new_tokens", -1, "min_new_tokens must be >= 0"),
    ("eos_id", 3072, "eos_id must be in 0..3071"),
    ("codebook_size", 4096, "codebook_size must be in 1..vocab"),
])
def test_sampler_config_refuses_what_no_sampler_can_honour(field, value, message):
    with pytest.raises(ValueError, match=message):
        sm.SamplerConfig(**{field: value})


@pytest.fixture(scope="module")
def one_layer_predictors():
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.reference import ReferencePredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import MODELS

    w = random_predictor_weights(MODELS["0.6B"], seed=0, layers=1)
    return ReferencePredictor(w, "fp32"), FusedPredictor(w, "fp32", threads=1)


@pytest.mark.parametrize("temperature, top_k, message", [
    (0.0, 50, "temperature must be a finite number > 0, got 0.0"),
    (float("inf"), 50, "temperature must be a finite number > 0"),
    (0.9, 0, "top_k must be a whole number in 1..2048, got 0"),
    (0.9, 2049, "top_k must be a whole number in 1..2048, got 2049"),
])
def test_residual_sampling_refuses_the_same_settings_everywhere(temperature, top_k, message, one_layer_predictors):
    """The eager reference, the fused predictor and residual_choice refuse alike, before any work."""
    u = sm.draw_uniforms(torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=message):
        sm.residual_choice(torch.zeros(2048), greedy=False, temperature=temperature, top_k=top_k, uniforms=u[0])
    ph, c0 = torch.zeros(1024), torch.zeros(1024)
    for predictor in one_layer_predictors:
        with pytest.raises(ValueError, match=message):
            predictor.frame(ph, c0, greedy=False, temperature=temperature, top_k=top_k, uniforms=u)
        assert predictor.frame(ph, c0, greedy=True, temperature=temperature, top_k=top_k)[0].shape == (15,)


def test_residual_choice_greedy_and_gumbel():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2048, generator=g)
    assert sm.residual_choice(logits, greedy=True) == int(logits.argmax())
    u = sm.draw_uniforms(torch.Generator().manual_seed(1))
    assert u.shape == (15, 2048) and 0 <= float(u.min()) and float(u.max()) < 1
    c = sm.residual_choice(logits, greedy=False, uniforms=u[0])
    top = torch.topk(logits / 0.9, 50)
    gumbel = -torch.log(-torch.log(u[0]))
    want = int(top.indices[torch.argmax(top.values + gumbel[top.indices])])
    assert c == want and c in set(top.indices.tolist())
    # near-uniform noise on a sharply peaked distribution still picks the peak
    peaked = torch.zeros(2048)
    peaked[17] = 100.0
    assert sm.residual_choice(peaked, greedy=False, uniforms=u[3]) == 17


def test_sampler_benchmark_quick_writes_artifact(tmp_path):
    import json

    from vllm_omni.bench.cli import main

    assert main(["sampler", "--quick", "--threads", "1", "--repeats", "3", "--output", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "cpu-path" / "sampler-t1-quick.json").read_text())
    assert data["origin"] == "measured" and len(data["rows"]) == 4
    assert "peak_rss_mib" in data["provenance"]["run"]


def test_counter_uniforms_are_open_unit_interval_and_uniform():
    u = sm.counter_uniforms(sm.frame_noise_key(0, 0))
    assert u.shape == (15, 2048) and u.dtype == torch.float32
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # 30720 draws: mean 0.5 +- 3 sigma (sigma = 1/sqrt(12 n) ~ 0.0016); deciles near 0.1 apart
    assert abs(float(u.mean()) - 0.5) < 0.005
    hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert torch.all((hist - 0.1).abs() < 0.01), hist


def test_counter_uniforms_depend_on_key_and_are_reproducible():
    a = sm.counter_uniforms(sm.frame_noise_key(1, 2))
    assert torch.equal(a, sm.counter_uniforms(sm.frame_noise_key(1, 2)))
    assert not torch.equal(a, sm.counter_uniforms(sm.frame_noise_key(1, 3)))
    assert not torch.equal(a, sm.counter_uniforms(sm.frame_noise_key(2, 2)))
    with pytest.raises(ValueError, match="uint64"):
        sm.counter_uniforms(-1)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_native_and_torch_fast_paths_choose_identical_ids(top_p):
    """The native one-pass sampler and its PyTorch stand-in: same ids over 60 steps with a
    growing penalty history, the EOS mask of the first steps and (here) a nucleus filter."""
    config = sm.SamplerConfig(top_p=top_p)
    native = sm.FastSampler(config, seed=5, native=True)
    torch_path = sm.FastSampler(config, seed=5, native=False)
    eager = sm.EagerSampler(config, seed=5)
    g = torch.Generator().manual_seed(9)
    for _ in range(60):
        logits = torch.randn(3072, generator=g) * 3
        a, b = native.sample(logits), torch_path.sample(logits)
        assert a == b
        if top_p == 1.0:
            assert eager.sample(logits) == a
    assert native.history == torch_path.history and len(set(native.history)) > 5


def test_talker_noise_is_apart_from_the_residual_noise():
    s = sm.FastSampler(seed=0)
    key = s.noise_key
    assert key == sm.frame_noise_key(0, 0)
    talker = sm.counter_uniforms(key, 1, 3072, base=sm.TALKER_NOISE_BASE)[0]
    residual = sm.counter_uniforms(key)
    assert not torch.equal(talker[:2048], residual[0])
    assert torch.equal(-torch.log(talker), s.draw())
