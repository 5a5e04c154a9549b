"""The fused talker step: one native call runs the 28 blocks, final norm and codec head.

Uses the same block kernel as the fused predictor (``vllm_omni.cpu.predictor.NativeStack``)
with a longer static KV cache (``max_positions``). The cache holds fp16 by default for int8 and
int4 weights: every step reads the whole cache, about 60 MB beside 250 MB of int4 weights at
256 positions in fp32, and fp16 halves that at a rounding error well below the weights' own.
fp32 weights keep an fp32 cache, so that the fp32 build stays an exact match of the reference.
Semantics are those of ``vllm_omni.cpu.reference.ReferenceTalker.step``.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from vllm_omni.cpu.hugepages import into_huge_arena
from vllm_omni.cpu.predictor import NativeStack, vo_mat
from vllm_omni.cpu.quant import Packer, check_format, pack_now
from vllm_omni.cpu.weights import TalkerWeights


def default_kv_cache(fmt: str) -> str:
    """The KV cache precision a talker in ``fmt`` gets unless asked otherwise (see the module doc)."""
    return "fp32" if check_format(fmt) == "fp32" else "fp16"


class FusedTalker:
    """``step(x) -> (logits [3072], hidden [H])`` with a static KV cache of ``max_positions``."""

    def __init__(self, weights: TalkerWeights, fmt: str = "fp32", threads: int | None = None,
                 max_positions: int = 2048, variant: str = "native", kv_cache: str | None = None,
                 packer: Packer = pack_now):
        self.spec, self.fmt = weights.spec, check_format(fmt)
        st = weights.spec.talker
        self.hidden = st.hidden
        self.native = NativeStack(weights.layers, weights.norm, st, fmt, threads, max_positions, variant=variant,
                                  kv_cache=kv_cache or default_kv_cache(fmt), packer=packer, name="talker")
        self.lib = self.native.lib
        self._head_arena, (self.head,), huge = into_huge_arena([packer("talker.head", fmt, lambda: weights.codec_head)])
        self.native.huge_page_bytes += huge
        self.c_head = vo_mat(self.head)
        self.codec_embedding = weights.codec_embedding
        self.max_positions = max_positions
        self.position = 0
        self._logits = torch.empty(self.head.rows)
        self._hidden = torch.empty(st.hidden)

    @property
    def kv_cache(self) -> str:
        """The KV cache precision, "fp32" or "fp16"."""
        return self.native.kv_cache

    @property
    def threads(self) -> int:
        return self.native.threads

    def set_threads(self, threads: int) -> None:
        self.native.set_threads(threads)

    def reset(self) -> None:
        """Empty the cache (the buffers stay allocated)."""
        self.position = 0

    def prefill_random(self, positions: int, seed: int = 0) -> None:
        """Empty the cache, then fill ``positions`` entries with random K/V (benchmark set-up)."""
        if not 0 <= positions < self.max_positions:
            raise ValueError(f"positions must be in 0..{self.max_positions - 1}, got {positions}")
        self.native.fill_cache(positions, seed)
        self.position = positions

    def prefill(self, positions: int, seed: int = 0) -> None:
        """Same as ``prefill_random`` (the name ``ReferenceTalker`` uses for its set-up)."""
        self.prefill_random(positions, seed)

    def step(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """One token ``x`` [H] at the next position -> (logits [3072], post-norm hidden [H])."""
        if self.position >= self.max_positions:
            raise RuntimeError(f"KV cache full ({self.max_positions} positions)")
        xc = x.float().contiguous()
        if xc.shape != (self.hidden,):
            raise ValueError(f"x must be [{self.hidden}], got {tuple(x.shape)}")
        rc = self.lib.vo_talker_step(ctypes.byref(self.native.c), ctypes.byref(self.c_head), xc.data_ptr(),
                                     self.position, self._logits.data_ptr(), self._hidden.data_ptr())
        if rc != 0:
            raise RuntimeError(f"vo_talker_step failed ({rc})")
        self.position += 1
        return self._logits.clone(), self._hidden.clone()

    @property
    def step_bytes(self) -> int:
        """Weight bytes one step reads as packed here (blocks + norm + codec head); KV cache not included."""
        return self.native.bytes + self.head.nbytes
