"""Other inference engines running the same code-predictor pass as this project's kernels.

Each engine is one module here (``vllm_omni.engines.<name>``) exposing the same small
interface, so ``vllm-omni-bench engines`` can time them all on one host, same shapes, same
threads:

- ``NAME``: the engine's display name;
- ``unavailable() -> str | None``: why it cannot run here (a missing package), or ``None``;
- ``versions() -> dict[str, str | None]``: package versions and build identifiers (for
  provenance: llama.cpp's commit, build flags, ...);
- ``prepare(weights, *, fmt, threads, workdir, position) -> PassRunner``: export or convert
  the random-weight predictor (``vllm_omni.cpu.weights.PredictorWeights``) into the engine's
  format under ``workdir`` and return a runner whose ``run_once()`` is one single-token pass
  (5 blocks, final norm, one lm_head) at KV position ``position``. Formats an engine cannot
  run raise ``EngineUnsupported`` with the reason, which the benchmark records.

Nothing here imports an engine package at import time.
"""

from __future__ import annotations

from typing import Protocol


class EngineUnsupported(RuntimeError):
    """The engine cannot run this format or shape; the message says what failed and why."""


class PassRunner(Protocol):
    def run_once(self) -> None: ...
