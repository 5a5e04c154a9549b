"""The decoder's convolutions in one native call each (``csrc/vo_decoder.cpp``).

``Bf16Conv(weight, bias, dilation)`` packs a conv's weights [C_out, C_in, k] once into the tile
layout of the native loops (AMX tiles where the CPU has them, else AVX-512 BF16, or on ARM the
BF16 extension's BFDOT); each call
takes the conv's new input [C_in, T] and its causal history [C_in, (k - 1) * dilation] and gives
the output [C_out, T] and the history for the next call. The SnakeBeta in front of a conv and a
ResidualUnit's residual are folded into the same call, so a conv is one fork-join over the
threads, with no im2col and no layout copies.

Every call also takes several streams at once (``many``): each stream brings its own input and
state, and the weights are read once for all of them, as the talker's are in a batched step.
A stream's samples get the same arithmetic alone or beside others.

Both operands are rounded to bf16 (as ``tensor.bfloat16()``), products summed in fp32: the same
arithmetic as PyTorch's bf16 convolution, in another order. ``NarrowConv`` is the decoder's last
conv (96 channels to one) in fp32: PyTorch runs a one-channel conv poorly.

``Int8Conv`` is the same conv with int8 products: the weights rounded per output channel, the
input per sample (after its SnakeBeta), each tap's products summed exactly in int32 and then
scaled (AVX-512 VNNI, or ARM's dot product; plain C elsewhere). The input's scale is a sample's
own, so chunking a stream changes nothing, and every loop gives the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from vllm_omni.cpu import native

PATHS = {0: "plain C", 1: "AVX-512 BF16", 2: "AMX", 3: "NEON BF16"}
INT8_PATHS = {0: "plain C", 1: "AVX-512 VNNI", 4: "NEON dot product", 5: "NEON i8mm"}
Snake = tuple[Tensor, Tensor]  # SnakeBeta's (exp(alpha), 1 / (exp(beta) + 1e-9)) per channel


def path(variant: str = "native") -> str:
    """The loop the native bf16 convolutions run in the ``variant`` build (``PATHS``)."""
    return PATHS[native.load(variant).vo_conv_bf16_path()]


def available(variant: str = "native") -> bool:
    """Whether the ``variant`` build multiplies bf16 in hardware (AMX, AVX-512 BF16 or ARM's BFDOT): elsewhere its
    loop is the plain-C reference, far slower than PyTorch's, so the decoder keeps PyTorch's convs."""
    try:
        return native.load(variant).vo_conv_bf16_path() > 0
    except native.NativeBuildError:
        return False


def int8_path(variant: str = "native") -> str:
    """The loop the native int8 convolutions run in the ``variant`` build (``INT8_PATHS``)."""
    return INT8_PATHS[native.load(variant).vo_conv_i8_path()]


def int8_available(variant: str = "native") -> bool:
    """Whether the ``variant`` build multiplies int8 in a SIMD loop (AVX-512 VNNI, ARM's dot product)."""
    try:
        return native.load(variant).vo_conv_i8_path() > 0
    except native.NativeBuildError:
        return False


def fits(c_out: int, c_in: int) -> bool:
    """Whether the native loops take these channel counts (multiples of 32: two tiles of 16 outputs,
    32 inputs a tile)."""
    return c_out % 32 == 0 and c_in % 32 == 0


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _snake(snake: Snake | None) -> tuple[Tensor | None, Tensor | None]:
    return (None, None) if snake is None else (snake[0].contiguous(), snake[1].contiguous())


def _inputs(xs: Sequence[Tensor], channels: int, what: str) -> list[Tensor]:
    out = [x.float().contiguous() for x in xs]
    for x in out:
        if x.ndim != 2 or x.shape[0] != channels:
            raise ValueError(f"{what} takes [{channels}, T] inputs, got {list(x.shape)}")
    return out


def _states(states: Sequence[Tensor | None], n: int, shape: tuple[int, int], what: str) -> list[Tensor | None]:
    if len(states) != n:
        raise ValueError(f"{n} inputs and {len(states)} states")
    out = []
    for s in states:
        if s is not None and tuple(s.shape) != shape:
            raise ValueError(f"{what} is [{shape[0]}, {shape[1]}], got {list(s.shape)}")
        out.append(None if s is None or shape[1] == 0 else s.float().contiguous())
    return out


def _parts(xs: list[Tensor], states: list[Tensor | None], ys: list[Tensor], new: list[Tensor],
           residuals: Sequence[Tensor | None] | None = None):
    """The ctypes array of ``VoSeg``: each stream's input, state, output and next state."""
    arr = (native.VoSeg * len(xs))()
    for i, seg in enumerate(arr):
        seg.x, seg.x_stride, seg.T = xs[i].data_ptr(), xs[i].shape[1], xs[i].shape[1]
        seg.hist, seg.residual = _ptr(states[i]), _ptr(residuals[i]) if residuals else None
        seg.y, seg.y_stride, seg.new_hist = ys[i].data_ptr(), ys[i].shape[1], new[i].data_ptr()
    return arr


def check_call(rc: int, what: str) -> None:
    """Raise, naming ``what``, where a native decoder call returned an error code."""
    if rc != 0:
        raise RuntimeError(f"{what} failed ({rc})" + (": the kernel refused AMX's tile state" if rc == -2 else ""))


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

    def _check_fits(self, precision: str) -> None:
        if not fits(self.c_out, self.c_in):
            raise ValueError(f"the native {precision} conv takes channel counts in multiples of 32, got "
                             f"{self.c_out} out, {self.c_in} in")

    def __call__(self, x: Tensor, hist: Tensor | None, snake: Snake | None = None,
                 residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(y [C_out, T], the next history) from x [C_in, T] and this conv's history (None: zeros);
        ``snake``: SnakeBeta's parameters, applied to x first; ``residual`` [C_out, T]: added to y.
        New tensors: the arguments are not written."""
        ys, hists = self.many([x], [hist], snake, None if residual is None else [residual])
        return ys[0], hists[0]

    def many(self, xs: Sequence[Tensor], hists: Sequence[Tensor | None], snake: Snake | None = None,
             residuals: Sequence[Tensor | None] | None = None) -> tuple[list[Tensor], list[Tensor]]:
        """``__call__`` for several streams in one call, each with its own input, history and residual."""
        xs = _inputs(xs, self.c_in, f"this [{self.c_out}, {self.c_in}, {self.k}] conv")
        hists = _states(hists, len(xs), (self.c_in, self.tail), "this conv's history")
        if residuals is not None:
            residuals = [None if r is None else r.float().contiguous() for r in residuals]
            for r, x in zip(residuals, xs):
                if r is not None and tuple(r.shape) != (self.c_out, x.shape[1]):
                    raise ValueError(f"the residual must be [{self.c_out}, {x.shape[1]}], got {list(r.shape)}")
        ys = [torch.empty(self.c_out, x.shape[1]) for x in xs]
        new = [torch.empty(self.c_in, self.tail) for _ in xs]
        a, ib = _snake(snake)
        parts = _parts(xs, hists, ys, new, residuals)
        check_call(self._run(a, ib, parts, len(xs), self.threads or torch.get_num_threads()),
               f"{type(self).__name__} on a [{self.c_out}, {self.c_in}, {self.k}] conv")
        return ys, new

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        raise NotImplementedError


class Bf16Conv(_NativeConv):
    """A causal conv in bf16 with fp32 sums, its weights packed once for the tile loops."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, threads: int | None = None,
                 variant: str = "native"):
        super().__init__(weight, bias, dilation, threads, variant)
        self._check_fits("bf16")
        self.packed = torch.empty(weight.numel(), dtype=torch.int16)
        rc = self.lib.vo_conv_pack_bf16(weight.float().contiguous().data_ptr(), self.c_out, self.c_in, self.k,
                                        self.packed.data_ptr())
        if rc != 0:
            raise RuntimeError(f"vo_conv_pack_bf16 failed ({rc}) on a {list(weight.shape)} conv")

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        return self.lib.vo_conv_bf16(self.packed.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                     self.dilation, _ptr(a), _ptr(ib), parts, n, threads)


class Int8Conv(_NativeConv):
    """A causal conv with int8 products (see the module doc), its weights rounded and packed once."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, threads: int | None = None,
                 variant: str = "native"):
        super().__init__(weight, bias, dilation, threads, variant)
        self._check_fits("int8")
        self.packed = torch.empty(weight.numel(), dtype=torch.int8)
        self.scale = torch.empty(self.c_out)
        self.wsum = torch.empty(self.c_out * self.k, dtype=torch.int32)
        rc = self.lib.vo_conv_pack_i8(weight.float().contiguous().data_ptr(), self.c_out, self.c_in, self.k,
                                      self.packed.data_ptr(), self.scale.data_ptr(), self.wsum.data_ptr())
        if rc != 0:
            raise RuntimeError(f"vo_conv_pack_i8 failed ({rc}) on a {list(weight.shape)} conv")

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        return self.lib.vo_conv_i8(self.packed.data_ptr(), self.scale.data_ptr(), self.wsum.data_ptr(),
                                   _ptr(self.bias), self.c_out, self.c_in, self.k, self.dilation, _ptr(a), _ptr(ib),
                                   parts, n, threads)


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

    def __call__(self, x: Tensor, hist: Tensor | None, snake1: Snake, snake2: Snake) -> tuple[Tensor, Tensor]:
        """(y [C, T], conv1's next history) from x [C, T] and conv1's history (None: zeros). New tensors."""
        ys, hists = self.many([x], [hist], snake1, snake2)
        return ys[0], hists[0]

    def many(self, xs: Sequence[Tensor], hists: Sequence[Tensor | None], snake1: Snake, snake2: Snake
             ) -> tuple[list[Tensor], list[Tensor]]:
        """``__call__`` for several streams in one call."""
        c1, c2 = self.conv1, self.conv2
        xs = _inputs(xs, self.channels, "this ResidualUnit")
        hists = _states(hists, len(xs), (self.channels, c1.tail), "its history")
        ys = [torch.empty_like(x) for x in xs]
        new = [torch.empty(self.channels, c1.tail) for _ in xs]
        (a1, ib1), (a2, ib2) = _snake(snake1), _snake(snake2)
        rc = c1.lib.vo_res_unit_bf16(c1.packed.data_ptr(), _ptr(c1.bias), c2.packed.data_ptr(), _ptr(c2.bias),
                                     self.channels, c1.k, c1.dilation, a1.data_ptr(), ib1.data_ptr(), a2.data_ptr(),
                                     ib2.data_ptr(), _parts(xs, hists, ys, new), len(xs),
                                     c1.threads or torch.get_num_threads())
        check_call(rc, f"vo_res_unit_bf16 on {self.channels} channels")
        return ys, new


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
        ys, hists = self.many([x], [hist])
        return ys[0], hists[0]

    def many(self, xs: Sequence[Tensor], hists: Sequence[Tensor | None]) -> tuple[list[Tensor], list[Tensor]]:
        """``__call__`` for several streams in one call."""
        xs = _inputs(xs, self.channels, "this ConvNeXt block")
        hists = _states(hists, len(xs), (self.channels, self.k - 1), "its history")
        ys = [torch.empty_like(x) for x in xs]
        new = [torch.empty(self.channels, self.k - 1) for _ in xs]
        rc = self.lib.vo_convnext_bf16(
            self.dw_w.data_ptr(), self.dw_b.data_ptr(), self.channels, self.k, self.norm[0].data_ptr(),
            self.norm[1].data_ptr(), self.eps, self.fc1.packed.data_ptr(), _ptr(self.fc1.bias), self.fc1.c_out,
            self.fc2.packed.data_ptr(), _ptr(self.fc2.bias), _parts(xs, hists, ys, new), len(xs),
            self.threads or torch.get_num_threads())
        check_call(rc, f"vo_convnext_bf16 on {self.channels} channels")
        return ys, new


class _TransConv:
    """A causal transposed conv (ConvTranspose1d with kernel k = stride or 2 * stride, the last
    k - stride outputs dropped): the product as a 1x1 conv to (tap, channel) rows (``PRODUCT``),
    and the overlap of each input's taps with the next one's in the same native call."""

    PRODUCT: type[_NativeConv]

    def __init__(self, weight: Tensor, bias: Tensor | None, stride: int, threads: int | None = None,
                 variant: str = "native"):
        if weight.ndim != 3:
            raise ValueError(f"a transposed conv weight is [C_in, C_out, k], got {list(weight.shape)}")
        self.c_in, self.c_out, self.k = weight.shape
        if self.k not in (stride, 2 * stride):
            raise ValueError(f"a kernel of {self.k} with stride {stride} is not streamed here (k = stride or 2 * stride)")
        taps = weight.float().permute(2, 1, 0).reshape(self.k * self.c_out, self.c_in, 1)  # [(tap, out), in, 1]
        self.product = self.PRODUCT(taps, None, 1, threads, variant)
        self.stride, self.over, self.threads, self.lib = stride, self.k - stride, threads, self.product.lib
        self.bias = None if bias is None else bias.float().reshape(-1).contiguous()

    def __call__(self, x: Tensor, carry: Tensor | None, snake: Snake | None = None) -> tuple[Tensor, Tensor]:
        """(y [C_out, T * stride], the next carry [C_out, k - stride]) from x [C_in, T] and the
        previous call's carry (None: zeros); ``snake`` as ``Bf16Conv``'s."""
        ys, carries = self.many([x], [carry], snake)
        return ys[0], carries[0]

    def many(self, xs: Sequence[Tensor], carries: Sequence[Tensor | None], snake: Snake | None = None
             ) -> tuple[list[Tensor], list[Tensor]]:
        """``__call__`` for several streams in one call."""
        xs = _inputs(xs, self.c_in, "this transposed conv")
        carries = _states(carries, len(xs), (self.c_out, self.over), "its carry")
        ys = [torch.empty(self.c_out, x.shape[1] * self.stride) for x in xs]
        new = [torch.zeros(self.c_out, self.over) for _ in xs]
        a, ib = _snake(snake)
        rc = self._run(a, ib, _parts(xs, carries, ys, new), len(xs), self.threads or torch.get_num_threads())
        check_call(rc, f"{type(self).__name__} on a [{self.c_in}, {self.c_out}, {self.k}] transposed conv")
        return ys, new

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        raise NotImplementedError


class Bf16TransConv(_TransConv):
    """A causal transposed conv in bf16 with fp32 sums (``_TransConv``)."""

    PRODUCT = Bf16Conv

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        return self.lib.vo_tconv_bf16(self.product.packed.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                      self.stride, _ptr(a), _ptr(ib), parts, n, threads)


class Int8TransConv(_TransConv):
    """A causal transposed conv with int8 products (``_TransConv``; rounded as ``Int8Conv``)."""

    PRODUCT = Int8Conv

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        p = self.product
        return self.lib.vo_tconv_i8(p.packed.data_ptr(), p.scale.data_ptr(), p.wsum.data_ptr(), _ptr(self.bias),
                                    self.c_out, self.c_in, self.k, self.stride, _ptr(a), _ptr(ib), parts, n, threads)


NARROW_MAX = 8


class NarrowConv(_NativeConv):
    """A causal conv to a few channels (at most ``NARROW_MAX``: the decoder's last, 96 -> 1) in fp32,
    time split across threads; several streams are one call each. No residual."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dilation: int = 1, threads: int | None = None,
                 variant: str = "native"):
        super().__init__(weight, bias, dilation, threads, variant)
        if self.c_out > NARROW_MAX:
            raise ValueError(f"the narrow conv makes at most {NARROW_MAX} channels, got {self.c_out}")
        self.w = weight.float().contiguous()

    def _run(self, a, ib, parts, n: int, threads: int) -> int:
        for seg in parts:
            if seg.residual:
                raise ValueError("the narrow conv adds no residual")
            rc = self.lib.vo_conv_f32_narrow(self.w.data_ptr(), _ptr(self.bias), self.c_out, self.c_in, self.k,
                                             self.dilation, seg.hist, seg.x, seg.T, _ptr(a), _ptr(ib), seg.y,
                                             seg.new_hist, threads)
            if rc != 0:
                return rc
        return 0
