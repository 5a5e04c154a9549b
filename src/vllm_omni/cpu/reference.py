"""Eager PyTorch reference of the Qwen3-TTS talker and code predictor (batch 1).

Why: the fused kernels and the benchmarks need a plain, readable implementation of the
published architecture to be checked against and timed against. Every op is a stock torch
call; nothing is fused.

The block is a Qwen3 decoder layer: pre-norm RMSNorm (eps 1e-6), q/k RMSNorm over
``head_dim`` before RoPE, plain 1-D RoPE (theta 1e6, rotate-half as in HF Qwen3), GQA
(16 query / 8 KV heads), causal scaled dot-product attention, SwiGLU MLP, no biases.

Weight formats (``fmt``): ``fp32``; ``bf16`` (weights and activations bf16); ``int8``
(``torch.ao.quantization.quantize_dynamic``, per-row int8 weights, fp32 activations);
``int4`` (``_weight_int4pack_mm_for_cpu``, groups of 32, asymmetric scale + zero, bf16
activations). Norms, RoPE and the returned logits/hidden states are fp32 where the input is.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_omni.cpu.sampler import check_sampling, counter_uniforms, draw_uniforms, residual_choice
from vllm_omni.cpu.weights import EMBED_STD, BlockWeights, PredictorWeights, TalkerWeights
from vllm_omni.models.spec import StackSpec

FORMATS = ("fp32", "bf16", "int8", "int4")
INT4_GROUP = 32
INT4_INNER_K_TILES = 2

Linear = Callable[[Tensor], Tensor]


def act_dtype(fmt: str) -> torch.dtype:
    """Activation dtype of the eager path for a weight format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; valid: {', '.join(FORMATS)}")
    return torch.bfloat16 if fmt in ("bf16", "int4") else torch.float32


