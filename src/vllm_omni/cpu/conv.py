"""The decoder's convolutions in one native call each (``csrc/vo_decoder.cpp``).

``Bf16Conv(weight, bias, dilation)`` packs a conv's weights [C_out, C_in, k] once into the tile
layout of the native loops (AMX tiles where the CPU has them, else AVX-512 BF16); each call
takes the conv's new input [C_in, T] and its causal history [C_in, (k - 1) * dilation] and gives
the output [C_out, T] and the history for the next call. The SnakeBeta in front of a conv and a
ResidualUnit's residual are folded into the same call, so a conv is one fork-join over the
threads, with no im2col and no layout copies.

Both operands are rounded to bf16 (as ``tensor.bfloat16()``), products summed in fp32: the same
arithmetic as PyTorch's bf16 convolution, in another order. ``NarrowConv`` is the decoder's last
conv (96 channels to one) in fp32, the same call shape: PyTorch runs a one-channel conv poorly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vllm_omni.cpu import native

PATHS = {0: "plain C", 1: "AVX-512 BF16", 2: "AMX"}


def path(variant: str = "native") -> str:
    """The loop the native bf16 convolutions run in the ``variant`` build (``PATHS``)."""
    return PATHS[native.load(variant).vo_conv_bf16_path()]


def available(variant: str = "native") -> bool:
    """Whether the ``variant`` build multiplies bf16 in hardware (AMX or AVX-512 BF16): elsewhere its
    loop is the plain-C reference, far slower than PyTorch's, so the decoder keeps PyTorch's convs."""
    try:
        return native.load(variant).vo_conv_bf16_path() > 0
    except native.NativeBuildError:
        return False


def fits(c_out: int, c_in: int) -> bool:
    """Whether the native loops take these channel counts (multiples of 32: two tiles of 16 outputs,
    32 inputs a tile)."""
    return c_out % 32 == 0 and c_in % 32 == 0


class _NativeConv:
    """A causal conv (no groups) through one native call: its shape, checks and call (see the module doc)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int, threads: int | None, variant: str):
        if weight.ndim != 3:
            raise ValueError(f"a conv weight is [C_out, C_in, k], got {list(weight.shape)}")
        self.c_out, self.c_in, self.k = weight.shape
        self.dilation, self.tail = dilation, (self.k - 1) * dilation
        self.threads = threads
        self.lib = native.load(variant)
        self.bias = None if bias is None else bias.float().contiguous()

    def __call__(self, x: Tensor, hist: Tensor | None, snake: tuple[Tensor, Tensor] | None = None,
                 residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(y [C_out, T], the next history) from x [C_in, T] and this conv's history (None: zeros);
        ``snake``: SnakeBeta's (exp(alpha), 1 / (exp(beta) + 1e-9)) per input channel, applied to x
        first; ``residual`` [C_out, T]: added to y. New tensors: the arguments are not written."""
        x = x.float().contiguous()
        t = x.shape[1]
        if x.shape[0] != self.c_in:
            raise ValueError(f"this conv takes {self.c_in} input channels, got {x.shape[0]}")
        if hist is not None and tuple(hist.shape) != (self.c_in, self.tail):
            raise ValueError(f"this conv's history is [{self.c_in}, {self.tail}], got {list(hist.shape)}")
        if residual is not None:
            residual = residual.float().contiguous()
            if tuple(residual.shape) != (self.c_out, t):
                raise ValueError(f"the residual must be [{self.c_out}, {t}], got {list(residual.shape)}")
        y = torch.empty(self.c_out, t)
        new_hist = torch.empty(self.c_in, self.tail)
        hist = None if hist is None or self.tail == 0 else hist.float().contiguous()
        a, inv_b = (None, None) if snake is None else (s.contiguous() for s in snake)
        threads = self.threads or torch.get_num_threads()
        rc = self._run(hist, x, t, a, inv_b, residual, y, new_hist, threads)
        if rc != 0:
            raise RuntimeError(f"{type(self).__name__} failed ({rc}) on a [{self.c_out}, {self.c_in}, {self.k}] conv, "
                               f"{t} samples" + (": the kernel refused AMX's tile state" if rc == -2 else ""))
        return y, new_hist

    def _run(self, hist, x, t, a, inv_b, residual, y, new_hist, threads) -> int:
        raise NotImplementedError


class Bf16Conv(_NativeConv):
    """A causal conv in bf16 with fp32 sums, its weights packed once for the tile loops."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, threads: int | None = None,
                 variant: str = "native"):
        super().__init__(weight, bias, dilation, threads, variant)
        if not fits(self.c_out, self.c_in):
            raise ValueError(f"the native bf16 conv takes channel counts in multiples of 32, got "
                             f"{self.c_out} out, {self.c_in} in")
        self.packed = torch.empty(weight.numel(), dtype=torch.int16)
        rc = self.lib.vo_conv_pack_bf16(weight.float().contiguous().data_ptr(), self.c_out, self.c_in, self.k,
                                        self.packed.data_ptr())
        if rc != 0:
            raise RuntimeError(f"vo_conv_pack_bf16 failed ({rc}) on a {list(weight.shape)} conv")

    def _run(self, hist, x, t, a, inv_b, residual, y, new_hist, threads) -> int:
        return self.lib.vo_conv_bf16(self.packed.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                     self.dilation, _ptr(hist), x.data_ptr(), t, _ptr(a), _ptr(inv_b), _ptr(residual),
                                     y.data_ptr(), new_hist.data_ptr(), threads)


class Bf16ResidualUnit:
    """A ResidualUnit, ``x + conv2(snake2(conv1(snake1(x))))``, from its two packed convs (conv1 causal,
    conv2 1x1, both C -> C) in one native call that takes time in cache-sized tiles: for the blocks of
    few channels and many samples, where separate calls spend their time moving [C, T] tensors.
    The same arithmetic as the two ``Bf16Conv`` calls; its state is conv1's history."""

    def __init__(self, conv1: Bf16Conv, conv2: Bf16Conv):
        c = conv1.c_out
        if (conv1.c_in, conv2.c_out, conv2.c_in, conv2.k) != (c, c, c, 1):
            raise ValueError(f"a ResidualUnit is a C -> C conv then a 1x1 C -> C conv, got "
                             f"[{conv1.c_out}, {conv1.c_in}, {conv1.k}] and [{conv2.c_out}, {conv2.c_in}, {conv2.k}]")
        self.conv1, self.conv2, self.channels = conv1, conv2, c

    def __call__(self, x: Tensor, hist: Tensor | None, snake1: tuple[Tensor, Tensor], snake2: tuple[Tensor, Tensor]
                 ) -> tuple[Tensor, Tensor]:
        """(y [C, T], conv1's next history) from x [C, T] and conv1's history (None: zeros). New tensors."""
        c1, c2 = self.conv1, self.conv2
        x = x.float().contiguous()
        if x.shape[0] != self.channels:
            raise ValueError(f"this ResidualUnit takes {self.channels} channels, got {x.shape[0]}")
        if hist is not None and tuple(hist.shape) != (self.channels, c1.tail):
            raise ValueError(f"its history is [{self.channels}, {c1.tail}], got {list(hist.shape)}")
        hist = None if hist is None or c1.tail == 0 else hist.float().contiguous()
        (a1, ib1), (a2, ib2) = ((a.contiguous(), b.contiguous()) for a, b in (snake1, snake2))
        y, new_hist = torch.empty_like(x), torch.empty(self.channels, c1.tail)
        rc = c1.lib.vo_res_unit_bf16(c1.packed.data_ptr(), _ptr(c1.bias), c2.packed.data_ptr(), _ptr(c2.bias),
                                     self.channels, c1.k, c1.dilation, _ptr(hist), x.data_ptr(), x.shape[1],
                                     a1.data_ptr(), ib1.data_ptr(), a2.data_ptr(), ib2.data_ptr(), y.data_ptr(),
                                     new_hist.data_ptr(), c1.threads or torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"vo_res_unit_bf16 failed ({rc}) on {self.channels} channels, {x.shape[1]} samples"
                               + (": the kernel refused AMX's tile state" if rc == -2 else ""))
        return y, new_hist


class Bf16ConvNeXt:
    """The upsampler's ConvNeXt block, ``x + fc2(gelu(fc1(layernorm(dwconv(x)))))``, in one native call:
    the depthwise causal conv and the LayerNorm in fp32, fc1 and fc2 in bf16 (``Bf16Conv`` as 1x1
    convs, the block's gamma folded into fc2 by the caller), the exact GELU between them. Its state
    is the depthwise conv's history [C, k - 1]."""

    def __init__(self, dw_weight: Tensor, dw_bias: Tensor, norm: tuple[Tensor, Tensor], eps: float,
                 fc1: tuple[Tensor, Tensor], fc2: tuple[Tensor, Tensor], threads: int | None = None,
                 variant: str = "native"):
        self.channels, self.k = dw_weight.shape[0], dw_weight.shape[-1]
        self.dw_w, self.dw_b = dw_weight.float().reshape(self.channels, self.k).contiguous(), dw_bias.float().contiguous()
        self.norm = tuple(t.float().contiguous() for t in norm)
        self.eps = eps
        self.fc1 = Bf16Conv(fc1[0][:, :, None], fc1[1], threads=threads, variant=variant)
        self.fc2 = Bf16Conv(fc2[0][:, :, None], fc2[1], threads=threads, variant=variant)
        if (self.fc1.c_in, self.fc2.c_out, self.fc2.c_in) != (self.channels, self.channels, self.fc1.c_out):
            raise ValueError(f"a ConvNeXt block is C -> I -> C around a depthwise conv of C channels, got {self.channels}"
                             f" channels, fc1 {self.fc1.c_in} -> {self.fc1.c_out}, fc2 {self.fc2.c_in} -> {self.fc2.c_out}")
        self.threads, self.lib = threads, self.fc1.lib

    def __call__(self, x: Tensor, hist: Tensor | None) -> tuple[Tensor, Tensor]:
        """(y [C, T], the depthwise conv's next history) from x [C, T] and its history (None: zeros)."""
        x = x.float().contiguous()
        if x.shape[0] != self.channels:
            raise ValueError(f"this ConvNeXt block takes {self.channels} channels, got {x.shape[0]}")
        if hist is not None and tuple(hist.shape) != (self.channels, self.k - 1):
            raise ValueError(f"its history is [{self.channels}, {self.k - 1}], got {list(hist.shape)}")
        hist = None if hist is None else hist.float().contiguous()
        y, new_hist = torch.empty_like(x), torch.empty(self.channels, self.k - 1)
        rc = self.lib.vo_convnext_bf16(
            self.dw_w.data_ptr(), self.dw_b.data_ptr(), self.channels, self.k, _ptr(hist), x.data_ptr(), x.shape[1],
            self.norm[0].data_ptr(), self.norm[1].data_ptr(), self.eps, self.fc1.packed.data_ptr(),
            _ptr(self.fc1.bias), self.fc1.c_out, self.fc2.packed.data_ptr(), _ptr(self.fc2.bias), y.data_ptr(),
            new_hist.data_ptr(), self.threads or torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"vo_convnext_bf16 failed ({rc}) on {self.channels} channels, {x.shape[1]} samples"
                               + (": the kernel refused AMX's tile state" if rc == -2 else ""))
        return y, new_hist


