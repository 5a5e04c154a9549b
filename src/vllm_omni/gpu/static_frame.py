"""The talker step and the predictor's 15-pass frame with static KV caches, so that each can
be captured once in a CUDA graph and replayed every frame.

Why: a CUDA graph replays fixed kernels on fixed addresses. Nothing inside a captured step may
grow a cache, read a value back to the host or depend on a position the host computes. Here
every layer's KV cache has a fixed capacity, positions live in a device tensor (the talker
advances its own), attention runs over the whole cache with the unused slots masked out, and
every choice (argmax, Gumbel top-k) and embedding lookup stays on the device.

The arithmetic is that of :mod:`vllm_omni.cpu.reference` (a Qwen3 block with q/k RMSNorm,
RoPE, GQA and SwiGLU), with QKV and gate/up merged into one matrix each; the tests compare the
two on the CPU in fp32. The same code runs eagerly, on the CPU or on CUDA.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_omni.cpu.frame import BOS_ID
from vllm_omni.cpu.reference import apply_rope, rms_norm
from vllm_omni.cpu.weights import EMBED_STD, BlockWeights, PredictorWeights, TalkerWeights
from vllm_omni.models.spec import StackSpec


class StaticStack:
    """Decoder blocks with a fixed-capacity KV cache ``[layers, kv_heads, capacity, head_dim]``."""

    def __init__(self, layers: list[BlockWeights], norm: Tensor, stack: StackSpec, *, capacity: int,
                 dtype: torch.dtype, device: torch.device | str):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.stack, self.capacity, self.dtype, self.device = stack, capacity, dtype, torch.device(device)
        s = stack

        def put(t: Tensor) -> Tensor:
            return t.to(device=self.device, dtype=dtype).contiguous()

        self.layers = [
            {
                "input_norm": put(w.input_norm), "post_norm": put(w.post_norm),
                "q_norm": put(w.q_norm), "k_norm": put(w.k_norm),
                "qkv": put(torch.cat([w.q_proj, w.k_proj, w.v_proj])), "o": put(w.o_proj),
                "gate_up": put(torch.cat([w.gate_proj, w.up_proj])), "down": put(w.down_proj),
            }
            for w in layers
        ]
        self.norm = put(norm)
        # Zeros, not empty: a masked slot still meets V with weight 0, and 0 * NaN would be NaN.
        self.k = torch.zeros(len(layers), s.kv_heads, capacity, s.head_dim, dtype=dtype, device=self.device)
        self.v = torch.zeros_like(self.k)
        self.key_pos = torch.arange(capacity, device=self.device)
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float) / s.head_dim))
        self.inv_freq = inv_freq.to(self.device)

    def rope(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin ``[T, head_dim]`` for positions on the device (the reference's RoPE tables)."""
        freqs = pos[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def forward_last(self, x: Tensor, pos: Tensor) -> Tensor:
        """x ``[T, H]`` at positions ``pos`` ``[T]``: write K/V there, attend to every slot at or
        before each query's position, return the final-normed hidden state of the last token."""
        s = self.stack
        group = s.heads // s.kv_heads
        cos, sin = self.rope(pos)
        # Query heads h = g * group + r share KV head g: fold them into one [kv_heads, group*T]
        # batch so attention is plain multi-head attention against the cache (any SDPA backend).
        mask = (self.key_pos[None, :] <= pos[:, None]).repeat(group, 1)  # [group*T, capacity]
        for i, L in enumerate(self.layers):
            x = self._block(i, L, x, pos, cos, sin, mask, group)
        return rms_norm(x[-1:], self.norm, s.rms_eps)

    def _block(self, i: int, L: dict[str, Tensor], x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor,
               mask: Tensor, group: int) -> Tensor:
        s, eps, t = self.stack, self.stack.rms_eps, x.shape[0]
        h = rms_norm(x, L["input_norm"], eps)
        q, k, v = F.linear(h, L["qkv"]).split([s.q_dim, s.kv_dim, s.kv_dim], dim=-1)
        q = rms_norm(q.view(t, s.heads, s.head_dim), L["q_norm"], eps).transpose(0, 1)
        k = rms_norm(k.view(t, s.kv_heads, s.head_dim), L["k_norm"], eps).transpose(0, 1)
        v = v.view(t, s.kv_heads, s.head_dim).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k[i].index_copy_(1, pos, k)
        self.v[i].index_copy_(1, pos, v.contiguous())
        qg = q.reshape(s.kv_heads, group * t, s.head_dim)
        a = F.scaled_dot_product_attention(qg[None], self.k[i][None], self.v[i][None], attn_mask=mask)[0]
        # reshape, not view: on CUDA the memory-efficient kernel returns a transposed, non-contiguous output
        x = x + F.linear(a.reshape(s.heads, t, s.head_dim).transpose(0, 1).reshape(t, s.q_dim), L["o"])
        h = rms_norm(x, L["post_norm"], eps)
        gate, up = F.linear(h, L["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, L["down"])


class StaticTalker:
    """The talker with a static cache; ``step`` writes at ``self.pos`` and advances it on the device."""

    def __init__(self, weights: TalkerWeights, *, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.spec = weights.spec
        self.stack = StaticStack(weights.layers, weights.norm, weights.spec.talker, capacity=capacity,
                                 dtype=dtype, device=device)
        self.device, self.dtype = self.stack.device, dtype
        self.codec_head = weights.codec_head.to(device=self.device, dtype=dtype).contiguous()
        self.pos = torch.zeros(1, dtype=torch.int64, device=self.device)

    def set_position(self, position: int) -> None:
        """Make ``position`` the next one written (earlier slots stay as they are)."""
        if not 0 <= position < self.stack.capacity:
            raise ValueError(f"position {position} is outside the static cache of {self.stack.capacity} slots")
        self.pos.fill_(position)

    @torch.no_grad()
    def step(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """One token ``x`` [H] -> (logits [3072], post-norm hidden [H]), both fp32; capturable."""
        h = self.stack.forward_last(x.to(self.dtype)[None], self.pos)
        self.pos.add_(1)
        return F.linear(h, self.codec_head)[0].float(), h[0].float()

    @torch.no_grad()
    def prefill(self, positions: int, seed: int = 0) -> None:
        """Fill slots 0..positions-1 from the reference's random inputs (benchmark set-up)."""
        if not 0 <= positions < self.stack.capacity:
            raise ValueError(f"cannot prefill {positions} positions into a cache of {self.stack.capacity} slots")
        self.pos.zero_()
        if positions:
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(positions, self.spec.talker.hidden, generator=g) * EMBED_STD
            pos = torch.arange(positions, device=self.device)
            self.stack.forward_last(x.to(device=self.device, dtype=self.dtype), pos)
        self.pos.fill_(positions)


class StaticPredictor:
    """The code predictor: 15 passes per frame over a 16-slot static cache, all on the device.

    Pass 1 feeds ``[proj(past_hidden), proj(c0_embed)]`` at positions 0 and 1; pass k (2..15)
    feeds ``proj(codec_embedding[k-2][c_{k-1}])`` at position k. The cache is not cleared
    between frames: each frame rewrites slots 0..15 in order and the mask hides the rest.
    """

    def __init__(self, weights: PredictorWeights, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", temperature: float = 0.9, top_k: int = 50):
        spec = self.spec = weights.spec
        self.stack = StaticStack(weights.layers, weights.norm, spec.predictor, capacity=spec.num_code_groups,
                                 dtype=dtype, device=device)
        self.device, self.dtype = self.stack.device, dtype
        self.temperature, self.top_k = temperature, top_k
        self.heads = weights.lm_head.to(device=self.device, dtype=dtype).contiguous()
        self.table = weights.codec_embedding.to(self.device).contiguous()  # fp32, as the reference sums it
        self.proj = None
        if weights.proj_weight is not None:
            self.proj = (weights.proj_weight.to(device=self.device, dtype=dtype),
                         weights.proj_bias.to(device=self.device, dtype=dtype))
        n = spec.residual_codebooks
        self.positions = [torch.arange(2, device=self.device)] + [
            torch.full((1,), k, dtype=torch.int64, device=self.device) for k in range(2, n + 1)
        ]

    def _input(self, x: Tensor) -> Tensor:
        x = x.to(self.dtype)
        return x if self.proj is None else F.linear(x, *self.proj)

    def choose(self, logits: Tensor, uniforms: Tensor | None) -> Tensor:
        """A 0-d device tensor: argmax, or Gumbel-max over the top-k of ``logits / T``.

        Tensors index tensors only through ``index_select``: indexing with a 0-d tensor
        (``idx[j]``) reads ``j`` back to the host, which a graph capture forbids."""
        if uniforms is None:
            return torch.argmax(logits)
        vals, idx = torch.topk(logits / self.temperature, self.top_k)
        noise = -torch.log(-torch.log(uniforms.index_select(0, idx)))
        return idx.index_select(0, torch.argmax(vals + noise).view(1))[0]

    def pass_logits(self, x: Tensor, pos: Tensor, head: Tensor) -> Tensor:
        """One pass: tokens ``x`` [T, H] at positions ``pos`` [T], then ``head`` [V, H] on the last
        one; fp32 logits [V]. The head comes in as a tensor so that a compiled pass
        (``vllm_omni.cpu.compiled``) serves every codebook with one graph."""
        return F.linear(self.stack.forward_last(x, pos), head)[0].float()

    @torch.no_grad()
    def frame(self, past_hidden: Tensor, c0_embed: Tensor, uniforms: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(codes int64 [15], embed_sum fp32 [H_t]) as the reference computes them; greedy when
        ``uniforms`` ([15, 2048] on the device) is None. No host synchronisation: capturable."""
        n = self.spec.residual_codebooks
        x = self._input(torch.stack([past_hidden, c0_embed]))
        codes = torch.empty(n, dtype=torch.int64, device=self.device)
        embed_sum = c0_embed.float().clone()
        for k in range(1, n + 1):
            logits = self.pass_logits(x, self.positions[k - 1], self.heads[k - 1])
            c = self.choose(logits, None if uniforms is None else uniforms[k - 1])
            codes[k - 1] = c
            row = self.table[k - 1].index_select(0, c.view(1))  # [1, H_t]
            embed_sum = embed_sum + row[0]
            if k < n:
                x = self._input(row)
        return codes, embed_sum


class StaticFrame:
    """One whole frame on the device, in two parts that can each become a CUDA graph.

    ``talker_part``: talker step, c0 = argmax over the codebook ids, c0's embedding.
    ``predictor_part``: fresh uniforms (unless greedy), the 15 passes, and the next talker
    input (embedding sum + a fixed random text term). Every buffer it reads or writes is
    allocated here, once; ``codes`` holds c0..c15 of the last frame.
    """

    def __init__(self, talker: StaticTalker, predictor: StaticPredictor, codec_embedding: Tensor, *,
                 greedy_residuals: bool = False, seed: int = 0):
        self.talker, self.predictor = talker, predictor
        dev, spec = talker.device, talker.spec
        self.codebook_size = spec.codebook_size
        self.embedding = codec_embedding.to(dev).float()
        g = torch.Generator().manual_seed(seed + 1)
        self.text = (torch.randn(spec.talker.hidden, generator=g) * EMBED_STD).to(dev)
        self.x = (self.embedding[BOS_ID] + self.text).clone()
        self.hidden = torch.zeros(spec.talker.hidden, device=dev)
        self.c0_embed = torch.zeros_like(self.hidden)
        self.codes = torch.zeros(spec.num_code_groups, dtype=torch.int64, device=dev)
        self.uniforms = None if greedy_residuals else torch.rand(
            spec.residual_codebooks, spec.codebook_size, generator=torch.Generator().manual_seed(seed)).to(dev)

    @torch.no_grad()
    def talker_part(self) -> None:
        logits, hidden = self.talker.step(self.x)
        c0 = torch.argmax(logits[: self.codebook_size])
        self.hidden.copy_(hidden)
        self.c0_embed.copy_(self.embedding.index_select(0, c0.view(1))[0])
        self.codes[0] = c0

    @torch.no_grad()
    def predictor_part(self) -> None:
        if self.uniforms is not None:
            self.uniforms.uniform_()
        codes, embed_sum = self.predictor.frame(self.hidden, self.c0_embed, self.uniforms)
        self.codes[1:].copy_(codes)
        self.x.copy_(embed_sum + self.text)


def capture(fn: Callable[[], None], warmup: int = 3) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph (after ``warmup`` calls on a side stream); returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay
