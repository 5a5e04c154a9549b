"""KV budget: an explicit per-engine ``kv_cache_memory_bytes`` wins over ``VLLM_CPU_KVCACHE_SPACE``.

What vLLM's CPU platform does: ``CpuPlatform.check_and_update_config`` replaces
``cache_config.kv_cache_memory_bytes`` with ``VLLM_CPU_KVCACHE_SPACE`` GiB whenever that
environment variable is set and non-empty, silently, even when the engine was given its own
budget (vllm-cpu 0.32.0, ``vllm/platforms/cpu.py:323-327``). The variable is process-wide
and inherited by every child process, so two stages with different budgets cannot coexist
once it is set anywhere.

What the patch does: it wraps ``check_and_update_config``; when the engine arrived with an
explicit budget and the platform changed it, the explicit budget is put back and a warning
names both values. Engines without an explicit budget keep vLLM's behaviour.

The worker's startup check that ``gpu_memory_utilization`` (0.92 by default) of the node's
memory is free is skipped by vLLM itself when ``kv_cache_memory_bytes`` is set
(``vllm/v1/worker/cpu_worker.py:79-81``). So keeping the explicit budget is also what lets
a stage with a budget start on a node that is already partly used. The patch checks that
this gate is there and refuses if it is not, because then an explicit budget would no
longer be enough to start a second stage.
"""

from __future__ import annotations

import functools
import logging

from ._base import Patch, PatchRefused, Target, assigns_attribute, compares_is_none, function_of, mentions_string, source_tree

logger = logging.getLogger("vllm_omni.patches.kv_budget")

ENV_VAR = "VLLM_CPU_KVCACHE_SPACE"
_PLATFORM = Target("vllm.platforms.cpu", "CpuPlatform", "check_and_update_config")
_WORKER_INIT = "vllm.v1.worker.cpu_worker"


class KvBudgetPatch(Patch):
    name = "kv_budget"
    summary = f"an explicit kv_cache_memory_bytes is kept when {ENV_VAR} is set"
    targets = (_PLATFORM,)

    def check(self, originals):
        raw = originals[_PLATFORM.qualname]
        if not isinstance(raw, classmethod):
            raise PatchRefused(self.name, f"{_PLATFORM.qualname} is no longer a classmethod")
        tree = source_tree(self.name, function_of(raw))
        if not (mentions_string(tree, ENV_VAR) and assigns_attribute(tree, "kv_cache_memory_bytes")):
            raise PatchRefused(
                self.name,
                f"{_PLATFORM.qualname} no longer sets kv_cache_memory_bytes from {ENV_VAR}: "
                "the override this patch undoes is gone",
            )
        # The worker must skip its free-memory check for an explicit budget (see module doc).
        try:
            from vllm.v1.worker.cpu_worker import CPUWorker
        except ImportError as exc:
            raise PatchRefused(self.name, f"cannot import {_WORKER_INIT} ({exc})") from None
        if not compares_is_none(source_tree(self.name, CPUWorker.__init__), "kv_cache_memory_bytes"):
            raise PatchRefused(
                self.name,
                f"{_WORKER_INIT}.CPUWorker.__init__ no longer skips its free-memory check when "
                "kv_cache_memory_bytes is set",
            )

    def build(self, originals):
        original = function_of(originals[_PLATFORM.qualname])

        @functools.wraps(original)
        def check_and_update_config(cls, vllm_config):
            cache_config = getattr(vllm_config, "cache_config", None)
            explicit = getattr(cache_config, "kv_cache_memory_bytes", None)
            original(cls, vllm_config)
            if explicit is not None and cache_config.kv_cache_memory_bytes != explicit:
                import os

                logger.warning(
                    "kv_cache_memory_bytes=%d set for this engine is kept; %s=%r would have replaced it "
                    "with %d bytes (vllm_omni patch kv_budget)",
                    explicit, ENV_VAR, os.environ.get(ENV_VAR), cache_config.kv_cache_memory_bytes,
                )
                cache_config.kv_cache_memory_bytes = explicit

        return {_PLATFORM.qualname: classmethod(check_and_update_config)}
