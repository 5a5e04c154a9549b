"""Weight packing for the native kernels: fp32, int8 and int4 (done once, at load).

Formats (the byte counts of ``vllm_omni.models.linear_bytes``):

- ``fp32``: the matrix itself, 4 B per weight.
- ``int8``: symmetric per output row, ``w[i, j] ~= scale[i] * q[i, j]`` with
  ``scale[i] = max_j |w[i, j]| / 127`` (fp32) and ``q`` in -127..127: 1 B per weight plus 4 B
  per row.
- ``int4``: symmetric, groups of 32 consecutive weights along the input dimension,
  ``w ~= d * (n - 8)`` with ``d = max |w| / 7`` stored as fp16 and ``n`` in 1..15 (``n - 8``
  in -7..7): 0.5 B per weight plus 2 B per group. Two neighbouring groups share one 32-byte
  block: byte ``j`` holds element ``j`` of the first group in its low nibble and element ``j``
  of the second group in its high nibble, so one 256-bit load yields 64 weights in order.

The matrices keep the ``nn.Linear`` layout ``[out, in]``; ``in`` must be a multiple of 64 for
the packed formats (every Qwen3-TTS matrix is).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

FORMATS = ("fp32", "int8", "int4")
INT4_GROUP = 32


@dataclass
class QuantMatrix:
    """A packed ``[rows, cols]`` matrix: ``data`` and ``scale`` as described in the module doc."""

    fmt: str
    data: Tensor
    scale: Tensor | None
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size()
        if self.scale is not None:
            n += self.scale.numel() * self.scale.element_size()
        return n

    def dequantize(self) -> Tensor:
        return dequantize(self)


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown native weight format {fmt!r}; valid: {', '.join(FORMATS)}")
    return fmt


def quantize(w: Tensor, fmt: str) -> QuantMatrix:
    """Pack an fp32 ``[rows, cols]`` matrix into ``fmt``."""
    check_format(fmt)
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    w = w.detach().float().contiguous()
    if fmt == "fp32":
        return QuantMatrix(fmt, w, None, rows, cols)
    if cols % 64:
        raise ValueError(f"{fmt} packing needs in_features divisible by 64, got {cols}")
    if fmt == "int8":
        amax = w.abs().amax(dim=1)
        scale = amax / 127.0
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        q = torch.round(w * inv[:, None]).clamp_(-127, 127).to(torch.int8)
        return QuantMatrix(fmt, q.contiguous(), scale.contiguous(), rows, cols)
    g = w.view(rows, cols // INT4_GROUP, INT4_GROUP)
    d = (g.abs().amax(dim=2) / 7.0).to(torch.float16)  # the stored scale
    df = d.float()
    inv = torch.where(df > 0, 1.0 / df, torch.zeros_like(df))
    n = (torch.round(g * inv[:, :, None]).clamp_(-8, 7) + 8).to(torch.uint8)  # [rows, groups, 32]
    pairs = n.view(rows, cols // 64, 2, INT4_GROUP)
    packed = pairs[:, :, 0, :] | (pairs[:, :, 1, :] << 4)
    return QuantMatrix(fmt, packed.reshape(rows, cols // 2).contiguous(), d.contiguous(), rows, cols)


def dequantize(m: QuantMatrix) -> Tensor:
    """The fp32 matrix the packed one stands for."""
    if m.fmt == "fp32":
        return m.data.clone()
    if m.fmt == "int8":
        return m.data.float() * m.scale[:, None]
    packed = m.data.view(m.rows, m.cols // 64, 1, INT4_GROUP)
    n = torch.cat([packed & 0x0F, packed >> 4], dim=2).view(m.rows, m.cols // INT4_GROUP, INT4_GROUP)
    w = (n.float() - 8.0) * m.scale.float()[:, :, None]
    return w.view(m.rows, m.cols)


def roundtrip(w: Tensor, fmt: str) -> Tensor:
    """``dequantize(quantize(w, fmt))``."""
    return dequantize(quantize(w, fmt))


def dequantized_weights(weights, fmt: str):
    """A copy of Predictor/TalkerWeights whose matrices are replaced by their ``fmt`` round trip.

    Every linear the native kernels quantize is rewritten: the seven block matrices, the
    predictor's ``lm_head`` tables and projection, the talker's ``codec_head``. Norms and
    embedding tables stay fp32 (they are fp32 in the kernels too).
    """
    check_format(fmt)
    out = copy.copy(weights)
    out.layers = []
    for layer in weights.layers:
        new = copy.copy(layer)
        for name, m in layer.matrices().items():
            setattr(new, name, roundtrip(m, fmt))
        out.layers.append(new)
    if hasattr(weights, "lm_head"):
        out.lm_head = torch.stack([roundtrip(h, fmt) for h in weights.lm_head])
        if weights.proj_weight is not None:
            out.proj_weight = roundtrip(weights.proj_weight, fmt)
    if hasattr(weights, "codec_head"):
        out.codec_head = roundtrip(weights.codec_head, fmt)
    return out
