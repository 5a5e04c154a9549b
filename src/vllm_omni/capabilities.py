"""What this machine can run: the flags behind the docs' skip directives and test markers.

``HAS_CUDA`` asks torch only if torch is installed (falling back to ``nvidia-smi -L``);
everything else is read from /proc/cpuinfo, PATH and package metadata, so computing the
flags never imports vllm.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import lru_cache

from vllm_omni.results.provenance import cpuinfo


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            return bool(torch.cuda.is_available())
        except Exception:  # noqa: BLE001 - a broken CUDA stack means no usable GPU
            return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@lru_cache(maxsize=1)
def flags() -> dict[str, bool]:
    """``{"HAS_CUDA": ..., "HAS_MPS": ..., "HAS_AVX2": ..., ...}`` for this machine."""
    cpu = cpuinfo()["flags"]
    cuda = _has_cuda()
    return {
        "HAS_CUDA": cuda,
        # MPS here is NVIDIA's Multi-Process Service, not Apple's Metal backend.
        "HAS_MPS": cuda and shutil.which("nvidia-cuda-mps-control") is not None,
        "HAS_AVX2": "avx2" in cpu,
        "HAS_AVX512": "avx512f" in cpu,
        "HAS_AMX": "amx_tile" in cpu,
        "HAS_TORCH": importlib.util.find_spec("torch") is not None,
        "HAS_VLLM": importlib.util.find_spec("vllm") is not None,
        "HAS_CXX": shutil.which("g++") is not None or shutil.which("c++") is not None,
        "HAS_ENGINES": all(importlib.util.find_spec(m) is not None for m in ENGINE_MODULES),
        "HAS_ARM_EMULATION": _arm_emulation(),
    }


def _arm_emulation() -> bool:
    """The ARM cross compiler and qemu-user are here (vllm_omni.cpu.cross)."""
    from vllm_omni.cpu.cross import toolchain_missing

    return toolchain_missing() is None


# Import names of the engines extra's main packages (pyproject.toml; the runners also check
# the helpers they need, such as onnxscript); HAS_ENGINES needs all of them.
ENGINE_MODULES = ("llama_cpp", "gguf", "onnxruntime", "onnx", "openvino", "executorch", "MNN", "ncnn", "pnnx")

# pytest marker name -> flag it needs
MARKERS = {
    "gpu": "HAS_CUDA", "mps": "HAS_MPS", "avx512": "HAS_AVX512", "amx": "HAS_AMX", "vllm": "HAS_VLLM",
    "engines": "HAS_ENGINES",
}
