"""Parameter counts and weight bytes read per 80 ms frame, by weight format.

Why: the projection and the CPU kernels both need the bytes one frame streams from memory,
and those follow from the shapes alone. Every figure here is arithmetic on
:mod:`vllm_omni.models.spec`; nothing is measured.

Weight formats (fixed project-wide, :data:`WEIGHT_FORMATS`):

* ``fp32``: 4 B per weight.
* ``bf16``: 2 B per weight.
* ``int8``: 1 B per weight plus one fp32 scale (4 B) per output row.
* ``int4``: symmetric, groups of 32 along the input dimension: 0.5 B per weight plus one
  fp16 scale (2 B) per group, like llama.cpp Q4_0 (4.5 bits per weight).

Only the matrices of linear layers (attention and MLP projections, ``codec_head``, the
predictor's ``lm_head`` tables and ``small_to_mtp_projection``) take the weight format.
Norm vectors and biases stay at the *activation dtype*: bf16 (2 B) for ``bf16`` weights
and fp32 (4 B) for every other format, since an int8/int4 kernel here dequantizes into
fp32 activations. Embedding tables are not read per frame (one row per code), so they
appear in parameter counts but not in frame bytes. The KV cache is sized separately
(:func:`kv_bytes_per_position`) because its dtype is an engine setting, not a weight format.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ModelSpec, StackSpec

WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4")
KV_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
INT4_GROUP = 32


def check_format(fmt: str) -> str:
    """Return ``fmt`` if it is a known weight format; raise ValueError listing them otherwise."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; valid: {', '.join(WEIGHT_FORMATS)}")
    return fmt


def activation_bytes(fmt: str) -> int:
    """Bytes per element of norm vectors and biases: 2 for bf16 weights, 4 otherwise."""
    return 2 if check_format(fmt) == "bf16" else 4


