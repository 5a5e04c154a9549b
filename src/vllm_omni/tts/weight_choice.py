"""The weight formats of the talker and the code predictor, chosen together or apart.

``"int4"`` packs both in int4; ``"int4+int8"`` packs the talker in int4 and the predictor in int8
(the talker first, then the predictor, joined by ``+``: a comma would be read as a list of
settings by the benchmarks). The predictor is the part where quantization moves the most codes:
a third-party study on the real 0.6B found int4 predictor codes agreeing with bf16's on 46 % of
codebook entries and int8 on 78 % (``docs/edge/end-to-end.md``), and this project's greedy codes
on random weights agree with fp32 on 14 % (int4) and 73 % (int8, ``cpu-path/quality-0.6b``); an
int8 predictor costs about twice an int4 one per frame, since its pass reads twice the bytes.
"""

from __future__ import annotations

WEIGHT_FORMATS = ("fp32", "int8", "int4")
MIX = "+"


def weight_parts(weights: str) -> tuple[str, str]:
    """(talker format, predictor format) of a ``weights`` choice; ValueError naming it if it is not one."""
    parts = weights.split(MIX) if isinstance(weights, str) else []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or any(p not in WEIGHT_FORMATS for p in parts):
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)} for both the talker and the predictor, "
                         f"or TALKER{MIX}PREDICTOR such as int4{MIX}int8, got {weights!r}")
    return parts[0], parts[1]


def canonical(weights: str) -> str:
    """The choice's shortest spelling: ``"int4"`` for ``"int4+int4"``."""
    talker, predictor = weight_parts(weights)
    return talker if talker == predictor else f"{talker}{MIX}{predictor}"


def quantized(weights: str) -> bool:
    """Whether either part is quantized (int8 or int4), which is what the decoder's "auto" precision asks."""
    return any(p != "fp32" for p in weight_parts(weights))
