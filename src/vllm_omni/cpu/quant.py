"""Weight packing for the native kernels: fp32, int8 and int4 (done once, at load).

Formats (the byte counts of ``vllm_omni.models.linear_bytes``):

- ``fp32``: the matrix itself, 4 B per weight.
- ``int8``: symmetric per output row, ``w[i, j] ~= scale[i] * q[i, j]`` with
  ``scale[i] = max_j |w[i, j]| / 127`` (fp32) and ``q`` in -127..127: 1 B per weight plus 4 B
  per row.
- ``int4``: symmetric, groups of 32 consecutive weights along the input dimension,
  ``w ~= d * (n - 8)`` with ``d = max |w| / 7`` stored as fp16 and ``n`` in 1..15 (``n - 8``
  in -7..7): 0.5 B per weight plus 2 B per group. The nibbles of a row are laid out for the
  kernels' integer dots. Each run of 8 groups (256 weights) is a superblock of four 32-byte
  blocks: byte ``4k + i`` of block ``v`` holds element ``8v + i`` of group ``k`` in its low
  nibble and element ``8v + 4 + i`` in its high nibble, so every 4-byte lane of a 256-bit load
  belongs to one group. Where the row length is not a multiple of 256, the last groups pair up
  in 32-byte blocks: byte ``j`` holds element ``j`` of the first group in its low nibble and
  element ``j`` of the second in its high nibble.

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
    return QuantMatrix(fmt, _pack_nibbles(n), d.contiguous(), rows, cols)


def _pack_nibbles(n: Tensor) -> Tensor:
    """``[rows, groups, 32]`` values 0..15 -> ``[rows, groups * 16]`` bytes in the int4 layout."""
    rows, groups, _ = n.shape
    full = groups // 8 * 8
    # superblocks: [rows, s, group k, block v, low/high, i] -> [rows, s, v, k, i, low/high]
    sb = n[:, :full].reshape(rows, full // 8, 8, 4, 2, 4).permute(0, 1, 3, 2, 5, 4)
    main = (sb[..., 0] | (sb[..., 1] << 4)).reshape(rows, full * 16)
    pairs = n[:, full:].reshape(rows, (groups - full) // 2, 2, INT4_GROUP)
    tail = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(rows, (groups - full) * 16)
    return torch.cat([main, tail], dim=1).contiguous()


def _unpack_nibbles(packed: Tensor, groups: int) -> Tensor:
    """The inverse of ``_pack_nibbles``: ``[rows, groups, 32]`` values 0..15."""
    rows = packed.shape[0]
    full = groups // 8 * 8
    main = packed[:, : full * 16].reshape(rows, full // 8, 4, 8, 4)  # [rows, s, v, k, i]
    sb = torch.stack([main & 0x0F, main >> 4], dim=-1)  # [rows, s, v, k, i, low/high]
    main_n = sb.permute(0, 1, 3, 2, 5, 4).reshape(rows, full, INT4_GROUP)
    tail = packed[:, full * 16:].reshape(rows, (groups - full) // 2, 1, INT4_GROUP)
    tail_n = torch.cat([tail & 0x0F, tail >> 4], dim=2).reshape(rows, groups - full, INT4_GROUP)
    return torch.cat([main_n, tail_n], dim=1)


def dequantize(m: QuantMatrix) -> Tensor:
    """The fp32 matrix the packed one stands for."""
    if m.fmt == "fp32":
        return m.data.clone()
    if m.fmt == "int8":
        return m.data.float() * m.scale[:, None]
    n = _unpack_nibbles(m.data, m.cols // INT4_GROUP)
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
