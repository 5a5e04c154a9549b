"""Code2wav, streaming: each frame's 16 codes become its 1920 samples as soon as they exist.

The graph is the official 12 Hz decoder's (``Qwen3TTSTokenizerV2Decoder``): split-RVQ
dequantisation, a causal k=3 conv, an 8-layer sliding-window transformer, two x2 upsamplers
(transposed conv and ConvNeXt block), a k=7 conv, four SnakeBeta / transposed-conv / three
ResidualUnit blocks (x8, x5, x4, x3), SnakeBeta, a k=7 conv to one channel and a clamp to ±1.

What makes frame-by-frame output equal to one whole decode (within fp32 rounding) is the state
each layer keeps between calls (shared reference ``code2wav.md`` §4):

- every causal conv keeps the last ``(k - 1) * dilation`` samples of its input (zeros at the
  start, which is the official left padding);
- every causal transposed conv (kernel 2r, stride r) keeps the r output samples that the next
  input still adds to (its carry), and adds its bias when a sample is final;
- the transformer keeps, per layer, the keys and values of the last ``window - 1`` positions and
  the absolute position of the next frame (RoPE and the window are absolute).

Precision: fp32 by default (equal to the official decode within fp32 rounding: PyTorch's
convolutions), or ``precision="bf16"``. Where the CPU multiplies bf16 in hardware (AMX or AVX-512
BF16, ``vllm_omni.cpu.conv``) every bf16 stage is a few native calls: each conv one call with its
SnakeBeta, history, bias and residual folded in, the last blocks' ResidualUnits in time tiles,
each ConvNeXt block one call, the transformer one call; elsewhere bf16 runs the long convs in
PyTorch's bf16. bf16 is about 37 dB signal over difference from the fp32 decode on random weights
of the published shapes (``vllm-omni-bench speak`` records it). ``precision="int8"``, for CPUs that
multiply int8 but not bf16 (AVX-512 VNNI, ARM's dot product), runs the four DecoderBlocks' convs
with int8 products (``conv.Int8Conv``, ``conv.Int8TransConv``), the stages before them as bf16 where
native, else with fp32 convs and int8 linears: about 25 dB from the fp32 decode on random weights
(``vllm-omni-bench decoder-split`` records it). ``push_streams`` decodes several streams in one pass of those calls,
each with its own state.

``push`` takes any number of frames, so a caller chooses its chunking (one frame for the first
audio, more per call later); the output does not depend on it beyond rounding. The official
``decode`` is one forward up to 300 frames and re-decodes with 25 frames of left context beyond,
so it equals this decoder up to 300 frames and only approximately after.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_omni.cpu import conv as conv_native
from vllm_omni.tts.config import DecoderConfig


def _rope(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions[:, None].float() * inv
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _native():
    """The native library (``vo_snake``), or None where it cannot be built: PyTorch stands in."""
    try:
        from vllm_omni.cpu import native

        return native.load()
    except Exception:  # noqa: BLE001 - no compiler or a failed build
        return None


DECODER_PRECISIONS = ("fp32", "bf16", "int8")


def _bf16_native(lib, c_out: int, c_in: int) -> bool:
    """Whether a bf16 product of these channel counts runs in the native convs (``vllm_omni.cpu.conv``):
    the library built, its loop in hardware and the shape one it takes; PyTorch's bf16 ops where not."""
    return lib is not None and conv_native.available() and conv_native.fits(c_out, c_in)


INT8_REFUSED = ("the int8 decoder needs a CPU that multiplies int8 in SIMD (AVX-512 VNNI, or ARM's dot product), or "
                "its convs would run in plain C: this one has neither; use fp32 or bf16")


def int8_helps() -> bool:
    """Whether the native int8 convolutions run a SIMD loop here (AVX-512 VNNI, ARM's dot product):
    elsewhere their loop is the plain-C reference and the int8 decoder is refused."""
    return conv_native.int8_available()


