"""The AVX2 build's int4 prefetch: chosen per host, overridable, never changing a result."""

from __future__ import annotations

import pytest

from vllm_omni.cpu import native
from vllm_omni.results import provenance

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("cpu_id", "groups"), [
    ("family 23, model 1, stepping 2", 8),  # measured to gain about a third
    ("family 25, model 17, stepping 1", 0),  # measured to lose an eighth to two fifths (AVX2 build)
    ("family 6, model 207, stepping 2", 0),  # not measured: none
    (None, 0),
])
def test_the_default_follows_the_hosts_measured(monkeypatch, cpu_id, groups):
    monkeypatch.delenv(native.Q4_PREFETCH_ENV, raising=False)
    monkeypatch.setattr(provenance, "cpuinfo", lambda: {"cpu_id": cpu_id})
    assert native.q4_prefetch_groups() == groups


@pytest.mark.parametrize("text", ["0", "8", "64"])
def test_the_variable_overrides_the_default(monkeypatch, text):
    monkeypatch.setenv(native.Q4_PREFETCH_ENV, text)
    assert native.q4_prefetch_groups() == int(text)


@pytest.mark.parametrize("text", ["x", "-1", "65", "8.5", ""])
def test_a_bad_setting_is_refused_with_what_to_do(monkeypatch, text):
    monkeypatch.setenv(native.Q4_PREFETCH_ENV, text)
    with pytest.raises(ValueError, match=rf"VLLM_OMNI_Q4_PREFETCH={text!r} is not a whole number .* unset it"):
        native.q4_prefetch_groups()


X86 = pytest.mark.skipif("avx2" not in native.VARIANT_FLAGS, reason="the AVX2 build is x86's (this host is ARM)")


@X86
def test_only_the_avx2_build_has_the_prefetch():
    lib = native.load("avx2")
    before = native.q4_prefetch("avx2")
    assert before == native.q4_prefetch_groups()
    try:
        assert lib.vo_set_q4_prefetch(3) == 3 and lib.vo_set_q4_prefetch(65) == -1 and lib.vo_set_q4_prefetch(-1) == -1
    finally:
        lib.vo_set_q4_prefetch(before)
    assert native.q4_prefetch("generic") is None and native.load("generic").vo_set_q4_prefetch(8) == -1
    if native.isa() == "AVX-512 VNNI":
        assert native.q4_prefetch() is None


@X86
def test_prefetching_changes_no_bit_of_an_int4_frame():
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import MODELS

    spec = MODELS["0.6B"]
    w = random_predictor_weights(spec, seed=5, layers=1)
    g = torch.Generator().manual_seed(6)
    ph, c0 = torch.randn(spec.talker.hidden, generator=g), torch.randn(spec.talker.hidden, generator=g)
    lib = native.load("avx2")
    before = native.q4_prefetch("avx2")
    out = {}
    try:
        for groups in (0, 8):
            assert lib.vo_set_q4_prefetch(groups) == groups
            codes, _, logits = FusedPredictor(w, "int4", threads=2, variant="avx2").frame(ph, c0, return_logits=True)
            out[groups] = (codes.tolist(), logits.clone())
    finally:
        lib.vo_set_q4_prefetch(before)
    assert out[0][0] == out[8][0] and torch.equal(out[0][1], out[8][1])


@pytest.mark.parametrize("command", ["quality", "predictor"])
def test_every_command_that_builds_the_kernels_refuses_a_bad_setting_first(monkeypatch, command, tmp_path, capsys):
    """Timed runs and quality (untimed, but its fused builds load the kernels) stop at once, before
    their reference baseline or probes have run."""
    from vllm_omni.bench import cli

    monkeypatch.setenv(native.Q4_PREFETCH_ENV, "eight")
    assert cli.main([command, "--quick", "--output", str(tmp_path)]) == 2
    assert "VLLM_OMNI_Q4_PREFETCH='eight'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
