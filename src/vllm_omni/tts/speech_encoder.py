"""The 12 Hz encoder of a Base checkpoint's speech tokenizer: 24 kHz audio -> codes [frames, 16].

It is the encoder half of Mimi, as the official tokenizer runs it through transformers'
``MimiModel.encode`` (``qwen_tts`` 0.1.1 ``Qwen3TTSTokenizerV2Model.encode``) on a whole
reference at once:

1. SEANet: a k=7 convolution, then per stride (4, 5, 6, 8) a residual block (ELU, k=3
   convolution to half the channels, ELU, 1x1 back, plus the input) and an ELU with a strided
   convolution (kernel twice the stride) that doubles the channels, then an ELU and a k=3
   convolution to 512: one vector every 960 samples (25 Hz). Every convolution is causal: zeros
   on the left, and on the right as many as make the last stride whole.
2. A transformer of 8 layers (LayerNorm, attention with RoPE over all earlier frames, a GELU
   MLP, each branch scaled per channel), no final norm.
3. A causal stride-2 convolution (k=4, edges repeated rather than zero-padded): 12.5 Hz.
4. The split residual quantizer: codebook 0 is the nearest entry of the semantic codebook to a
   projection of each frame; codebooks 1..15 the residual chain of the acoustic ones over their
   own projection of the same frame. Nearest is Euclidean (``torch.cdist``), each codebook its
   running sums over its usage counts.

The codes are cut to ``ceil(samples / 1920)`` frames. A voice keeps them
(``vllm_omni.tts.voice``), so a reference is encoded once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_omni.tts.config import SpeechEncoderConfig
from vllm_omni.tts.layout import seanet_layers

PREFIX = "encoder"
CHUNK = 24 * 1920  # samples a SEANet pass takes (1.92 s): a whole number of every stride's product


def _causal(x: Tensor, w: Tensor, b: Tensor | None, stride: int = 1, dilation: int = 1,
            mode: str = "constant") -> Tensor:
    """A causal convolution as Mimi pads one: the kernel's reach less the stride on the left, and on the
    right what completes the last stride."""
    k = (w.shape[-1] - 1) * dilation + 1
    n, left = x.shape[-1], k - stride
    frames = math.ceil((n - k + left) / stride + 1) - 1
    right = frames * stride + k - left - n
    return F.conv1d(F.pad(x, (left, right), mode=mode), w, b, stride=stride, dilation=dilation)


def _rope(t: int, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = (inv[:, None] @ torch.arange(t, dtype=torch.float32)[None]).transpose(0, 1)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class SpeechEncoder:
    """The 12 Hz encoder with the weights of a Base checkpoint (``Checkpoint.speech_encoder_weights``)."""

    def __init__(self, weights: dict[str, Any], cfg: SpeechEncoderConfig):
        self.w, self.cfg = weights, cfg
        self.codebooks = {}
        for part, n in (("semantic", cfg.semantic_quantizers), ("acoustic", cfg.valid_quantizers - cfg.semantic_quantizers)):
            q = f"{PREFIX}.quantizer.{part}_residual_vector_quantizer"
            self.codebooks[part] = [weights[f"{q}.layers.{j}.codebook.embed_sum"]
                                    / weights[f"{q}.layers.{j}.codebook.cluster_usage"].clamp(min=1e-5)[:, None]
                                    for j in range(n)]

    def _seanet(self, x: Tensor) -> Tensor:
        """[1, 1, N] -> [1, hidden, ceil(N / hop)], ``CHUNK`` samples at a time: each convolution keeps the tail
        of its input that its next window reaches back into (zeros at the start, Mimi's left padding) and
        the last chunk is zero-padded to a whole stride, so the output is the whole-signal pass's. In
        pieces, no layer's output is the hundreds of megabytes that 64 channels at 24 kHz make for a
        whole reference, which the allocator would otherwise map and fault in anew on every call."""
        history: dict[str, Tensor] = {}
        n = x.shape[-1]
        return torch.cat([self._seanet_chunk(x[..., a:a + CHUNK], history, a + CHUNK >= n)
                          for a in range(0, n, CHUNK)], -1)

    def _seanet_chunk(self, x: Tensor, history: dict[str, Tensor], last: bool) -> Tensor:
        cfg, w, p = self.cfg, self.w, f"{PREFIX}.encoder.layers"
        strides = list(reversed(cfg.ratios))
        down = 0

        def conv(x: Tensor, name: str, stride: int = 1, dilation: int = 1) -> Tensor:
            weight = w[f"{name}.weight"]
            left = (weight.shape[-1] - 1) * dilation + 1 - stride
            full = torch.cat([history.get(name, x.new_zeros(x.shape[0], x.shape[1], left)), x], -1)
            if left:
                history[name] = full[..., full.shape[-1] - left:]
            if last:
                full = F.pad(full, (0, -x.shape[-1] % stride))
            return F.conv1d(full, weight, w[f"{name}.bias"], stride=stride, dilation=dilation)

        for kind, i in seanet_layers(cfg):
            if kind == "conv":
                x = conv(x, f"{p}.{i}.conv")
            elif kind == "res":
                j = (i - 1) % (cfg.residual_layers + 2)  # the block's place among its stride's residual blocks
                h = conv(F.elu(x), f"{p}.{i}.block.1.conv", dilation=cfg.dilation_growth ** j)
                x = x + conv(F.elu(h), f"{p}.{i}.block.3.conv")
            elif kind == "down":
                x = conv(F.elu(x), f"{p}.{i}.conv", stride=strides[down])
                down += 1
            else:
                x = conv(F.elu(x), f"{p}.{i}.conv")
        return x

    def _transformer(self, x: Tensor) -> Tensor:
        """[T, hidden] through every layer, each frame attending to itself and all before it."""
        cfg, w = self.cfg, self.w
        t = x.shape[0]
        cos, sin = _rope(t, cfg.head_dim, cfg.rope_theta)
        groups = cfg.heads // cfg.kv_heads
        for i in range(cfg.layers):
            p = f"{PREFIX}.encoder_transformer.layers.{i}"
            h = F.layer_norm(x, (cfg.hidden,), w[f"{p}.input_layernorm.weight"], w[f"{p}.input_layernorm.bias"],
                             cfg.norm_eps)
            q = F.linear(h, w[f"{p}.self_attn.q_proj.weight"]).view(t, cfg.heads, cfg.head_dim).transpose(0, 1)
            k = F.linear(h, w[f"{p}.self_attn.k_proj.weight"]).view(t, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
            v = F.linear(h, w[f"{p}.self_attn.v_proj.weight"]).view(t, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            if groups > 1:
                k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=t > 1)[0]
            a = F.linear(a.transpose(0, 1).reshape(t, -1), w[f"{p}.self_attn.o_proj.weight"])
            x = x + w[f"{p}.self_attn_layer_scale.scale"] * a
            h = F.layer_norm(x, (cfg.hidden,), w[f"{p}.post_attention_layernorm.weight"],
                             w[f"{p}.post_attention_layernorm.bias"], cfg.norm_eps)
            h = F.linear(F.gelu(F.linear(h, w[f"{p}.mlp.fc1.weight"])), w[f"{p}.mlp.fc2.weight"])
            x = x + w[f"{p}.mlp_layer_scale.scale"] * h
        return x

    def _quantize(self, x: Tensor) -> Tensor:
        """Codes [valid_quantizers, T] of frames [1, hidden, T]."""
        codes = []
        for part, books in self.codebooks.items():
            proj = self.w[f"{PREFIX}.quantizer.{part}_residual_vector_quantizer.input_proj.weight"]
            residual = F.conv1d(x, proj)[0].transpose(0, 1)  # [T, codebook_dim]
            for book in books:
                idx = torch.cdist(residual[None].float(), book[None].float(), p=2)[0].argmin(dim=-1)
                residual = residual - F.embedding(idx, book)
                codes.append(idx)
        return torch.stack(codes)

    @torch.inference_mode()
    def encode(self, samples: Tensor) -> Tensor:
        """Codes int64 [ceil(N / 1920), valid_quantizers] of fp32 24 kHz samples [N]."""
        cfg = self.cfg
        n = samples.shape[-1]
        x = self._seanet(samples.float()[None, None])
        x = self._transformer(x[0].transpose(0, 1)).transpose(0, 1)[None]
        x = _causal(x, self.w[f"{PREFIX}.downsample.conv.weight"], None, stride=cfg.downsample_stride,
                    mode="replicate")
        return self._quantize(x)[:, : -(-n // cfg.samples_per_frame)].transpose(0, 1).contiguous()
