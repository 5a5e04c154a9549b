"""The CPU patches, applied through vLLM's own extension points.

Each patch replaces one or more vLLM methods at plugin time (see :mod:`vllm_omni.plugin`), checks
first that the behaviour it fixes is present, applies atomically, logs what it did, can be
reverted, and refuses with a message and nothing changed when its target is missing or
different:

- ``kv_budget``: an explicit ``kv_cache_memory_bytes`` wins over ``VLLM_CPU_KVCACHE_SPACE``;
- ``core_binding``: engines tagged with a stage bind their workers (in-process: the thread
  that builds the engine) to disjoint cores;
- ``threads``: ``torch.set_num_threads`` keeps working when a CPU worker shares the process.

Importing this package imports neither torch nor vllm; applying a patch does.
"""

from __future__ import annotations

import logging

from ._base import Patch, PatchRefused
from .core_binding import CoreBindingPatch
from .kv_budget import KvBudgetPatch
from .threads import ThreadsPatch

logger = logging.getLogger("vllm_omni.patches")

PATCHES: dict[str, Patch] = {p.name: p for p in (KvBudgetPatch(), CoreBindingPatch(), ThreadsPatch())}

__all__ = ["PATCHES", "Patch", "PatchRefused", "apply_all", "revert_all", "status", "get"]


def get(name: str) -> Patch:
    try:
        return PATCHES[name]
    except KeyError:
        raise KeyError(f"no patch {name!r}; known: {', '.join(PATCHES)}") from None


def apply_all(names: list[str] | tuple[str, ...] | None = None) -> dict[str, str]:
    """Apply the named patches (None: all; an empty list: none). Returns ``{name: "applied" |
    "already applied" | "refused: <reason>"}``; a refusal is logged as a warning and never
    raised, and so is an unexpected error while a patch checks the vLLM it finds (a patch sets
    nothing until its checks pass, so none is left half applied)."""
    out: dict[str, str] = {}
    for name in tuple(PATCHES) if names is None else names:
        patch = get(name)
        try:
            out[name] = "applied" if patch.apply() else "already applied"
        except PatchRefused as exc:
            logger.warning("%s", exc)
            out[name] = f"refused: {exc.reason}"
        except Exception as exc:  # noqa: BLE001 - vLLM calls the plugin without a try
            logger.warning("vllm_omni patch %r not applied: %s: %s", name, type(exc).__name__, exc)
            out[name] = f"refused: {type(exc).__name__}: {exc}"
    return out


def revert_all() -> dict[str, bool]:
    """Revert every patch this process applied (tests); ``{name: whether it was reverted}``."""
    return {name: patch.revert() for name, patch in reversed(list(PATCHES.items()))}


def status() -> dict[str, str]:
    """``{name: "applied" | "applicable" | "would be refused: <reason>"}`` without changing anything."""
    out = {}
    for name, patch in PATCHES.items():
        if patch.applied:
            out[name] = "applied"
        else:
            reason = patch.probe()
            out[name] = "applicable" if reason is None else f"would be refused: {reason}"
    return out
