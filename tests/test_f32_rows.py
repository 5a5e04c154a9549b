"""The fp32 rows the GEMVs read side by side: chosen per host, overridable, never changing a result."""

from __future__ import annotations

import pytest

from vllm_omni.cpu import native
from vllm_omni.results import provenance

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("cpu_id", "variant", "rows"), [
    ("family 6, model 167, stepping 1", "native", 4),  # measured: four rows 4 to 8 % faster than one
    ("family 6, model 167, stepping 1", "avx2", None),  # the AVX2 build's own default (four)
    ("family 25, model 17, stepping 1", "native", None),  # one row, as measured on that host
    ("family 6, model 207, stepping 2", "native", None),  # not measured: the build's default
    (None, "native", None),
])
def test_the_default_follows_the_hosts_measured(monkeypatch, cpu_id, variant, rows):
    monkeypatch.delenv(native.F32_ROWS_ENV, raising=False)
    monkeypatch.setattr(provenance, "cpuinfo", lambda: {"cpu_id": cpu_id})
    assert native.f32_rows_setting(variant) == rows


@pytest.mark.parametrize("variant", list(native.VARIANT_FLAGS))
@pytest.mark.parametrize("text", ["1", "2", "4"])
def test_the_variable_overrides_the_default_in_every_build(monkeypatch, text, variant):
    monkeypatch.setenv(native.F32_ROWS_ENV, text)
    assert native.f32_rows_setting(variant) == int(text)


@pytest.mark.parametrize("text", ["x", "0", "3", "8", "4.0", ""])
def test_a_bad_setting_is_refused_with_what_to_do(monkeypatch, text):
    monkeypatch.setenv(native.F32_ROWS_ENV, text)
    with pytest.raises(ValueError, match=rf"VLLM_OMNI_F32_ROWS={text!r} is not one of 1, 2, 4 .* unset it"):
        native.f32_rows_setting()


@pytest.fixture
def fresh_native_build(monkeypatch):
    """The native library rebuilt under the test's setting, and this host's default back after."""
    saved = native._LIBS.pop("native", None), native._Q4_PREFETCH.pop("native", None)
    yield
    native._LIBS.pop("native", None)
    native._Q4_PREFETCH.pop("native", None)
    monkeypatch.delenv(native.F32_ROWS_ENV, raising=False)
    if saved[0] is not None:
        native._LIBS["native"], native._Q4_PREFETCH["native"] = saved


def test_the_row_count_changes_no_bit_of_an_fp32_frame(monkeypatch, fresh_native_build):
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import MODELS

    spec = MODELS["0.6B"]
    w = random_predictor_weights(spec, seed=5, layers=1)
    g = torch.Generator().manual_seed(6)
    ph, c0 = torch.randn(spec.talker.hidden, generator=g), torch.randn(spec.talker.hidden, generator=g)
    out = {}
    for rows in (1, 4):
        monkeypatch.setenv(native.F32_ROWS_ENV, str(rows))
        native._LIBS.pop("native", None)
        assert native.kernel_settings()["f32_rows"] == rows
        codes, _, logits = FusedPredictor(w, "fp32", threads=2).frame(ph, c0, return_logits=True)
        out[rows] = (codes.tolist(), logits.clone())
    assert out[1][0] == out[4][0] and torch.equal(out[1][1], out[4][1])


def test_a_run_that_used_no_kernel_records_no_setting():
    assert native.kernel_settings(used=False) == {"q4_prefetch_groups": None, "f32_rows": None}


def test_a_bad_setting_stops_a_timed_run_first(monkeypatch, tmp_path, capsys):
    from vllm_omni.bench import cli

    monkeypatch.setenv(native.F32_ROWS_ENV, "3")
    assert cli.main(["predictor", "--quick", "--output", str(tmp_path)]) == 2
    assert "VLLM_OMNI_F32_ROWS='3'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
