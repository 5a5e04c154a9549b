"""The predictor under torch.compile equals the eager reference, and the benchmark refuses what
it cannot time.

Tolerance: fp32 on both sides; inductor fuses and reorders the arithmetic (and the static model
attends over masked slots), so logits differ by float rounding, ~1e-6 on outputs of magnitude
1-3. 1e-4 leaves two orders of margin. Codes must be identical, greedy and sampled: the gap
between the top choices of these random weights is ~0.1.

A one-layer stack keeps the two compiles (the 2-token and the 1-token pass) to seconds.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.bench import cli  # noqa: E402
from vllm_omni.bench.predictor import COMPILED_FORMATS, IMPLS, _Compiled  # noqa: E402
from vllm_omni.cpu import compiled  # noqa: E402
from vllm_omni.cpu.reference import ReferencePredictor  # noqa: E402
from vllm_omni.cpu.sampler import draw_uniforms  # noqa: E402
from vllm_omni.cpu.weights import random_predictor_weights  # noqa: E402
from vllm_omni.models import MODELS  # noqa: E402

SPEC = MODELS["0.6B"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def weights():
    return random_predictor_weights(SPEC, seed=0, layers=1)


@pytest.fixture(scope="module")
def predictor(weights):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # one compile for the whole module
    yield compiled.CompiledPredictor(weights)
    torch.set_num_threads(before)


def test_the_benchmark_knows_the_formats_the_module_runs():
    assert COMPILED_FORMATS == compiled.FORMATS
    assert IMPLS["all"] == ["reference", "compiled", "fused"] and IMPLS["both"] == ["reference", "fused"]


@pytest.mark.parametrize("sampled", [False, True])
def test_compiled_frames_equal_the_reference(weights, predictor, sampled):
    ref = ReferencePredictor(weights)
    uniforms = draw_uniforms(torch.Generator().manual_seed(5), SPEC.residual_codebooks, SPEC.codebook_size)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        past_hidden, c0_embed = torch.randn(SPEC.talker.hidden, generator=g), 0.5 * torch.randn(SPEC.talker.hidden, generator=g)
        want_codes, want_sum = ref.frame(past_hidden, c0_embed, greedy=not sampled, uniforms=uniforms if sampled else None)
        codes, embed_sum = predictor.frame(past_hidden, c0_embed, uniforms if sampled else None)
        assert torch.equal(codes, want_codes)
        torch.testing.assert_close(embed_sum, want_sum, atol=ATOL, rtol=0)


def test_one_graph_serves_every_later_pass(predictor):
    """Passes 2..15 differ in position and head only, both tensors: no compile after the first frame."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(9)
    args = (torch.randn(SPEC.talker.hidden, generator=g), torch.randn(SPEC.talker.hidden, generator=g))
    predictor.frame(*args)
    before = counters["stats"]["unique_graphs"]
    predictor.frame(*args)
    assert counters["stats"]["unique_graphs"] == before


def test_the_pass_timer_runs_the_compiled_pass(weights):
    runner = _Compiled(weights, "fp32")
    runner.set_threads(1)
    runner.pass_once()
    assert runner.p.stack.k[0, :, 8].abs().sum() > 0  # the timed token was written at position 8


@pytest.mark.parametrize("fmt", ["int8", "int4", "bf16"])
def test_quantized_weights_are_refused(weights, fmt):
    with pytest.raises(ValueError, match="runs fp32 weights only"):
        compiled.CompiledPredictor(weights, fmt=fmt)


def test_the_benchmark_refuses_compiled_int4(tmp_path, capsys):
    assert cli.main(["predictor", "--impl", "compiled", "--weights", "int4", "--quick", "--output", str(tmp_path)]) == 2
    assert "the compiled predictor supports --weights fp32, not int4" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