def bf16_helps() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX): there the long convs run
    about twice as fast in bf16 (``docs/edge/end-to-end.md``); elsewhere bf16 is emulated, slower."""
    from vllm_omni.results.provenance import cpuinfo

    return bool({"avx512_bf16", "amx_bf16"} & cpuinfo()["flags"])


BF16_MIN_ROWS = 4
CONVNEXT_EPS = 1e-6  # the upsampler's LayerNorm
NATIVE_ROWS = 16  # at most this many rows a call: the native GEMV (weight-bound); more: PyTorch's GEMM


class _Linear:
    """``x [M, K] -> x @ W.T + b``: the native GEMV (each weight row read once for all M rows) when M
    is small and the shape suits it, else PyTorch. fp32 either way, where only summation order differs;
    in int8 (``precision="int8"``) the GEMV's weights are int8 (``vllm_omni.cpu.quant``), a quarter of
    the bytes of these weight-bound layers."""

    def __init__(self, w: Tensor, b: Tensor | None, lib=None, precision: str = "fp32"):
        self.w, self.b = w.contiguous(), None if b is None else b.contiguous()
        # in bf16 where native: a 1x1 conv over the rows (every row count, weights read once in bf16)
        self.native = None
        if precision == "bf16" and _bf16_native(lib, *self.w.shape):
            self.native = conv_native.Bf16Conv(self.w[:, :, None], self.b)
        self.w16 = self.w.bfloat16() if precision == "bf16" and self.native is None else None
        self.lib, self.mat = None, None
        n, k = self.w.shape
        if self.native is None and lib is not None and k % 64 == 0 and k >= 64 and n % 32 == 0:
            from vllm_omni.cpu.native import FMT_CODES
            from vllm_omni.cpu.predictor import vo_mat
            from vllm_omni.cpu.quant import quantize

            fmt = "int8" if precision == "int8" else "fp32"
            self.packed, self.fmt = quantize(self.w, fmt), FMT_CODES[fmt]
            self.mat, self.lib = vo_mat(self.packed), lib

    def __call__(self, x: Tensor) -> Tensor:
        if self.native is not None:
            return self.native(x.T, None)[0].T
        m = x.shape[0]
        if self.w16 is not None and (self.lib is None or m > BF16_MIN_ROWS):  # bf16 GEMM: several times the
            # fp32 GEMV's rate on more than a few rows; on fewer its conversions cost more than it saves
            y = F.linear(x.bfloat16(), self.w16).float()
            return y if self.b is None else y.add_(self.b)
        # int8 weights take the GEMV at any row count, so that a row's result never depends on the call's
        int8 = self.lib is not None and self.packed.fmt == "int8"
        if self.lib is None or (m > NATIVE_ROWS and not int8):
            return F.linear(x, self.w, self.b)
        import ctypes

        x = x.contiguous()
        y = torch.empty(m, self.w.shape[0])
        for r in range(0, m, NATIVE_ROWS):
            n = min(NATIVE_ROWS, m - r)
            rc = self.lib.vo_linear(self.fmt, ctypes.byref(self.mat), x[r:].data_ptr(), n, y[r:].data_ptr(),
                                    torch.get_num_threads())
            if rc != 0:
                raise RuntimeError(f"vo_linear failed ({rc}) on [{n}, {self.w.shape[1]}] x {list(self.w.shape)}")
        return y if self.b is None else y + self.b


def _native_transformer(w: dict[str, Tensor], tr: str, dc: DecoderConfig, lib) -> Any:
    """The transformer in one native bf16 call (``vllm_omni.cpu.decoder_transformer``), or None where
    the native bf16 loop is not here or the shapes do not suit it (grouped KV heads)."""
    if dc.heads != dc.kv_heads or not _bf16_native(lib, *w[f"{tr}.input_proj.weight"].shape):
        return None
    from vllm_omni.cpu.decoder_transformer import Bf16DecoderTransformer, LayerWeights

    def layer(p: str) -> LayerWeights:
        a, m = f"{p}.self_attn", f"{p}.mlp"
        return LayerWeights(*(w[f"{a}.{n}_proj.weight"] for n in "qkvo"),
                            *(w[f"{m}.{n}_proj.weight"] for n in ("gate", "up", "down")),
                            w[f"{p}.input_layernorm.weight"], w[f"{p}.post_attention_layernorm.weight"],
                            w[f"{p}.self_attn_layer_scale.scale"], w[f"{p}.mlp_layer_scale.scale"])

    return Bf16DecoderTransformer((w[f"{tr}.input_proj.weight"], w[f"{tr}.input_proj.bias"]),
                                  (w[f"{tr}.output_proj.weight"], w[f"{tr}.output_proj.bias"]), w[f"{tr}.norm.weight"],
                                  [layer(f"{tr}.layers.{i}") for i in range(dc.spec.transformer_layers)],
                                  dc.heads, dc.head_dim, dc.sliding_window, dc.rms_eps)


class _Snake:
    """SnakeBeta: x + 1/(exp(beta) + 1e-9) * sin(exp(alpha) * x)^2, per channel (native in one pass)."""

    def __init__(self, w: dict[str, Tensor], prefix: str, lib=None):
        self.a = torch.exp(w[f"{prefix}.alpha"]).contiguous()
        self.inv_b = (1.0 / (torch.exp(w[f"{prefix}.beta"]) + 1e-9)).contiguous()
        self.lib = lib

    def params(self) -> tuple[Tensor, Tensor]:
        """(exp(alpha), 1 / (exp(beta) + 1e-9)): what the native convs take to apply it first."""
        return self.a, self.inv_b

    def __call__(self, x: Tensor) -> Tensor:
        if self.lib is None:
            return x + self.inv_b[:, None] * torch.sin(x * self.a[:, None]).pow(2)
        x = x.contiguous()
        y = torch.empty_like(x)
        self.lib.vo_snake(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], self.a.data_ptr(),
                          self.inv_b.data_ptr(), torch.get_num_threads())
        return y


class _CausalConv:
    """A causal conv that keeps its input tail: ``(k - 1) * dilation`` samples."""

    STATE = ("hist",)  # what ``StreamingDecoder.save_state`` keeps of it

    def __init__(self, w: dict[str, Tensor], prefix: str, dilation: int = 1, groups: int = 1, lib=None,
                 precision: str = "fp32"):
        self.w, self.b = w[f"{prefix}.conv.weight"].contiguous(), w[f"{prefix}.conv.bias"].contiguous()
        self.dilation, self.groups = dilation, groups
        self.w16 = self.w.bfloat16() if precision == "bf16" and groups == 1 else None  # the long convs in bf16
        self.k = self.w.shape[-1]
        self.tail = (self.k - 1) * dilation
        self.channels = self.w.shape[1] * groups
        self.native = None  # in bf16 or int8 where native: one call, a SnakeBeta before it and a residual folded in
        if self.w16 is not None and _bf16_native(lib, self.w.shape[0], self.w.shape[1]):
            self.native = conv_native.Bf16Conv(self.w, self.b, dilation)
        elif precision == "int8" and groups == 1 and lib is not None and conv_native.fits(*self.w.shape[:2]):
            self.native = conv_native.Int8Conv(self.w, self.b, dilation)
        elif groups == 1 and lib is not None and self.w.shape[0] <= conv_native.NARROW_MAX:
            self.native = conv_native.NarrowConv(self.w, self.b, dilation)  # fp32, in any precision
        self.rows = None  # else, few samples a call: the conv as a GEMV over im2col rows [T, k * C_in], taps outer
        if groups == 1 and lib is not None and self.native is None:
            lin = _Linear(self.w.permute(0, 2, 1).reshape(self.w.shape[0], -1), self.b, lib, precision)
            self.rows = lin if lin.lib is not None else None
        self.reset()

    def reset(self) -> None:
        self.hist = torch.zeros(self.channels, self.tail)

    def __call__(self, x: Tensor, snake: "_Snake | None" = None, residual: Tensor | None = None) -> Tensor:
        """x: [C_in, T] -> [C_out, T]; ``snake`` first where given, ``residual`` added where given."""
        if self.native is not None:
            y, self.hist = self.native(x, self.hist, None if snake is None else snake.params(), residual)
            return y
        y = self._conv(x if snake is None else snake(x))
        return y if residual is None else y + residual

    def _conv(self, x: Tensor) -> Tensor:
        full = torch.cat([self.hist, x], 1) if self.tail else x
        if self.tail:
            self.hist = full[:, -self.tail:].clone()
        t = x.shape[1]
        if self.rows is not None and t <= NATIVE_ROWS:
            d = self.dilation
            cols = torch.stack([full[:, j * d: j * d + t] for j in range(self.k)]).permute(2, 0, 1)
            return self.rows(cols.reshape(t, -1)).T
        if self.w16 is not None:
            y = F.conv1d(full[None].bfloat16(), self.w16, dilation=self.dilation)[0].float()
            return y.add_(self.b[:, None])
        return F.conv1d(full[None], self.w, self.b, dilation=self.dilation, groups=self.groups)[0]


class _CausalTransConv:
    """ConvTranspose1d(k, stride r) with the last k - r samples dropped, streamed with an r-sample carry."""

    STATE = ("carry",)

    def __init__(self, w: dict[str, Tensor], prefix: str, stride: int, lib=None, precision: str = "fp32"):
        self.w, self.b = w[f"{prefix}.conv.weight"].contiguous(), w[f"{prefix}.conv.bias"][:, None].contiguous()
        self.w16 = self.w.bfloat16() if precision == "bf16" else None
        self.stride = stride
        self.k, self.cout = self.w.shape[-1], self.w.shape[1]
        self.over = self.k - stride  # output samples a later input still adds to
        if self.over not in (0, stride):
            raise ValueError(f"{prefix}: kernel {self.k} with stride {stride} is not streamed here")
        # in bf16 or int8 where native: one call, its input's SnakeBeta folded in
        self.native = None
        if self.w16 is not None and _bf16_native(lib, self.k * self.cout, self.w.shape[0]):
            self.native = conv_native.Bf16TransConv(self.w, self.b, stride)
        elif precision == "int8" and lib is not None and conv_native.fits(self.k * self.cout, self.w.shape[0]):
            self.native = conv_native.Int8TransConv(self.w, self.b, stride)
        # else, few inputs a call: one GEMV gives each input's k output samples, [T, (tap, out)]
        taps = self.w.permute(2, 1, 0).reshape(self.k * self.cout, -1)  # [(tap, out), in]
        lin = _Linear(taps, None, lib, precision) if lib is not None and self.native is None else None
        self.rows = lin if lin is not None and lin.lib is not None else None
        self.reset()

    def reset(self) -> None:
        self.carry = torch.zeros(self.w.shape[1], self.over)

    def __call__(self, x: Tensor, snake: "_Snake | None" = None) -> Tensor:
        """x: [C_in, T] -> [C_out, T * stride]; ``snake`` first where given."""
        if self.native is not None:
            y, self.carry = self.native(x, self.carry, None if snake is None else snake.params())
            return y
        if snake is not None:
            x = snake(x)
        t, r = x.shape[1], self.stride
        n = t * r
        if self.rows is not None and t <= NATIVE_ROWS:
            z = self.rows(x.T).view(t, self.k, self.cout)  # input t's taps land at t * r + tap
            y = torch.zeros(self.cout, n + self.over)
            yv = y.view(self.cout, -1, r) if self.over else y.view(self.cout, t, r)
            yv[:, :t] += z[:, :r].permute(2, 0, 1)
            if self.over:
                yv[:, 1:t + 1] += z[:, r:].permute(2, 0, 1)
        elif self.w16 is not None:
            y = F.conv_transpose1d(x[None].bfloat16(), self.w16, None, stride=r)[0].float()
        else:
            y = F.conv_transpose1d(x[None], self.w, None, stride=r)[0]
        if self.over:
            y[:, : self.over] += self.carry
            self.carry = y[:, n:].clone()
        return y[:, :n] + self.b


# Channels up to which a ResidualUnit runs as one native call in time tiles (``Bf16ResidualUnit``):
# on the Xeon of family 6, model 167 at 2 threads, four-frame chunks, that took the last two
# blocks (192 and 96 channels) from 1.46 and 1.92 to 1.04 and 1.17 ms a frame, and the block of
# 384 channels from 0.99 to 1.09: its weights (2 MB in bf16) no longer stay in cache beside the tiles.
FUSED_UNIT_CHANNELS = 192


class _ResidualUnit:
    """``x + conv2(act2(conv1(act1(x))))``: conv1 causal (k=7, dilated), conv2 1x1. One native call in
    bf16 where both convs are native and the channels few (``FUSED_UNIT_CHANNELS``), a native call per
    conv in int8; its state is conv1's."""

    def __init__(self, w: dict[str, Tensor], prefix: str, dilation: int, lib, precision: str):
        self.act1, self.act2 = _Snake(w, f"{prefix}.act1", lib), _Snake(w, f"{prefix}.act2", lib)
        self.conv1 = _CausalConv(w, f"{prefix}.conv1", dilation=dilation, lib=lib, precision=precision)
        self.conv2 = _CausalConv(w, f"{prefix}.conv2", lib=lib, precision=precision)
        both = isinstance(self.conv1.native, conv_native.Bf16Conv) and isinstance(self.conv2.native, conv_native.Bf16Conv)
        self.fused = (conv_native.Bf16ResidualUnit(self.conv1.native, self.conv2.native)
                      if both and self.conv1.channels <= FUSED_UNIT_CHANNELS else None)

    def __call__(self, x: Tensor) -> Tensor:
        if self.fused is not None:
            y, self.conv1.hist = self.fused(x, self.conv1.hist, self.act1.params(), self.act2.params())
            return y
        return self.conv2(self.conv1(x, self.act1), self.act2, residual=x)


