"""Specs of the Qwen3-TTS 12 Hz family (talker, code predictor, code2wav), 0.6B and 1.7B.

Every value is written out: the upstream config classes' defaults do not match the
released checkpoints (see shared reference sheet, section 0 and 7).
"""

from .spec import (
    CODE2WAV,
    MODELS,
    Code2WavSpec,
    ModelSpec,
    StackSpec,
    get_model,
)

__all__ = ["CODE2WAV", "MODELS", "Code2WavSpec", "ModelSpec", "StackSpec", "get_model"]