def linear_bytes(out_features: int, in_features: int, fmt: str) -> int:
    """Bytes of one weight matrix ``[out, in]`` (no bias) in ``fmt``, scales included."""
    check_format(fmt)
    n = out_features * in_features
    if fmt == "fp32":
        return 4 * n
    if fmt == "bf16":
        return 2 * n
    if fmt == "int8":
        return n + 4 * out_features
    groups = -(-in_features // INT4_GROUP)  # ceil: a short last group still has a scale
    return n // 2 + (n % 2) + 2 * out_features * groups


# --- one decoder block ------------------------------------------------------------------------

def layer_linears(stack: StackSpec) -> list[tuple[int, int]]:
    """``(out, in)`` of the seven matrices of one block: q, k, v, o, gate, up, down."""
    h, i = stack.hidden, stack.intermediate
    return [
        (stack.q_dim, h), (stack.kv_dim, h), (stack.kv_dim, h), (h, stack.q_dim),
        (i, h), (i, h), (h, i),
    ]


def layer_norm_params(stack: StackSpec) -> int:
    """q_norm and k_norm (head_dim each) plus the two RMSNorms (hidden each)."""
    return 2 * stack.head_dim + 2 * stack.hidden


def layer_params(stack: StackSpec) -> int:
    return sum(o * i for o, i in layer_linears(stack)) + layer_norm_params(stack)


def stack_params(stack: StackSpec) -> int:
    """All decoder blocks of a stack, without its final norm (0.6B talker: 440,466,432)."""
    return stack.layers * layer_params(stack)


def layer_bytes(stack: StackSpec, fmt: str) -> int:
    return sum(linear_bytes(o, i, fmt) for o, i in layer_linears(stack)) + layer_norm_params(stack) * activation_bytes(fmt)


def stack_bytes(stack: StackSpec, fmt: str) -> int:
    """All blocks plus the final norm: what one forward of the stack reads."""
    return stack.layers * layer_bytes(stack, fmt) + stack.hidden * activation_bytes(fmt)


# --- whole modules: parameters ----------------------------------------------------------------

def predictor_params(model: ModelSpec) -> int:
    """The code predictor module: 5 blocks, final norm, 15 embeddings, 15 heads, projection."""
    p = model.predictor
    n = stack_params(p) + p.hidden
    n += model.residual_codebooks * model.codebook_size * model.talker.hidden  # codec_embedding
    n += model.residual_codebooks * model.codebook_size * p.hidden  # lm_head
    n += projection_params(model)
    return n


def projection_params(model: ModelSpec) -> int:
    """``small_to_mtp_projection`` (1.7B only): talker width to predictor width, with bias."""
    if not model.needs_projection:
        return 0
    return model.talker.hidden * model.predictor.hidden + model.predictor.hidden


def talker_own_params(model: ModelSpec) -> dict[str, int]:
    """The talker's own modules (no predictor), by name."""
    t = model.talker
    return {
        "layers": stack_params(t),
        "final norm": t.hidden,
        "text_embedding": model.text_vocab * model.text_hidden,
        "text_projection": model.text_hidden * model.text_hidden + model.text_hidden + model.text_hidden * t.hidden + t.hidden,
        "codec_embedding": model.codec_vocab * t.hidden,
        "codec_head": model.codec_vocab * t.hidden,
    }


def talker_params(model: ModelSpec) -> int:
    """The whole talker checkpoint incl. the code predictor (0.6B: 905,788,672)."""
    return sum(talker_own_params(model).values()) + predictor_params(model)


# --- bytes read per frame ---------------------------------------------------------------------

def predictor_pass_bytes(model: ModelSpec, fmt: str) -> int:
    """One predictor pass: 5 blocks + final norm + one ``lm_head`` (bf16: 161,505,792 B)."""
    p = model.predictor
    return stack_bytes(p, fmt) + linear_bytes(model.codebook_size, p.hidden, fmt)


def projection_bytes(model: ModelSpec, fmt: str) -> int:
    """One use of ``small_to_mtp_projection`` (matrix + bias); 0 for 0.6B."""
    if not model.needs_projection:
        return 0
    return linear_bytes(model.predictor.hidden, model.talker.hidden, fmt) + model.predictor.hidden * activation_bytes(fmt)


def talker_frame_bytes(model: ModelSpec, fmt: str) -> int:
    """One talker step: 28 blocks + final norm + ``codec_head`` (0.6B bf16: 887,226,368 B)."""
    t = model.talker
    return stack_bytes(t, fmt) + linear_bytes(model.codec_vocab, t.hidden, fmt)


@dataclass(frozen=True)
class FrameBytes:
    """Weight bytes one 80 ms frame streams, split by component."""

    model: str
    fmt: str
    talker: int
    predictor_pass: int
    predictor_passes: int
    projection_use: int
    projection_uses: int

    @property
    def predictor(self) -> int:
        return self.predictor_pass * self.predictor_passes

    @property
    def projection(self) -> int:
        return self.projection_use * self.projection_uses

    @property
    def total(self) -> int:
        return self.talker + self.predictor + self.projection


def frame_breakdown(model: ModelSpec, fmt: str) -> FrameBytes:
    """Talker once, the predictor 15 times, and (1.7B) the projection 15 times."""
    passes = model.residual_codebooks
    return FrameBytes(
        model=model.name, fmt=check_format(fmt),
        talker=talker_frame_bytes(model, fmt),
        predictor_pass=predictor_pass_bytes(model, fmt), predictor_passes=passes,
        projection_use=projection_bytes(model, fmt), projection_uses=passes if model.needs_projection else 0,
    )


def frame_bytes(model: ModelSpec, fmt: str) -> int:
    """Total weight bytes per frame (0.6B bf16: 3,309,813,248 B)."""
    return frame_breakdown(model, fmt).total


def kv_bytes_per_position(stack: StackSpec, dtype: str = "bf16") -> int:
    """K and V of every block for one position (talker bf16: 114,688 B)."""
    try:
        size = KV_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown KV cache dtype {dtype!r}; valid: {', '.join(KV_DTYPES)}") from None
    return stack.layers * 2 * stack.kv_dim * size