def _int4_linear(w: Tensor, bias: Tensor | None) -> Linear:
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs in_features divisible by {INT4_GROUP}, got {k}")
    t = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = t.amin(-1, keepdim=True), t.amax(-1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    zero = lo + scale * 8  # the kernel dequantizes as (q - 8) * scale + zero
    q = ((t - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES)
    sz = torch.cat([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [k/g, n, 2]
    b = None if bias is None else bias.to(torch.bfloat16)

    def run(x: Tensor) -> Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, sz)
        return y if b is None else y + b

    return run


def make_linear(w: Tensor, fmt: str, bias: Tensor | None = None) -> Linear:
    """``x -> x @ w.T (+ bias)`` with ``w`` stored in ``fmt``; ``x`` is in ``act_dtype(fmt)``."""
    dt = act_dtype(fmt)
    if fmt in ("fp32", "bf16"):
        wc = w.to(dt).contiguous()
        bc = None if bias is None else bias.to(dt)
        return lambda x: F.linear(x, wc, bc)
    if fmt == "int8":
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(w)
            if bias is not None:
                lin.bias.copy_(bias)
        with warnings.catch_warnings():  # torch.ao's deprecation notices; the kernel is what we time
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)[0]
    return _int4_linear(w, bias)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF Qwen3RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin of shape [T, head_dim] for integer ``positions`` (HF default RoPE)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = positions[:, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [heads, T, head_dim]; cos/sin: [T, head_dim]."""
    return x * cos + rotate_half(x) * sin


class KVCache:
    """K and V of one layer, ``[kv_heads, capacity, head_dim]``, grown by doubling when full."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 16):
        self.k = torch.empty(kv_heads, capacity, head_dim, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v ([kv_heads, T, head_dim]) and return views of the whole cache."""
        need = self.length + k.shape[1]
        if need > self.k.shape[1]:
            cap = max(need, 2 * self.k.shape[1])
            for name in ("k", "v"):
                old = getattr(self, name)
                new = old.new_empty(old.shape[0], cap, old.shape[2])
                new[:, : self.length] = old[:, : self.length]
                setattr(self, name, new)
        self.k[:, self.length : need] = k
        self.v[:, self.length : need] = v
        self.length = need
        return self.k[:, :need], self.v[:, :need]


class ReferenceBlock:
    """One Qwen3 decoder layer, eager."""

    def __init__(self, w: BlockWeights, stack: StackSpec, fmt: str = "fp32"):
        self.stack, self.dtype = stack, act_dtype(fmt)
        self.input_norm, self.post_norm = w.input_norm.to(self.dtype), w.post_norm.to(self.dtype)
        self.q_norm, self.k_norm = w.q_norm.to(self.dtype), w.k_norm.to(self.dtype)
        self.lin = {name: make_linear(m, fmt) for name, m in w.matrices().items()}

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache) -> Tensor:
        """x: [T, H] at the positions cos/sin were built for, following ``cache.length`` keys."""
        s, lin, eps = self.stack, self.lin, self.stack.rms_eps
        t = x.shape[0]
        h = rms_norm(x, self.input_norm, eps)
        q = rms_norm(lin["q_proj"](h).view(t, s.heads, s.head_dim), self.q_norm, eps).transpose(0, 1)
        k = rms_norm(lin["k_proj"](h).view(t, s.kv_heads, s.head_dim), self.k_norm, eps).transpose(0, 1)
        v = lin["v_proj"](h).view(t, s.kv_heads, s.head_dim).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.append(k, v)
        n = keys.shape[1]
        mask = None
        if t > 1:  # query i sits at key position n - t + i
            mask = torch.ones(t, n, dtype=torch.bool).tril(diagonal=n - t)
        a = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)
        x = x + lin["o_proj"](a[0].transpose(0, 1).reshape(t, s.q_dim))
        h = rms_norm(x, self.post_norm, eps)
        return x + lin["down_proj"](F.silu(lin["gate_proj"](h)) * lin["up_proj"](h))


class ReferenceStack:
    """A stack of blocks with one KV cache per layer and a final norm."""

    def __init__(self, layers: list[BlockWeights], norm: Tensor, stack: StackSpec, fmt: str, capacity: int):
        self.stack, self.dtype = stack, act_dtype(fmt)
        self.blocks = [ReferenceBlock(w, stack, fmt) for w in layers]
        self.norm = norm.to(self.dtype)
        self._capacity = capacity
        self.reset()

    def reset(self) -> None:
        s = self.stack
        self.caches = [KVCache(s.kv_heads, s.head_dim, self.dtype, self._capacity) for _ in self.blocks]

    def clear(self) -> None:
        """Empty the caches without freeing them (a fresh cache, same buffers)."""
        for c in self.caches:
            c.length = 0

    @property
    def length(self) -> int:
        return self.caches[0].length

    def forward_last(self, x: Tensor) -> Tensor:
        """Run x ([T, H], act dtype) at the next T positions; final-normed hidden of the last one."""
        start = self.length
        pos = torch.arange(start, start + x.shape[0])
        cos, sin = rope_tables(pos, self.stack.head_dim, self.stack.rope_theta, self.dtype)
        for block, cache in zip(self.blocks, self.caches):
            x = block.forward(x, cos, sin, cache)
        return rms_norm(x[-1:], self.norm, self.stack.rms_eps)


class ReferenceTalker:
    """The 28-layer talker with a growing KV cache; one token per ``step``."""

    def __init__(self, weights: TalkerWeights, fmt: str = "fp32", capacity: int = 256):
        self.spec, self.fmt = weights.spec, fmt
        self.stack = ReferenceStack(weights.layers, weights.norm, weights.spec.talker, fmt, capacity)
        self.codec_head = make_linear(weights.codec_head, fmt)
        self.codec_embedding = weights.codec_embedding

    @property
    def position(self) -> int:
        """Number of positions in the KV cache (the next token's position)."""
        return self.stack.length

    def reset(self) -> None:
        self.stack.clear()

    @torch.inference_mode()
    def step(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """One token ``x`` [H] -> (logits [3072], post-norm hidden [H]), both fp32."""
        h = self.stack.forward_last(x.to(self.stack.dtype)[None])
        return self.codec_head(h)[0].float(), h[0].float()

    @torch.inference_mode()
    def prefill(self, positions: int, seed: int = 0) -> None:
        """Empty the cache, then fill ``positions`` entries from random inputs (benchmark set-up)."""
        self.reset()
        if positions <= 0:
            return
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(positions, self.spec.talker.hidden, generator=g) * EMBED_STD
        self.stack.forward_last(x.to(self.stack.dtype))


class ReferencePredictor:
    """The 5-layer code predictor: 15 passes per frame give codes c1..c15.

    Pass 1 prefills ``[proj(past_hidden), proj(c0_embed)]`` at positions 0, 1 and reads
    ``lm_head[0]`` -> c1; pass k (2..15) feeds ``proj(codec_embedding[k-2][c_{k-1}])`` at
    position k and reads ``lm_head[k-1]`` -> c_k. The cache is emptied every frame and c15 is
    never fed back. ``proj`` is the identity for 0.6B and ``small_to_mtp_projection`` for 1.7B.
    """

    def __init__(self, weights: PredictorWeights, fmt: str = "fp32"):
        self.spec, self.fmt, self.weights = weights.spec, fmt, weights
        n = self.spec.num_code_groups
        self.stack = ReferenceStack(weights.layers, weights.norm, weights.spec.predictor, fmt, n)
        self.heads = [make_linear(weights.lm_head[i], fmt) for i in range(self.spec.residual_codebooks)]
        self.proj = None
        if weights.proj_weight is not None:
            self.proj = make_linear(weights.proj_weight, fmt, weights.proj_bias)
        # (start position, tokens fed, cache length after the pass) of each pass of the last frame
        self.trace: list[tuple[int, int, int]] = []

    def _input(self, x: Tensor) -> Tensor:
        x = x.to(self.stack.dtype)
        return x if self.proj is None else self.proj(x)

    @torch.inference_mode()
    def frame(
        self,
        past_hidden: Tensor,
        c0_embed: Tensor,
        *,
        greedy: bool = True,
        temperature: float = 0.9,
        top_k: int = 50,
        uniforms: Tensor | None = None,
        noise_key: int | None = None,
        seed: int = 0,
    ) -> tuple[Tensor, Tensor]:
        """(codes int64 [15] = c1..c15, embed_sum [H_t] = c0_embed + sum of their embeddings).

        Sampling is argmax when ``greedy``; otherwise Gumbel-max over the top-k of
        logits/temperature with noise ``-log(-log(uniforms[k-1]))``. ``uniforms`` [15, 2048] are
        given, or stand for ``noise_key`` (``counter_uniforms``), or are drawn from
        ``torch.Generator().manual_seed(seed)``.
        """
        n, table = self.spec.residual_codebooks, self.weights.codec_embedding
        if not greedy:
            check_sampling(temperature, top_k, self.spec.codebook_size)
        if not greedy and uniforms is None:
            uniforms = (counter_uniforms(noise_key, n, self.spec.codebook_size) if noise_key is not None
                        else draw_uniforms(torch.Generator().manual_seed(seed), n, self.spec.codebook_size))
        self.stack.clear()
        self.trace = []
        x = self._input(torch.stack([past_hidden, c0_embed]))
        codes = torch.empty(n, dtype=torch.int64)
        embed_sum = c0_embed.float().clone()
        for k in range(1, n + 1):
            start = self.stack.length
            h = self.stack.forward_last(x)
            self.trace.append((start, x.shape[0], self.stack.length))
            logits = self.heads[k - 1](h)[0].float()
            c = residual_choice(logits, greedy=greedy, temperature=temperature, top_k=top_k,
                                uniforms=None if greedy else uniforms[k - 1])
            codes[k - 1] = c
            row = table[k - 1, c]
            embed_sum += row
            if k < n:
                x = self._input(row[None])
        return codes, embed_sum
