"""The code2wav transformer in one native call, in bf16 (``csrc/vo_decoder.cpp``, ``vo_dec_transformer``).

The decoder's transformer sees one sample per frame, so at streaming sizes (one to a few frames a
call) its time went to the 100-odd PyTorch ops of its eight layers, not to arithmetic. Here the
input projection, the eight pre-norm layers (RMSNorm, sliding-window attention with RoPE,
LayerScale, SwiGLU) and the output projection run in one parallel region; every linear layer is
the bf16 conv loop of ``vllm_omni.cpu.conv`` as a 1x1 conv, the rest in fp32. LayerScale is
folded into the o and down projections' rows when the weights are packed.

State between calls is each layer's keys and values of the last ``window - 1`` positions, as the
PyTorch layers keep it ([heads, n, head_dim]), so the two are interchangeable mid-utterance.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from vllm_omni.cpu import native
from vllm_omni.cpu.conv import Bf16Conv, check_call


@dataclass
class LayerWeights:
    """One layer's weights as the checkpoint has them ([out, in] matrices, per-channel vectors)."""

    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    input_norm: Tensor
    post_norm: Tensor
    attn_scale: Tensor
    mlp_scale: Tensor




class Bf16DecoderTransformer:
    """x [latent, T] at absolute positions ``position ..`` -> y [latent, T]; see the module doc."""

    def __init__(self, in_proj: tuple[Tensor, Tensor], out_proj: tuple[Tensor, Tensor], final_norm: Tensor,
                 layers: list[LayerWeights], heads: int, head_dim: int, window: int, eps: float,
                 threads: int | None = None, variant: str = "native"):
        self.heads, self.head_dim, self.window, self.threads = heads, head_dim, window, threads
        self.hidden, self.latent = in_proj[0].shape
        self.lib = native.load(variant)

        def _linear(w: Tensor, b: Tensor | None = None) -> Bf16Conv:
            return Bf16Conv(w.float()[:, :, None], b, variant=variant)
        self._keep: list[object] = []

        def keep(t: Tensor) -> int:
            t = t.float().contiguous()
            self._keep.append(t)
            return t.data_ptr()

        def packed(conv: Bf16Conv) -> int:
            self._keep.append(conv)
            return conv.packed.data_ptr()

        self.c_layers = (native.VoDecLayer * len(layers))()
        for c, w in zip(self.c_layers, layers):
            c.qkv = packed(_linear(torch.cat([w.q, w.k, w.v])))
            c.o = packed(_linear(w.o.float() * w.attn_scale.float()[:, None]))
            c.gate_up = packed(_linear(torch.cat([w.gate, w.up])))
            c.down = packed(_linear(w.down.float() * w.mlp_scale.float()[:, None]))
            c.input_norm, c.post_norm = keep(w.input_norm), keep(w.post_norm)
        self.model = native.VoDecTransformer(
            n_layers=len(layers), latent=self.latent, hidden=self.hidden, inter=layers[0].gate.shape[0], heads=heads,
            head_dim=head_dim, window=window, eps=eps, in_proj=packed(_linear(in_proj[0])), in_bias=keep(in_proj[1]),
            out_proj=packed(_linear(out_proj[0])), out_bias=keep(out_proj[1]), final_norm=keep(final_norm),
            layers=self.c_layers)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, past: list[tuple[Tensor, Tensor]]
                 ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """(y [latent, T], each layer's keys and values for the next call) from x [latent, T], the RoPE
        tables of its positions (cos, sin [T, head_dim]) and each layer's past keys and values
        ([heads, P, head_dim], the same P < window for every layer). New tensors."""
        ys, news = self.many([x], [(cos, sin)], [past])
        return ys[0], news[0]

    def many(self, xs: list[Tensor], ropes: list[tuple[Tensor, Tensor]], pasts: list[list[tuple[Tensor, Tensor]]]
             ) -> tuple[list[Tensor], list[list[tuple[Tensor, Tensor]]]]:
        """``__call__`` for several streams in one call, each at its own positions with its own keys."""
        if not (len(xs) == len(ropes) == len(pasts)) or not xs:
            raise ValueError(f"{len(xs)} inputs, {len(ropes)} RoPE tables and {len(pasts)} pasts")
        keep: list[object] = []
        parts = (native.VoDecPart * len(xs))()
        ys, news = [], []

        def pointers(ts: list[Tensor]):
            arr = (ctypes.c_void_p * len(ts))(*[s.data_ptr() for s in ts])
            keep.append(arr)
            return ctypes.cast(arr, ctypes.c_void_p)

        for part, x, (cos, sin), past in zip(parts, xs, ropes, pasts):
            x = x.float().contiguous()
            t = x.shape[1]
            if x.shape[0] != self.latent or t < 1:
                raise ValueError(f"the decoder transformer takes [{self.latent}, T >= 1], got {list(x.shape)}")
            if len(past) != len(self.c_layers):
                raise ValueError(f"{len(past)} layers of past keys for {len(self.c_layers)} layers")
            n = past[0][0].shape[1]
            for k, v in past:
                for s in (k, v):
                    if tuple(s.shape) != (self.heads, n, self.head_dim):
                        raise ValueError(f"past keys and values are [{self.heads}, {n}, {self.head_dim}] in every "
                                         f"layer, got {list(s.shape)}")
            past = [(k.float().contiguous(), v.float().contiguous()) for k, v in past]
            n_keep = min(n + t, self.window - 1)
            new = [(torch.empty(self.heads, n_keep, self.head_dim), torch.empty(self.heads, n_keep, self.head_dim))
                   for _ in past]
            cos, sin = cos.float().contiguous(), sin.float().contiguous()
            if tuple(cos.shape) != (t, self.head_dim) or tuple(sin.shape) != (t, self.head_dim):
                raise ValueError(f"RoPE tables are [{t}, {self.head_dim}], got {list(cos.shape)}, {list(sin.shape)}")
            y = torch.empty(self.latent, t)
            keep += [x, cos, sin, past]
            part.x, part.y, part.T, part.rope_cos, part.rope_sin, part.P = (
                x.data_ptr(), y.data_ptr(), t, cos.data_ptr(), sin.data_ptr(), n)
            part.past_k, part.past_v = pointers([k for k, _ in past]), pointers([v for _, v in past])
            part.new_k, part.new_v = pointers([k for k, _ in new]), pointers([v for _, v in new])
            ys.append(y)
            news.append(new)
        check_call(self.lib.vo_dec_transformer(ctypes.byref(self.model), parts, len(xs),
                                               self.threads or torch.get_num_threads()),
                   f"vo_dec_transformer on {len(xs)} streams")
        return ys, news
