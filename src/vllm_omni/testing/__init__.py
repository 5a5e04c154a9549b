"""Helpers shared by the tests and the documentation's code blocks.

Nothing here is imported by ``import vllm_omni``; each submodule imports its own
dependencies (torch, safetensors, tokenizers) when it is used.
"""
