"""Specs of the Qwen3-TTS 12 Hz family (talker, code predictor, code2wav), 0.6B and 1.7B.

Every value is written out: the upstream config classes' defaults do not match the
released checkpoints (see shared reference sheet, section 0 and 7). ``counts`` turns the
shapes into parameter counts and bytes read per frame for each weight format.
"""

from .counts import (
    WEIGHT_FORMATS,
    FrameBytes,
    activation_bytes,
    frame_breakdown,
    frame_bytes,
    kv_bytes_per_position,
    linear_bytes,
    predictor_params,
    predictor_pass_bytes,
    projection_bytes,
    stack_params,
    talker_frame_bytes,
    talker_own_params,
    talker_params,
)
from .spec import (
    CODE2WAV,
    MODELS,
    Code2WavSpec,
    ModelSpec,
    StackSpec,
    get_model,
)

__all__ = [
    "CODE2WAV", "MODELS", "WEIGHT_FORMATS", "Code2WavSpec", "FrameBytes", "ModelSpec", "StackSpec",
    "activation_bytes", "frame_breakdown", "frame_bytes", "get_model", "kv_bytes_per_position",
    "linear_bytes", "predictor_params", "predictor_pass_bytes", "projection_bytes", "stack_params",
    "talker_frame_bytes", "talker_own_params", "talker_params",
]
