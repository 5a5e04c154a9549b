"""Qwen3-TTS on edge devices and CPUs: the package behind the study.

Importing this package is cheap on purpose: torch and vllm are imported only by the
modules that need them (such as ``vllm_omni.quantization``, ``vllm_omni.ops`` and the
submodules of ``vllm_omni.cpu`` and ``vllm_omni.gpu``) or when a patch is applied, never
here.
"""

__version__ = "0.1.0"