class _Attention:
    """One transformer layer's sliding-window self-attention with its KV tail."""

    STATE = ("keys", "values")

    def __init__(self, w: dict[str, Tensor], prefix: str, dc: DecoderConfig, lib=None, precision: str = "fp32"):
        a = f"{prefix}.self_attn"
        self.qkv = _Linear(torch.cat([w[f"{a}.{n}_proj.weight"] for n in ("q", "k", "v")]), None, lib, precision)
        self.o = _Linear(w[f"{a}.o_proj.weight"], None, lib, precision)
        self.heads, self.kv_heads, self.hd, self.window = dc.heads, dc.kv_heads, dc.head_dim, dc.sliding_window
        self.reset()

    def reset(self) -> None:
        self.keys = torch.zeros(self.kv_heads, 0, self.hd)
        self.values = torch.zeros(self.kv_heads, 0, self.hd)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = _rotate(q.reshape(t, self.heads, self.hd).transpose(0, 1), cos, sin)
        k = _rotate(k.reshape(t, self.kv_heads, self.hd).transpose(0, 1), cos, sin)
        v = v.reshape(t, self.kv_heads, self.hd).transpose(0, 1)
        keys, values = torch.cat([self.keys, k], 1), torch.cat([self.values, v], 1)
        past = self.keys.shape[1]
        n = past + t
        qi = torch.arange(t)[:, None] + past  # query i sits at key index past + i
        kj = torch.arange(n)[None, :]
        mask = (kj <= qi) & (kj > qi - self.window)
        rep = self.heads // self.kv_heads
        if rep > 1:
            keys_r, values_r = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
        else:
            keys_r, values_r = keys, values
        out = F.scaled_dot_product_attention(q[None], keys_r[None], values_r[None], attn_mask=mask[None, None])[0]
        keep = self.window - 1
        self.keys, self.values = keys[:, -keep:].clone(), values[:, -keep:].clone()
        return self.o(out.transpose(0, 1).reshape(t, self.heads * self.hd))


