"""The code predictor with its pass under ``torch.compile`` (inductor): the study's lever
"torch.compile on the CPU runner", measured on the pass it would have to speed up.

Why the static-cache model rather than the eager reference: ``torch.compile`` specialises a
graph on shapes and on the Python values it reads. The reference grows its KV cache by slicing
to a Python length, which would compile one graph per position. The static-cache predictor of
:mod:`vllm_omni.gpu.static_frame` attends over all 16 slots with a mask and takes positions and
the output head as tensors, so a whole frame runs on two graphs: the 2-token first pass and the
1-token pass that the other fourteen share. The choice of each code stays eager. Inductor bakes
the thread count into its code, so a change of ``torch.set_num_threads`` compiles again on the
next call (tens of seconds for the 5-layer pass on a small host): warm up after changing it.

fp32 only: the static-cache model has no quantized linears.
"""

from __future__ import annotations

import torch

from vllm_omni.cpu.weights import PredictorWeights
from vllm_omni.gpu.static_frame import StaticPredictor

FORMATS = ("fp32",)


class CompiledPredictor(StaticPredictor):
    """``StaticPredictor`` on the CPU whose ``pass_logits`` is compiled (fullgraph, static shapes)."""

    def __init__(self, weights: PredictorWeights, fmt: str = "fp32"):
        if fmt not in FORMATS:
            raise ValueError(f"the compiled predictor runs {', '.join(FORMATS)} weights only, not {fmt!r}: "
                             "the static-cache model it compiles has no quantized linears")
        super().__init__(weights, dtype=torch.float32, device="cpu")
        self.pass_logits = torch.compile(self.pass_logits, fullgraph=True, dynamic=False)
