"""Qwen3-TTS on edge devices and CPUs: the package behind the study.

Importing this package is cheap on purpose: torch and vllm are imported only by the
modules that need them (``vllm_omni.cpu``, ``vllm_omni.patch``), never here.
"""

__version__ = "0.1.0"
