"""The official ``qwen-tts`` in its own environment, driven through files.

``qwen-tts`` 0.1.1 pins transformers 4.57.3, which the main environment cannot have beside
vLLM, so ``make test`` builds ``.venv-official`` for it and the equality tests and the
end-to-end benchmark run ``qwen_tts_side.py`` (this folder) with that interpreter. The side
imports only the official package (and, through ``PYTHONPATH``, this project's random-weight
rule); ``stubs/`` holds a torchaudio that raises if called, since torchaudio has no build for
this torch and the 12 Hz checkpoints never use it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIDE = HERE / "qwen_tts_side.py"
STUBS = HERE / "stubs"
SRC = HERE.parents[2]  # the folder that holds vllm_omni
ENV = "VLLM_OMNI_OFFICIAL_PYTHON"


class OfficialUnavailable(RuntimeError):
    """The official environment is not there (``make test`` builds it)."""


def official_python() -> Path:
    """The official environment's interpreter: ``$VLLM_OMNI_OFFICIAL_PYTHON``, else ``.venv-official``
    at the top of the checkout."""
    given = os.environ.get(ENV)
    exe = Path(given) if given else SRC.parent / ".venv-official" / "bin" / "python"
    if not exe.exists():
        raise OfficialUnavailable(f"{exe}: no such interpreter; `make test` builds .venv-official with qwen-tts 0.1.1"
                                  + (f" (set by ${ENV})" if given else ""))
    return exe


def official_or_skip() -> Path:
    """The official interpreter for a test module: a skip naming what is missing, or a failure where
    ``$VLLM_OMNI_OFFICIAL_PYTHON`` asked for it (``make test`` does)."""
    import pytest

    try:
        return official_python()
    except OfficialUnavailable as exc:
        if os.environ.get(ENV):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def run_side(*args: object, threads: int | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run ``qwen_tts_side.py`` with ``args`` in the official environment; RuntimeError with its output on failure."""
    env = dict(os.environ, PYTHONPATH=f"{STUBS}{os.pathsep}{SRC}", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run([str(official_python()), str(SIDE), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the official side failed ({' '.join(map(str, args[:1]))}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")
    return proc


def write_official_checkpoint(root: Path, configs: dict[str, Any], seed: int = 0) -> Path:
    """A checkpoint written by the official classes from ``configs`` (``checkpoint_configs``)."""
    path = root.parent / f"{root.name}-configs.json"
    path.write_text(json.dumps(configs))
    run_side("write", root, path, seed)
    return root