@dataclass
class DecoderState:
    """One utterance's place in the decoder: each stateful layer's tensors and the next frame's position."""

    layers: list[tuple[Tensor, ...]]
    position: int


class StreamingDecoder:
    """Codes [n, 16] -> samples [n * 1920], keeping every layer's state between calls (see the module doc)."""

    def __init__(self, weights: dict[str, Tensor], dc: DecoderConfig, precision: str = "fp32"):
        if precision not in DECODER_PRECISIONS:
            raise ValueError(f"decoder precision must be one of {', '.join(DECODER_PRECISIONS)}, got {precision!r}")
        if precision == "int8" and not int8_helps():
            raise ValueError(INT8_REFUSED)
        self.precision = precision
        # int8 reaches the four DecoderBlocks (their transposed convs and ResidualUnits: 95 % of the work).
        # The stages before them run as bf16 where the CPU multiplies bf16 natively; elsewhere their convs
        # stay fp32, and the transformer's and ConvNeXt blocks' linears (weight-bound) are int8 GEMVs
        units = linears = precision
        if precision == "int8":
            precision = "bf16" if conv_native.available() else "fp32"
            linears = "bf16" if precision == "bf16" else "int8"
        self.dc, s = dc, dc.spec
        self.samples_per_frame = s.samples_per_frame
        lib = _native()
        w = {k: v.float() for k, v in weights.items()}
        q = "decoder.quantizer"

        def book(part: str, i: int) -> Tensor:
            cb = f"{q}.{part}.vq.layers.{i}._codebook"
            return (w[f"{cb}.embedding_sum"] / w[f"{cb}.cluster_usage"].clamp(min=1e-5)[:, None]).contiguous()

        self.first_book = book("rvq_first", 0)
        self.rest_books = torch.stack([book("rvq_rest", i) for i in range(s.quantizers - 1)])  # [15, V, D/2]
        self.first_proj = w[f"{q}.rvq_first.output_proj.weight"][:, :, 0].contiguous()
        self.rest_proj = w[f"{q}.rvq_rest.output_proj.weight"][:, :, 0].contiguous()
        self.pre_conv = _CausalConv(w, "decoder.pre_conv", lib=lib, precision=precision)
        tr = "decoder.pre_transformer"
        self.final_norm = w[f"{tr}.norm.weight"]
        self.native_transformer = _native_transformer(w, tr, dc, lib) if precision == "bf16" else None
        # the layers in PyTorch: the transformer where it is not native, its state (keys, values) either way
        tl, tp = (None, "fp32") if self.native_transformer is not None else (lib, linears)
        self.in_proj = _Linear(w[f"{tr}.input_proj.weight"], w[f"{tr}.input_proj.bias"], tl, tp)
        self.out_proj = _Linear(w[f"{tr}.output_proj.weight"], w[f"{tr}.output_proj.bias"], tl, tp)
        self.layers = []
        for i in range(s.transformer_layers):
            p = f"{tr}.layers.{i}"
            self.layers.append({
                "attn": _Attention(w, p, dc, tl, tp), "in_norm": w[f"{p}.input_layernorm.weight"],
                "post_norm": w[f"{p}.post_attention_layernorm.weight"],
                "attn_scale": w[f"{p}.self_attn_layer_scale.scale"], "mlp_scale": w[f"{p}.mlp_layer_scale.scale"],
                "gate_up": _Linear(torch.cat([w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"]]), None,
                                   tl, tp),
                "down": _Linear(w[f"{p}.mlp.down_proj.weight"], None, tl, tp),
            })
        self.upsample = []
        for i, factor in enumerate(s.upsampling_ratios):
            nx = f"decoder.upsample.{i}.1"
            c = s.latent_dim
            norm = (w[f"{nx}.norm.weight"], w[f"{nx}.norm.bias"])
            fc1 = (w[f"{nx}.pwconv1.weight"], w[f"{nx}.pwconv1.bias"])
            fc2 = (w[f"{nx}.pwconv2.weight"] * w[f"{nx}.gamma"][:, None], w[f"{nx}.pwconv2.bias"] * w[f"{nx}.gamma"])
            # bf16 where native: the whole block in one call (the depthwise conv keeps the state)
            native = None
            if precision == "bf16" and _bf16_native(lib, *fc1[0].shape) and _bf16_native(lib, *fc2[0].shape):
                native = conv_native.Bf16ConvNeXt(w[f"{nx}.dwconv.conv.weight"], w[f"{nx}.dwconv.conv.bias"], norm,
                                                  CONVNEXT_EPS, fc1, fc2)
            fl, fp = (None, "fp32") if native is not None else (lib, linears)
            self.upsample.append({
                "tconv": _CausalTransConv(w, f"decoder.upsample.{i}.0", factor, lib, precision),
                "dw": _CausalConv(w, f"{nx}.dwconv", groups=c), "norm": norm, "native": native,
                "fc1": _Linear(*fc1, fl, fp), "fc2": _Linear(*fc2, fl, fp),
            })
        self.conv_in = _CausalConv(w, "decoder.decoder.0", lib=lib, precision=precision)
        self.blocks = []
        for b, rate in enumerate(s.upsample_rates):
            p = f"decoder.decoder.{b + 1}.block"
            res = [_ResidualUnit(w, f"{p}.{u + 2}", d, lib, units) for u, d in enumerate((1, 3, 9))]
            self.blocks.append((_Snake(w, f"{p}.0", lib), _CausalTransConv(w, f"{p}.1", rate, lib, units), res))
        n = len(s.upsample_rates) + 1
        self.snake_out = _Snake(w, f"decoder.decoder.{n}", lib)
        self.conv_out = _CausalConv(w, f"decoder.decoder.{n + 1}", lib=lib)  # fp32 (NarrowConv) in any precision
        self.position = 0

    def _convs(self) -> list[Any]:
        out: list[Any] = [self.pre_conv, self.conv_in, self.conv_out]
        for up in self.upsample:
            out += [up["tconv"], up["dw"]]
        for _, tconv, units in self.blocks:
            out.append(tconv)
            out += [u.conv1 for u in units] + [u.conv2 for u in units]
        return out

    def _stateful(self) -> list[Any]:
        return self._convs() + [layer["attn"] for layer in self.layers]

    def reset(self) -> None:
        """Forget every layer's state: the next push starts a new utterance."""
        for c in self._stateful():
            c.reset()
        self.position = 0

    def save_state(self) -> "DecoderState":
        """Every layer's state after the last push, to resume one utterance after pushing others.

        ``push`` replaces state tensors instead of writing into them, so a saved state is not
        changed by later pushes and nothing is copied."""
        return DecoderState([tuple(getattr(c, name) for name in c.STATE) for c in self._stateful()], self.position)

    def load_state(self, state: "DecoderState") -> None:
        """Resume the utterance ``state`` was saved from (``save_state``, or ``fresh_state``)."""
        parts = self._stateful()
        if len(state.layers) != len(parts):
            raise ValueError(f"a decoder state of {len(state.layers)} layers, this decoder has {len(parts)}")
        for c, values in zip(parts, state.layers):
            for name, value in zip(c.STATE, values):
                setattr(c, name, value)
        self.position = state.position

    def fresh_state(self) -> "DecoderState":
        """The state of a new utterance (what ``reset`` leaves), without touching the current one."""
        current = self.save_state()
        self.reset()
        fresh = self.save_state()
        self.load_state(current)
        return fresh

    @torch.inference_mode()
    def push(self, codes: Tensor, times: dict[str, float] | None = None) -> Tensor:
        """The samples [n * 1920] (fp32 in -1..1) of the next ``n`` frames' codes [n, 16].

        ``times``, when given, gets each stage's seconds added under its name (``stages``)."""
        codes = self._check_codes(codes)
        if codes.shape[0] == 0:
            return torch.empty(0)
        x: Tensor = codes
        for name, stage in self._stages():
            t0 = time.perf_counter() if times is not None else 0.0
            x = stage(x)
            if times is not None:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t0
        self.position += codes.shape[0]
        return x

    def _stage_names(self) -> list[str]:
        rates = self.dc.spec.upsample_rates
        return ["codebooks and pre-conv", "transformer", "upsample and input conv",
                *[f"block {b + 1} (x{r})" for b, r in enumerate(rates)], "output conv"]

    def stages(self) -> list[tuple[str, int]]:
        """Each stage's name and multiply-adds per frame (the weights' products; attention's own
        products, a few per cent of the transformer's, left out), in the order ``push`` runs them."""
        s = self.dc.spec
        macs = [self.first_proj.numel() + self.rest_proj.numel() + self.pre_conv.w.numel(),
                sum(lin.w.numel() for lin in self._linears())]
        rate = 1  # samples per frame entering the stage
        up = 0
        for u, factor in zip(self.upsample, s.upsampling_ratios):
            up += u["tconv"].w.numel() * rate
            rate *= factor
            up += (u["dw"].w.numel() + u["fc1"].w.numel() + u["fc2"].w.numel()) * rate
        macs.append(up + self.conv_in.w.numel() * rate)
        for (_, tconv, units), stride in zip(self.blocks, s.upsample_rates):
            n = tconv.w.numel() * rate
            rate *= stride
            macs.append(n + sum(u.conv1.w.numel() + u.conv2.w.numel() for u in units) * rate)
        macs.append(self.conv_out.w.numel() * rate)
        return list(zip(self._stage_names(), macs))

    def _linears(self) -> list["_Linear"]:
        out = [self.in_proj, self.out_proj]
        for layer in self.layers:
            out += [layer["attn"].qkv, layer["attn"].o, layer["gate_up"], layer["down"]]
        return out

    def _stages(self) -> list[tuple[str, Any]]:
        blocks = [lambda x, b=b: self._block(b, x) for b in range(len(self.blocks))]
        return list(zip(self._stage_names(), [self._latent, lambda x: self._transformer(x.T).T, self._upsample,
                                              *blocks, self._output]))

    def _latent(self, codes: Tensor) -> Tensor:
        """Codes [T, 16] -> the pre-conv's output [latent, T]."""
        return self.pre_conv(self._embed(codes))

    def _embed(self, codes: Tensor) -> Tensor:
        """Codes [T, 16] -> the split-RVQ embedding [codebook dim, T] (no state)."""
        first = self.first_book[codes[:, 0]]
        rest = self.rest_books[torch.arange(self.rest_books.shape[0])[None, :], codes[:, 1:]].sum(1)
        return (first @ self.first_proj.T + rest @ self.rest_proj.T).T

    def _check_codes(self, codes: Tensor) -> Tensor:
        codes = torch.as_tensor(codes, dtype=torch.int64)
        if codes.ndim != 2 or codes.shape[1] != self.dc.spec.quantizers:
            raise ValueError(f"codes must be [frames, {self.dc.spec.quantizers}], got {list(codes.shape)}")
        codes = codes.clamp(min=0)
        if codes.numel() and int(codes.max()) >= self.dc.spec.codebook_size:
            raise ValueError(f"codes must be below {self.dc.spec.codebook_size}, got {int(codes.max())}")
        return codes

    @property
    def streams_together(self) -> bool:
        """Whether ``push_streams`` decodes several streams in one pass of native calls (every stage
        native: the bf16 or int8 decoder where the CPU multiplies bf16), rather than one stream after another."""
        return self.native_transformer is not None and all(
            c.native is not None for c in self._convs() if getattr(c, "groups", 1) == 1) and all(
            up["native"] is not None for up in self.upsample)

    @torch.inference_mode()
    def push_streams(self, codes: list[Tensor], states: list[DecoderState]) -> tuple[list[Tensor], list[DecoderState]]:
        """Several streams' next frames at once: the samples of each (as ``push`` gives them) and each
        stream's state after them. ``states[i]`` is stream i's place (``save_state``/``fresh_state``);
        it is not changed, and this decoder's own state is left as it was. Where every stage is native
        (``streams_together``) each stage is one call for all streams, its weights read once; each
        stream's samples are the same bits as alone."""
        if len(codes) != len(states):
            raise ValueError(f"{len(codes)} streams of codes and {len(states)} states")
        codes = [self._check_codes(c) for c in codes]
        if not self.streams_together:
            own, outs, news = self.save_state(), [], []
            for c, st in zip(codes, states):
                self.load_state(st)
                outs.append(self.push(c))
                news.append(self.save_state())
            self.load_state(own)
            return outs, news
        return self._push_together(codes, states)

    def _push_together(self, codes: list[Tensor], states: list[DecoderState]) -> tuple[list[Tensor], list[DecoderState]]:
        index = {id(c): i for i, c in enumerate(self._stateful())}
        for st in states:
            if len(st.layers) != len(index):
                raise ValueError(f"a decoder state of {len(st.layers)} layers, this decoder has {len(index)}")
        layers = [list(st.layers) for st in states]
        live = [i for i, c in enumerate(codes) if c.shape[0]]

        def state(obj: Any, k: int = 0) -> list[Tensor]:
            return [states[i].layers[index[id(obj)]][k] for i in live]

        def keep(obj: Any, values: list[tuple[Tensor, ...]]) -> None:
            for i, v in zip(live, values):
                layers[i][index[id(obj)]] = v

        def conv(c: _CausalConv, xs: list[Tensor], snake: _Snake | None = None, residuals=None) -> list[Tensor]:
            ys, hists = c.native.many(xs, state(c), None if snake is None else snake.params(), residuals)
            keep(c, [(h,) for h in hists])
            return ys

        def tconv(t: _CausalTransConv, xs: list[Tensor], snake: _Snake | None = None) -> list[Tensor]:
            ys, carries = t.native.many(xs, state(t), None if snake is None else snake.params())
            keep(t, [(c,) for c in carries])
            return ys

        dc = self.dc
        xs = conv(self.pre_conv, [self._embed(codes[i]) for i in live])
        attn = [layer["attn"] for layer in self.layers]
        ropes = [_rope(torch.arange(states[i].position, states[i].position + codes[i].shape[0]), dc.head_dim,
                       dc.rope_theta) for i in live]
        pasts = [[(k, v) for k, v in zip(ks, vs)] for ks, vs in zip(zip(*(state(a, 0) for a in attn)),
                                                                   zip(*(state(a, 1) for a in attn)))]
        xs, kvs = self.native_transformer.many(xs, ropes, pasts)
        for j, a in enumerate(attn):
            keep(a, [kv[j] for kv in kvs])
        for up in self.upsample:
            xs = tconv(up["tconv"], xs)
            xs, hists = up["native"].many(xs, state(up["dw"]))
            keep(up["dw"], [(h,) for h in hists])
        xs = conv(self.conv_in, xs)
        for snake, t, units in self.blocks:
            xs = tconv(t, xs, snake)
            for u in units:
                if u.fused is not None:
                    xs, hists = u.fused.many(xs, state(u.conv1), u.act1.params(), u.act2.params())
                    keep(u.conv1, [(h,) for h in hists])
                else:
                    xs = conv(u.conv2, conv(u.conv1, xs, u.act1), u.act2, residuals=xs)
        outs = [torch.empty(0) for _ in codes]
        ys = conv(self.conv_out, xs, self.snake_out)
        for i, y in zip(live, ys):
            outs[i] = y[0].clamp(-1.0, 1.0)
        news = [DecoderState([tuple(v) for v in layers[i]], states[i].position + codes[i].shape[0])
                for i in range(len(codes))]
        return outs, news

    def _upsample(self, x: Tensor) -> Tensor:
        for up in self.upsample:
            x = up["tconv"](x)
            if up["native"] is not None:
                x, up["dw"].hist = up["native"](x, up["dw"].hist)
                continue
            y = up["dw"](x).T
            y = F.layer_norm(y, (y.shape[-1],), up["norm"][0], up["norm"][1], eps=CONVNEXT_EPS)
            y = up["fc2"](F.gelu(up["fc1"](y)))
            x = x + y.T
        return self.conv_in(x)

    def _block(self, b: int, x: Tensor) -> Tensor:
        snake, tconv, units = self.blocks[b]
        x = tconv(x, snake)
        for unit in units:
            x = unit(x)
        return x

    def _output(self, x: Tensor) -> Tensor:
        return self.conv_out(x, self.snake_out)[0].clamp(-1.0, 1.0)

    def _transformer(self, x: Tensor) -> Tensor:
        dc = self.dc
        t = x.shape[0]
        cos, sin = _rope(torch.arange(self.position, self.position + t), dc.head_dim, dc.rope_theta)
        if self.native_transformer is not None:
            attn = [layer["attn"] for layer in self.layers]
            y, kv = self.native_transformer(x.T, cos, sin, [(a.keys, a.values) for a in attn])
            for a, (keys, values) in zip(attn, kv):
                a.keys, a.values = keys, values
            return y.T
        h = self.in_proj(x)
        for layer in self.layers:
            a = layer["attn"](_rms(h, layer["in_norm"], dc.rms_eps), cos, sin)
            h = h + layer["attn_scale"] * a
            m = _rms(h, layer["post_norm"], dc.rms_eps)
            gate, up = layer["gate_up"](m).chunk(2, -1)
            h = h + layer["mlp_scale"] * layer["down"](F.silu(gate) * up)
        return self.out_proj(_rms(h, self.final_norm, dc.rms_eps))

    def conv_reach_frames(self) -> float:
        """How many frames back the layers after the transformer see: each causal conv's tail and each
        transposed conv's carry, over the samples a frame has at that layer. Their state after a push
        depends on no earlier frame than this (``prime``)."""
        s = self.dc.spec
        rate, reach = 1, 0.0
        for up, factor in zip(self.upsample, s.upsampling_ratios):
            reach += up["tconv"].over / (rate * factor)
            rate *= factor
            reach += up["dw"].tail / rate
        reach += self.conv_in.tail / rate
        for (_, tconv, units), stride in zip(self.blocks, s.upsample_rates):
            rate *= stride
            reach += tconv.over / rate + sum(u.conv1.tail + u.conv2.tail for u in units) / rate
        return reach + self.conv_out.tail / rate

    @torch.inference_mode()
    def prime(self, codes: Tensor, chunk: int = 16) -> None:
        """Leave the state that pushing ``codes`` would leave, without making their audio (a cloned voice's
        reference codes before its new frames). The codebooks, pre-conv and transformer take every frame,
        ``chunk`` at a time: the transformer's window reaches far back. The layers after it take only the
        last frames beyond their reach (``conv_reach_frames``, with as many again to spare): their state
        depends on nothing earlier, and those are most of the work."""
        codes = torch.as_tensor(codes, dtype=torch.int64).clamp(min=0)
        keep = 2 * math.ceil(self.conv_reach_frames()) + 1
        n = codes.shape[0]
        if n <= keep:
            for a in range(0, n, chunk):
                self.push(codes[a:a + chunk])
            return
        hidden = []
        for a in range(0, n, chunk):
            part = codes[a:a + chunk]
            hidden.append(self._transformer(self._latent(part).T).T)
            self.position += part.shape[0]
        x = torch.cat(hidden, 1)[:, -keep:]
        for _, stage in self._stages()[2:]:
            x = stage(x)

    def decode(self, codes: Tensor) -> Tensor:
        """A whole utterance in one call, from a fresh state."""
        self.reset()
        return self.push(codes)
