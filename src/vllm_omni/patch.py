"""The vLLM CPU patches (the implementation lives in :mod:`vllm_omni.patches`).

``from vllm_omni import patch; patch.apply_all()`` applies them; the ``vllm.general_plugins``
entry point :func:`vllm_omni.plugin.register` does this in every vLLM process.
"""

from vllm_omni.patches import PATCHES, Patch, PatchRefused, apply_all, get, revert_all, status

__all__ = ["PATCHES", "Patch", "PatchRefused", "apply_all", "revert_all", "status", "get"]
