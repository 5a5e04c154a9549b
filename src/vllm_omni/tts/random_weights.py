"""Random weights for a checkpoint of the published layout, one rule per kind of tensor.

Why these rules and not a plain N(0, 0.02): that init makes a deep talker collapse onto a
handful of codes whatever the text, makes near-flat logits whose argmax fp32 rounding can flip,
and leaves the codec's codebooks at zero (its published init), so that the decoder's output
would not depend on the codes at all. Here heads are scaled for peaked logits, norms sit near
one but not at it, branch outputs are scaled by their fan-in, layer scales are large enough that
a wrong transformer shows in the audio, and codebooks are drawn. Speed does not depend on the
values; equality tests need them to decide things.

Each tensor has its own generator seeded from the run's seed and the tensor's name, so our
writer and the official-side writer of the tests give the same tensor the same values.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

HEAD_STD = 0.06  # codec_head / lm_head: logits of std ~ 0.06 * sqrt(hidden), peaked
EMBED_STD = 0.5
NORM_NOISE = 0.05


def generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))


def _fan_in(name: str, shape: tuple[int, ...]) -> int:
    if len(shape) == 3 and ".upsample." in name and name.endswith(".0.conv.weight") or (
            len(shape) == 3 and name.startswith("decoder.") and name.endswith(".block.1.conv.weight")):
        return shape[0] * 2  # a transposed conv: each output sums C_in inputs over two taps
    n = 1
    for d in shape[1:]:
        n *= d
    return max(n, 1)


def init_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """The fp32 value of tensor ``name`` of ``shape`` in a random checkpoint seeded with ``seed``."""
    g = generator(seed, name)
    z = torch.randn(shape, generator=g, dtype=torch.float32)
    if name.endswith("cluster_usage"):
        return 0.5 + torch.rand(shape, generator=g)
    if name.endswith(("embedding_sum", "embed_sum")):  # codebooks (the decoder's, the encoder's)
        return z
    if name.endswith("codebook.initialized"):  # the encoder's codebooks are marked initialised
        return torch.ones(shape)
    if name.endswith((".alpha", ".beta")):  # SnakeBeta, stored as logs
        return 0.2 * z
    if name.endswith("layer_scale.scale") or name.endswith(".gamma"):
        return 0.3 + 0.05 * z
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0 + NORM_NOISE * z
    if name.endswith(".bias"):
        return 0.02 * z
    if "embedding" in name:
        return EMBED_STD * z
    if name.endswith("codec_head.weight") or ".lm_head." in name:
        return HEAD_STD * z
    gain = 0.5 if name.endswith(("o_proj.weight", "down_proj.weight", "pwconv2.weight")) else 1.0
    if name.endswith("conv2.conv.weight"):  # a ResidualUnit's output: keep the stack from growing
        gain = 0.3
    if len(shape) == 3 and shape[0] == 1:  # the decoder's last conv: audio mostly inside the clamp
        gain = 0.1
    return z * (gain / _fan_in(name, shape) ** 0.5)
