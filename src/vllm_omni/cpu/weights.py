"""Random weights of the published Qwen3-TTS shapes, as plain fp32 tensors.

Both the eager reference and the fused kernels read these dataclasses, so the two are
compared on identical numbers. Matrices use the ``nn.Linear`` layout ``[out, in]``.

Initialisation (chosen so activations and logits stay in a realistic range):

- matrices: normal, std 0.02 (the Qwen3 ``initializer_range``); a unit-RMS input then gives
  projections of RMS about ``0.02 * sqrt(in)`` (0.64 for in=1024), and logits whose top-2 gap
  over 2048 entries is typically around 0.1, far above float rounding, so greedy argmax is
  decided by the weights, not by summation order;
- RMSNorm scales: ``1 + 0.05 * N(0, 1)``, near identity but not exactly, so a missing or
  misplaced norm shows up in comparisons;
- embedding tables: normal, std 0.5, comparable to the residual updates of a block;
- projection bias (1.7B only): normal, std 0.02.

Every layer and every table has its own generator seeded from ``seed`` and its index, so a
shallow stack (``layers=n``) holds exactly the first ``n`` layers of the full stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vllm_omni.models.spec import ModelSpec, StackSpec

MATRIX_STD = 0.02
NORM_NOISE = 0.05
EMBED_STD = 0.5

# Seed offsets keep the generators of different parts apart.
_TALKER, _PREDICTOR = 1, 2
_LAYER_BASE, _EXTRA_BASE = 0, 10_000


@dataclass
class BlockWeights:
    """One Qwen3 decoder layer (pre-norm, q/k RMSNorm, GQA attention, SwiGLU, no biases)."""

    input_norm: Tensor  # [H]
    q_proj: Tensor  # [heads*head_dim, H]
    k_proj: Tensor  # [kv_heads*head_dim, H]
    v_proj: Tensor  # [kv_heads*head_dim, H]
    q_norm: Tensor  # [head_dim]
    k_norm: Tensor  # [head_dim]
    o_proj: Tensor  # [H, heads*head_dim]
    post_norm: Tensor  # [H]
    gate_proj: Tensor  # [I, H]
    up_proj: Tensor  # [I, H]
    down_proj: Tensor  # [H, I]

    def matrices(self) -> dict[str, Tensor]:
        """The seven weight matrices by name (the tensors a quantizer rewrites)."""
        return {n: getattr(self, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}


@dataclass
class PredictorWeights:
    """The code predictor: 5 blocks, 15 codec embedding tables and 15 heads."""

    spec: ModelSpec
    layers: list[BlockWeights]
    norm: Tensor  # [1024]
    codec_embedding: Tensor  # [15, 2048, H_talker]; table k embeds code c_{k+1}
    lm_head: Tensor  # [15, 2048, 1024]; head k predicts c_{k+1}
    proj_weight: Tensor | None  # [1024, H_talker], 1.7B only (small_to_mtp_projection)
    proj_bias: Tensor | None  # [1024]


@dataclass
class TalkerWeights:
    """The talker: 28 blocks, final norm, codec embedding and codec head (untied)."""

    spec: ModelSpec
    layers: list[BlockWeights]
    norm: Tensor  # [H_talker]
    codec_embedding: Tensor  # [3072, H_talker]
    codec_head: Tensor  # [3072, H_talker]


def _gen(seed: int, part: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + part * 100_003 + index)


def _normal(g: torch.Generator, shape: tuple[int, ...], std: float) -> Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32) * std


def _norm_scale(g: torch.Generator, n: int) -> Tensor:
    return 1.0 + _normal(g, (n,), NORM_NOISE)


def random_block(stack: StackSpec, g: torch.Generator) -> BlockWeights:
    """One decoder layer of ``stack``'s shapes drawn from ``g``."""
    h, i = stack.hidden, stack.intermediate
    return BlockWeights(
        input_norm=_norm_scale(g, h),
        q_proj=_normal(g, (stack.q_dim, h), MATRIX_STD),
        k_proj=_normal(g, (stack.kv_dim, h), MATRIX_STD),
        v_proj=_normal(g, (stack.kv_dim, h), MATRIX_STD),
        q_norm=_norm_scale(g, stack.head_dim),
        k_norm=_norm_scale(g, stack.head_dim),
        o_proj=_normal(g, (h, stack.q_dim), MATRIX_STD),
        post_norm=_norm_scale(g, h),
        gate_proj=_normal(g, (i, h), MATRIX_STD),
        up_proj=_normal(g, (i, h), MATRIX_STD),
        down_proj=_normal(g, (h, i), MATRIX_STD),
    )


def _layers(stack: StackSpec, seed: int, part: int, layers: int | None) -> list[BlockWeights]:
    n = stack.layers if layers is None else layers
    if not 0 < n <= stack.layers:
        raise ValueError(f"layers must be in 1..{stack.layers}, got {n}")
    return [random_block(stack, _gen(seed, part, _LAYER_BASE + j)) for j in range(n)]


def random_predictor_weights(spec: ModelSpec, seed: int = 0, layers: int | None = None) -> PredictorWeights:
    """Predictor weights of ``spec``'s shapes; ``layers`` truncates the stack for fast tests."""
    st, ht = spec.predictor, spec.talker.hidden
    groups, cb = spec.residual_codebooks, spec.codebook_size
    g = _gen(seed, _PREDICTOR, _EXTRA_BASE)
    norm = _norm_scale(g, st.hidden)
    emb = _normal(_gen(seed, _PREDICTOR, _EXTRA_BASE + 1), (groups, cb, ht), EMBED_STD)
    head = _normal(_gen(seed, _PREDICTOR, _EXTRA_BASE + 2), (groups, cb, st.hidden), MATRIX_STD)
    pw = pb = None
    if spec.needs_projection:
        gp = _gen(seed, _PREDICTOR, _EXTRA_BASE + 3)
        pw = _normal(gp, (st.hidden, ht), MATRIX_STD)
        pb = _normal(gp, (st.hidden,), MATRIX_STD)
    return PredictorWeights(spec, _layers(st, seed, _PREDICTOR, layers), norm, emb, head, pw, pb)


def random_talker_weights(spec: ModelSpec, seed: int = 0, layers: int | None = None) -> TalkerWeights:
    """Talker weights of ``spec``'s shapes; ``layers`` truncates the stack for fast tests."""
    st = spec.talker
    g = _gen(seed, _TALKER, _EXTRA_BASE)
    norm = _norm_scale(g, st.hidden)
    emb = _normal(_gen(seed, _TALKER, _EXTRA_BASE + 1), (spec.codec_vocab, st.hidden), EMBED_STD)
    head = _normal(_gen(seed, _TALKER, _EXTRA_BASE + 2), (spec.codec_vocab, st.hidden), MATRIX_STD)
    return TalkerWeights(spec, _layers(st, seed, _TALKER, layers), norm, emb, head)