class Bf16TransConv:
    """A causal transposed conv (ConvTranspose1d with kernel k = stride or 2 * stride, the last
    k - stride outputs dropped) in bf16 with fp32 sums: the product as a 1x1 conv to (tap, channel)
    rows, and the overlap of each input's taps with the next one's in the same native call."""

    def __init__(self, weight: Tensor, bias: Tensor | None, stride: int, threads: int | None = None,
                 variant: str = "native"):
        if weight.ndim != 3:
            raise ValueError(f"a transposed conv weight is [C_in, C_out, k], got {list(weight.shape)}")
        self.c_in, self.c_out, self.k = weight.shape
        if self.k not in (stride, 2 * stride):
            raise ValueError(f"a kernel of {self.k} with stride {stride} is not streamed here (k = stride or 2 * stride)")
        taps = weight.float().permute(2, 1, 0).reshape(self.k * self.c_out, self.c_in, 1)  # [(tap, out), in, 1]
        self.product = Bf16Conv(taps, None, 1, threads, variant)
        self.stride, self.over, self.threads, self.lib = stride, self.k - stride, threads, self.product.lib
        self.bias = None if bias is None else bias.float().reshape(-1).contiguous()

    def __call__(self, x: Tensor, carry: Tensor | None, snake: tuple[Tensor, Tensor] | None = None
                 ) -> tuple[Tensor, Tensor]:
        """(y [C_out, T * stride], the next carry [C_out, k - stride]) from x [C_in, T] and the
        previous call's carry (None: zeros); ``snake`` as ``Bf16Conv``'s."""
        x = x.float().contiguous()
        if x.shape[0] != self.c_in:
            raise ValueError(f"this transposed conv takes {self.c_in} input channels, got {x.shape[0]}")
        if carry is not None and tuple(carry.shape) != (self.c_out, self.over):
            raise ValueError(f"this transposed conv's carry is [{self.c_out}, {self.over}], got {list(carry.shape)}")
        t = x.shape[1]
        y = torch.empty(self.c_out, t * self.stride)
        new_carry = torch.zeros(self.c_out, self.over)
        carry = None if carry is None or self.over == 0 else carry.float().contiguous()
        a, inv_b = (None, None) if snake is None else (s.contiguous() for s in snake)
        rc = self.lib.vo_tconv_bf16(self.product.packed.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                    self.stride, x.data_ptr(), t, _ptr(a), _ptr(inv_b), _ptr(carry), y.data_ptr(),
                                    new_carry.data_ptr(), self.threads or torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"vo_tconv_bf16 failed ({rc}) on a [{self.c_in}, {self.c_out}, {self.k}] transposed "
                               f"conv, {t} samples" + (": the kernel refused AMX's tile state" if rc == -2 else ""))
        return y, new_carry


NARROW_MAX = 8


class NarrowConv(_NativeConv):
    """A causal conv to a few channels (at most ``NARROW_MAX``: the decoder's last, 96 -> 1) in fp32,
    time split across threads. No residual."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, threads: int | None = None,
                 variant: str = "native"):
        super().__init__(weight, bias, dilation, threads, variant)
        if self.c_out > NARROW_MAX:
            raise ValueError(f"the narrow conv makes at most {NARROW_MAX} channels, got {self.c_out}")
        self.w = weight.float().contiguous()

    def _run(self, hist, x, t, a, inv_b, residual, y, new_hist, threads) -> int:
        if residual is not None:
            raise ValueError("the narrow conv adds no residual")
        return self.lib.vo_conv_f32_narrow(self.w.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                           self.dilation, _ptr(hist), x.data_ptr(), t, _ptr(a), _ptr(inv_b),
                                           y.data_ptr(), new_hist.data_ptr(), threads)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
