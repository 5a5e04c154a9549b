"""Weight packing for the native kernels: fp32, int8 and int4 (done once, at load).

Formats (the byte counts of ``vllm_omni.models.linear_bytes``):

- ``fp32``: the matrix itself, 4 B per weight.
- ``int8``: symmetric per output row, ``w[i, j] ~= scale[i] * q[i, j]`` with
  ``scale[i] = max_j |w[i, j]| / 127`` (fp32) and ``q`` in -127..127: 1 B per weight plus 4 B
  per row. The bytes ``q + 128`` (1..255, ``uint8``) come in tiles of 32 rows laid out for the
  kernels' integer dots, like int4's: for each group of 32 inputs a tile holds 1024 bytes,
  sixteen 64-byte lines, ``2j`` for rows 0-15 and ``2j + 1`` for rows 16-31, whose 4-byte
  lane ``r`` holds elements ``4j .. 4j + 3`` of the group for row ``r`` (or ``16 + r``). ``data`` is
  that byte stream viewed as ``[out, in]`` (32 consecutive view rows per tile); ``scale`` is
  the fp32 ``[out]`` row scales.
- ``int4``: symmetric, groups of 32 consecutive weights along the input dimension,
  ``w ~= d * (n - 8)`` with ``d = max |w| / 7`` stored as fp16 and ``n`` in 1..15 (``n - 8``
  in -7..7): 0.5 B per weight plus 2 B per group, scales and nibbles in one tensor laid out
  for the kernels' integer dots. Rows come in tiles of 32. For each group (32 inputs) a tile
  holds 576 bytes: the 32 scales (rows 0-31), then eight 64-byte lines ``j`` whose 4-byte
  lane ``r`` (0-15) holds elements ``4j .. 4j + 3`` of the group, byte ``b`` element
  ``4j + b``: row ``r``'s nibble in its low half, row ``16 + r``'s in its high half. One
  512-bit integer dot thus takes 16 rows times 4 inputs, the two nibbles of a byte meet the
  same input (so a dot of whole bytes yields the high rows without a second mask), and a tile
  is one run of bytes, its scales included. ``data`` is that byte stream viewed as
  ``[out, in * 9 / 16]`` (32 consecutive view rows per tile); ``scale`` is None.

The matrices keep the ``nn.Linear`` layout ``[out, in]``; ``in`` must be a multiple of 64 for
the packed formats, and ``out`` a multiple of 32 (every Qwen3-TTS matrix is).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

FORMATS = ("fp32", "int8", "int4")
TILE = 32  # rows per int8 or int4 tile
INT4_GROUP = 32
INT4_TILE = TILE
INT4_GROUP_BYTES = 576  # one tile's bytes per group of 32 inputs: 32 fp16 scales + 512 nibble bytes


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


# Bump when a format's stored layout (the module doc) changes: packed matrices saved by an older
# layout (``vllm_omni.tts.weight_cache``) are then rebuilt instead of read.
LAYOUT_VERSION = 1

# ``packer(name, fmt, make)`` returns the packed matrix ``name``; ``make()`` gives its fp32 values
# and is called, within the call, only when the matrix must be packed now (a packer may have it
# already).
Packer = Callable[[str, str, Callable[[], Tensor]], "QuantMatrix"]


def pack_now(name: str, fmt: str, make: Callable[[], Tensor]) -> "QuantMatrix":
    """The default packer: quantize ``make()`` at once (``name`` is not used)."""
    return quantize(make(), fmt)


def packed_width(cols: int, fmt: str) -> int:
    """Columns of ``QuantMatrix.data`` for a matrix of ``cols`` inputs in ``fmt``."""
    return cols // INT4_GROUP * INT4_GROUP_BYTES // INT4_TILE if fmt == "int4" else cols


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
    if rows % TILE:
        raise ValueError(f"{fmt} packing needs out_features divisible by {TILE}, got {rows}")
    if fmt == "int8":
        amax = w.abs().amax(dim=1)
        scale = amax / 127.0
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        q = torch.round(w * inv[:, None]).clamp_(-127, 127)
        return QuantMatrix(fmt, _pack_int8_tiles((q + 128).to(torch.uint8)), scale.contiguous(), rows, cols)
    g = w.view(rows, cols // INT4_GROUP, INT4_GROUP)
    d = (g.abs().amax(dim=2) / 7.0).to(torch.float16)  # the stored scale
    df = d.float()
    inv = torch.where(df > 0, 1.0 / df, torch.zeros_like(df))
    n = (torch.round(g * inv[:, :, None]).clamp_(-8, 7) + 8).to(torch.uint8)  # [rows, groups, 32]
    return QuantMatrix(fmt, _pack_tiles(n, d), None, rows, cols)


def _int8_tile_view(rows: int, cols: int) -> tuple[int, ...]:
    """``[rows, cols]`` as ``[tile, half, row r, group, line j, byte b]`` (see the module doc)."""
    return (rows // TILE, 2, TILE // 2, cols // INT4_GROUP, 8, 4)


def _pack_int8_tiles(b: Tensor) -> Tensor:
    """Stored bytes ``[rows, cols]`` in row order -> the int8 tiles, viewed as ``[rows, cols]``."""
    rows, cols = b.shape
    # [tile, half, r, group, j, b] -> [tile, group, j, half, r, b]
    return b.reshape(_int8_tile_view(rows, cols)).permute(0, 3, 4, 1, 2, 5).reshape(rows, cols).contiguous()


def _unpack_int8_tiles(data: Tensor, rows: int, cols: int) -> Tensor:
    """The inverse of ``_pack_int8_tiles``."""
    t, _, r, groups, j, b = _int8_tile_view(rows, cols)
    return data.reshape(t, groups, j, 2, r, b).permute(0, 3, 4, 1, 2, 5).reshape(rows, cols)


def int8_values(m: QuantMatrix) -> Tensor:
    """The int8 values ``q`` ``[rows, cols]`` of an int8 matrix, in row order."""
    return (_unpack_int8_tiles(m.data, m.rows, m.cols).to(torch.int16) - 128).to(torch.int8)


def _pack_tiles(n: Tensor, d: Tensor) -> Tensor:
    """Nibble values ``[rows, groups, 32]`` (0..15) and fp16 scales ``[rows, groups]`` -> the tiles."""
    rows, groups, _ = n.shape
    t = rows // INT4_TILE
    # [tile, low/high, row r, group, line j, byte b] -> [tile, group, j, r, b, low/high]
    v = n.reshape(t, 2, INT4_TILE // 2, groups, 8, 4).permute(0, 3, 4, 2, 5, 1)
    nibbles = (v[..., 0] | (v[..., 1] << 4)).reshape(t, groups, 512)
    scales = d.reshape(t, INT4_TILE, groups).permute(0, 2, 1).contiguous().view(torch.uint8).reshape(t, groups, 64)
    return torch.cat([scales, nibbles], dim=2).reshape(rows, packed_width(groups * INT4_GROUP, "int4")).contiguous()


def _unpack_tiles(data: Tensor, rows: int, cols: int) -> tuple[Tensor, Tensor]:
    """The inverse of ``_pack_tiles``: (nibble values ``[rows, groups, 32]``, fp16 scales ``[rows, groups]``)."""
    t, groups = rows // INT4_TILE, cols // INT4_GROUP
    units = data.reshape(t, groups, INT4_GROUP_BYTES)
    d = units[:, :, :64].contiguous().view(torch.float16).reshape(t, groups, INT4_TILE).permute(0, 2, 1)
    b = units[:, :, 64:].reshape(t, groups, 8, INT4_TILE // 2, 4)  # [tile, group, j, r, b]
    v = torch.stack([b & 0x0F, b >> 4], dim=-1)  # [..., low/high]
    n = v.permute(0, 5, 3, 1, 2, 4).reshape(rows, groups, INT4_GROUP)
    return n, d.reshape(rows, groups)


def int4_scales(m: QuantMatrix) -> Tensor:
    """The fp16 group scales ``[rows, cols / 32]`` of an int4 matrix (stored inside its tiles)."""
    return _unpack_tiles(m.data, m.rows, m.cols)[1]


def dequantize(m: QuantMatrix) -> Tensor:
    """The fp32 matrix the packed one stands for."""
    if m.fmt == "fp32":
        return m.data.clone()
    if m.fmt == "int8":
        return int8_values(m).float() * m.scale[:, None]
    n, d = _unpack_tiles(m.data, m.rows, m.cols)
    w = (n.float() - 8.0) * d.float()[:, :, None]
    return w.view(m.rows, m.cols)


def roundtrip(w: Tensor, fmt: str) -> Tensor:
    """``dequantize(quantize(w, fmt))``."""
    return dequantize(quantize(w, fmt))


def dequantized_block(block, fmt: str):
    """A copy of one decoder block's weights with its seven matrices replaced by their ``fmt``
    round trip (norms stay fp32): what the native kernels compute with, for an fp32 reference."""
    new = copy.copy(block)
    for name, m in block.matrices().items():
        setattr(new, name, roundtrip(m, fmt))
    return new


def dequantized_weights(weights, fmt: str):
    """A copy of Predictor/TalkerWeights whose matrices are replaced by their ``fmt`` round trip.

    Every linear the native kernels quantize is rewritten: the seven block matrices, the
    predictor's ``lm_head`` tables and projection, the talker's ``codec_head``. Norms and
    embedding tables stay fp32 (they are fp32 in the kernels too).
    """
    check_format(fmt)
    out = copy.copy(weights)
    out.layers = [dequantized_block(layer, fmt) for layer in weights.layers]
    if hasattr(weights, "lm_head"):
        out.lm_head = torch.stack([roundtrip(h, fmt) for h in weights.lm_head])
        if weights.proj_weight is not None:
            out.proj_weight = roundtrip(weights.proj_weight, fmt)
    if hasattr(weights, "codec_head"):
        out.codec_head = roundtrip(weights.codec_head, fmt)
    return out
