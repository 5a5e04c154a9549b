"""Weight packing of the native kernels: round-trip error bounds, layout and byte counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu.quant import (  # noqa: E402
    INT4_GROUP, INT4_GROUP_BYTES, INT4_TILE, TILE, dequantize, dequantized_weights, int4_scales, int8_values,
    packed_width, quantize, roundtrip,
)
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
    assert m.data.dtype == torch.uint8 and m.data.shape == w.shape and m.scale.dtype == torch.float32
    assert 1 <= int(m.data.min()) and int(m.data.max()) <= 255  # q + 128 with q in -127..127
    assert int8_values(m).abs().max() <= 127
    err = (roundtrip(w, "int8") - w).abs()
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert torch.all(err <= step / 2 * (1 + 1e-5) + 1e-9)
    assert torch.all(roundtrip(w, "int8")[7] == 0)
    assert m.nbytes == linear_bytes(*w.shape, "int8")


def test_int4_round_trip_within_half_a_step_per_group():
    w = _matrix()
    m = quantize(w, "int4")
    assert m.data.dtype == torch.uint8 and m.data.shape == (96, 256 * 9 // 16) and m.scale is None
    scales = int4_scales(m)
    assert scales.dtype == torch.float16 and scales.shape == (96, 256 // INT4_GROUP)
    groups = w.view(96, -1, INT4_GROUP)
    d = scales.float()[:, :, None]  # the stored (fp16-rounded) scale
    err = (roundtrip(w, "int4").view_as(groups) - groups).abs()
    assert torch.all(err <= d / 2 * (1 + 1e-3) + 1e-9)
    # the fp16 scale is max|w|/7 up to fp16 rounding
    ref = groups.abs().amax(dim=2) / 7
    assert torch.allclose(scales.float(), ref, rtol=1e-3, atol=1e-7)
    assert m.nbytes == linear_bytes(*w.shape, "int4")


def test_int4_tiles_pair_rows_r_and_16_plus_r_in_each_byte_with_scales_first():
    # value of row r, input c: says where it came from (-7..7), and row r's group g has scale
    # 1 + (r + g) % 3, so that the packed bytes can be checked against the documented layout
    rows, cols = 64, 128
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    n = (r * 7 + c * 3) % 15 - 7
    scale = 1.0 + (r + c // INT4_GROUP) % 3
    n[:, ::INT4_GROUP] = 7  # each group's largest |value| is 7, so its scale is exactly `scale`
    m = quantize(n * scale, "int4")
    tiles = m.data.reshape(rows // INT4_TILE, cols // INT4_GROUP, INT4_GROUP_BYTES)
    for t in range(rows // INT4_TILE):
        for g in range(cols // INT4_GROUP):
            unit = tiles[t, g]
            sc = unit[:64].contiguous().view(torch.float16).float()
            for row in range(INT4_TILE):
                assert sc[row] == scale[INT4_TILE * t + row, g * INT4_GROUP]
            for j in range(8):
                for lane in range(16):
                    for b in range(4):
                        byte = int(unit[64 + 64 * j + 4 * lane + b])
                        col = g * INT4_GROUP + 4 * j + b
                        assert (byte & 0x0F) - 8 == n[INT4_TILE * t + lane, col]
                        assert (byte >> 4) - 8 == n[INT4_TILE * t + 16 + lane, col]
    assert torch.equal(dequantize(m), (n * scale).float())


def test_int8_tiles_put_16_rows_of_4_inputs_in_each_line():
    # value of row r, input c: says where it came from, and row r's largest |value| is 127, so
    # that its scale is exactly 1 and the stored bytes are the values plus 128
    rows, cols = 64, 128
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    q = (r * 31 + c * 7) % 255 - 127
    q[:, 0] = 127
    m = quantize(q.float(), "int8")
    assert torch.equal(m.scale, torch.ones(rows))
    tiles = m.data.reshape(rows // TILE, cols // INT4_GROUP, 1024)
    for t in range(rows // TILE):
        for g in range(cols // INT4_GROUP):
            for half in range(2):
                for j in range(8):
                    for lane in range(16):
                        for b in range(4):
                            byte = int(tiles[t, g, 128 * j + 64 * half + 4 * lane + b])
                            assert byte - 128 == q[TILE * t + 16 * half + lane, g * INT4_GROUP + 4 * j + b]
    assert torch.equal(int8_values(m), q.to(torch.int8))
    assert torch.equal(dequantize(m), q.float())


def test_relative_error_is_small_on_model_like_weights():
    w = torch.randn(512, 1024, generator=torch.Generator().manual_seed(1)) * 0.02
    for fmt, bound in (("int8", 0.01), ("int4", 0.12)):
        rel = (roundtrip(w, fmt) - w).norm() / w.norm()
        assert rel < bound, (fmt, float(rel))


def test_bad_shapes_and_formats():
    with pytest.raises(ValueError):
        quantize(torch.zeros(32, 96), "int4")  # in_features not a multiple of 64
    for fmt in ("int8", "int4"):
        with pytest.raises(ValueError, match="divisible by 32"):
            quantize(torch.zeros(16, 64), fmt)  # out_features not a multiple of 32
    assert quantize(torch.zeros(32, 64), "int8").data.shape[1] == packed_width(64, "int8")
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
