"""Weight packing of the native kernels: round-trip error bounds, layout and byte counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu.quant import INT4_GROUP, dequantize, dequantized_weights, quantize, roundtrip  # noqa: E402
from vllm_omni.models import linear_bytes  # noqa: E402


def _matrix(rows=96, cols=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.02
    w[3, 5] = 0.5  # an outlier in one row / one group
    w[7] = 0.0  # an all-zero row
    return w


def test_fp32_is_identity():
    w = _matrix()
    m = quantize(w, "fp32")
    assert torch.equal(dequantize(m), w)
    assert m.nbytes == linear_bytes(*w.shape, "fp32")


def test_int8_round_trip_within_half_a_step_per_row():
    w = _matrix()
    m = quantize(w, "int8")
    assert m.data.dtype == torch.int8 and m.scale.dtype == torch.float32
    assert m.data.abs().max() <= 127
    err = (roundtrip(w, "int8") - w).abs()
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert torch.all(err <= step / 2 * (1 + 1e-5) + 1e-9)
    assert torch.all(roundtrip(w, "int8")[7] == 0)
    assert m.nbytes == linear_bytes(*w.shape, "int8")


def test_int4_round_trip_within_half_a_step_per_group():
    w = _matrix()
    m = quantize(w, "int4")
    assert m.data.dtype == torch.uint8 and m.data.shape == (96, 128)
    assert m.scale.dtype == torch.float16 and m.scale.shape == (96, 256 // INT4_GROUP)
    groups = w.view(96, -1, INT4_GROUP)
    d = m.scale.float()[:, :, None]  # the stored (fp16-rounded) scale
    err = (roundtrip(w, "int4").view_as(groups) - groups).abs()
    assert torch.all(err <= d / 2 * (1 + 1e-3) + 1e-9)
    # the fp16 scale is max|w|/7 up to fp16 rounding
    ref = groups.abs().amax(dim=2) / 7
    assert torch.allclose(m.scale.float(), ref, rtol=1e-3, atol=1e-7)
    assert m.nbytes == linear_bytes(*w.shape, "int4")


def test_int4_layout_pairs_groups_in_nibbles():
    # byte j of a 64-input block: element j (low nibble) and element 32 + j (high nibble)
    w = torch.zeros(1, 64)
    w[0, :32] = torch.linspace(-7, 7, 32).round()
    w[0, 32:] = 7.0
    m = quantize(w, "int4")
    lo, hi = (m.data[0] & 0x0F).long(), (m.data[0] >> 4).long()
    assert torch.equal(lo - 8, w[0, :32].long())
    assert torch.all(hi - 8 == 7)


def test_int4_superblocks_give_each_4_byte_lane_one_group():
    # 256 inputs: byte 4k + i of block v holds element 8v + i of group k (low nibble) and
    # element 8v + 4 + i (high nibble); a 64-input tail after it keeps the pair layout
    cols = 256 + 64
    n = torch.arange(cols) % 15 - 7  # values -7..7 that say where they came from
    m = quantize((n * 1.0).view(1, cols) * torch.ones(3, 1), "int4")  # every group scale is 1
    assert torch.all(m.scale.float() == 1.0)
    nib = [(m.data[0] & 0x0F).long() - 8, (m.data[0] >> 4).long() - 8]
    for v in range(4):
        for k in range(8):
            for i in range(4):
                byte = 32 * v + 4 * k + i
                assert nib[0][byte] == n[32 * k + 8 * v + i] and nib[1][byte] == n[32 * k + 8 * v + 4 + i]
    assert torch.equal(nib[0][128:160], n[256:288]) and torch.equal(nib[1][128:160], n[288:320])
    assert torch.equal(dequantize(m), (n * 1.0).view(1, cols).expand(3, cols))


def test_relative_error_is_small_on_model_like_weights():
    w = torch.randn(512, 1024, generator=torch.Generator().manual_seed(1)) * 0.02
    for fmt, bound in (("int8", 0.01), ("int4", 0.12)):
        rel = (roundtrip(w, fmt) - w).norm() / w.norm()
        assert rel < bound, (fmt, float(rel))


def test_bad_shapes_and_formats():
    with pytest.raises(ValueError):
        quantize(torch.zeros(4, 96), "int4")  # in_features not a multiple of 64
    with pytest.raises(ValueError):
        quantize(torch.zeros(4, 64), "bf16")
    with pytest.raises(ValueError):
        quantize(torch.zeros(64), "int8")


def test_dequantized_weights_rewrites_every_linear():
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import MODELS

    w = random_predictor_weights(MODELS["0.6B"], seed=3, layers=1)
    d = dequantized_weights(w, "int4")
    for name, m in w.layers[0].matrices().items():
        got = getattr(d.layers[0], name)
        assert torch.equal(got, roundtrip(m, "int4")), name
    assert torch.equal(d.lm_head[4], roundtrip(w.lm_head[4], "int4"))
    assert d.codec_embedding is w.codec_embedding  # tables stay fp32
    assert torch.equal(d.layers[0].input_norm, w.layers[0].input_norm)
    assert not torch.equal(d.layers[0].q_proj, w.layers[0].q_proj)  # the original is untouched
