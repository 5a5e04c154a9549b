"""Parameter counts and per-frame bytes pinned to the reference sheet (qwen3-tts.md §1, §2, §4)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_omni.models import (
    WEIGHT_FORMATS,
    activation_bytes,
    frame_breakdown,
    frame_bytes,
    get_model,
    kv_bytes_per_position,
    linear_bytes,
    predictor_params,
    predictor_pass_bytes,
    projection_bytes,
    stack_params,
    talker_frame_bytes,
    talker_params,
)

M06 = get_model("0.6B")
M17 = get_model("1.7B")


def test_stack_params_match_reference_sheet():
    assert stack_params(M06.talker) == 440_466_432
    assert stack_params(M17.talker) == 1_409_408_000
    assert stack_params(M06.predictor) == 78_654_720


def test_whole_talker_params_match_checkpoint_sizes():
    assert talker_params(M06) == 905_788_672
    assert talker_params(M17) == 1_916_676_352


def test_predictor_params():
    # 5 blocks + norm + 15 embeddings (talker width) + 15 heads (+ projection for 1.7B)
    assert predictor_params(M06) == 78_654_720 + 1024 + 31_457_280 + 31_457_280
    assert predictor_params(M17) == 78_654_720 + 1024 + 62_914_560 + 31_457_280 + 2_098_176


def test_bf16_bytes_per_frame_match_reference_sheet():
    assert predictor_pass_bytes(M06, "bf16") == 161_505_792
    assert talker_frame_bytes(M06, "bf16") == 887_226_368
    assert talker_frame_bytes(M17, "bf16") == 2_831_403_008
    assert frame_bytes(M06, "bf16") == 3_309_813_248
    assert round(frame_bytes(M06, "bf16") / 1e9, 2) == 3.31
    assert projection_bytes(M17, "bf16") == 4_196_352
    b17 = frame_breakdown(M17, "bf16")
    assert b17.projection == 62_945_280
    assert b17.total == 5_316_935_168
    assert round(b17.total / 1e9, 2) == 5.32


def test_predictor_is_most_of_a_06b_frame():
    b = frame_breakdown(M06, "bf16")
    assert b.predictor_passes == 15
    assert 0.72 < b.predictor / b.total < 0.74  # "about 73 %" on the reference sheet


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("fp32", 4 * 2048 * 1024),
        ("bf16", 2 * 2048 * 1024),
        ("int8", 2048 * 1024 + 4 * 2048),  # one fp32 scale per output row
        ("int4", 2048 * 1024 // 2 + 2 * 2048 * (1024 // 32)),  # one fp16 scale per 32 inputs
    ],
)
def test_linear_bytes_per_format(fmt, expected):
    assert linear_bytes(2048, 1024, fmt) == expected


def test_int4_is_four_and_a_half_bits_per_weight():
    assert linear_bytes(1024, 1024, "int4") * 8 / (1024 * 1024) == 4.5


def test_int4_short_last_group_still_has_a_scale():
    assert linear_bytes(1, 33, "int4") == 17 + 2 * 2


def test_norms_follow_activation_dtype():
    assert activation_bytes("bf16") == 2
    assert [activation_bytes(f) for f in ("fp32", "int8", "int4")] == [4, 4, 4]
    # predictor pass minus its matrices is the norms: 5 * (2*128 + 2*1024) + 1024 elements
    norm_elems = 5 * (2 * 128 + 2 * 1024) + 1024
    linear_elems = 5 * (15_730_944 - 2_304) + 2048 * 1024  # 5 blocks' matrices + one lm_head
    out_rows = 5 * (2048 + 1024 + 1024 + 1024 + 3072 + 3072 + 1024) + 2048
    assert predictor_pass_bytes(M06, "bf16") == 2 * linear_elems + 2 * norm_elems
    assert predictor_pass_bytes(M06, "int8") == linear_elems + 4 * out_rows + 4 * norm_elems


def test_formats_shrink_monotonically():
    for model in (M06, M17):
        totals = [frame_bytes(model, f) for f in ("fp32", "bf16", "int8", "int4")]
        assert totals == sorted(totals, reverse=True)
        assert frame_bytes(model, "fp32") == pytest.approx(2 * frame_bytes(model, "bf16"), rel=1e-5)


def test_kv_bytes_per_position():
    assert kv_bytes_per_position(M06.talker) == 114_688
    assert kv_bytes_per_position(M17.talker) == 114_688
    assert kv_bytes_per_position(M06.predictor) == 20_480
    assert kv_bytes_per_position(M06.talker, "fp32") == 2 * 114_688


def test_bad_inputs_list_choices():
    with pytest.raises(ValueError, match="valid: fp32, bf16, int8, int4"):
        frame_bytes(M06, "q4_0")
    with pytest.raises(ValueError, match="valid: 0.6B, 1.7B"):
        get_model("4B")
    with pytest.raises(ValueError, match="valid: fp32"):
        kv_bytes_per_position(M06.talker, "int3")


def test_weight_formats_agree_with_bench_flags():
    from vllm_omni.bench.common import WEIGHT_FORMATS as BENCH_FORMATS

    assert tuple(BENCH_FORMATS) == WEIGHT_FORMATS


def test_import_is_light():
    code = "import sys, vllm_omni.models; print(any(m in sys.modules for m in ('torch', 'numpy', 'vllm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
