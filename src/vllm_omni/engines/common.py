"""Small pieces the engine modules share: package checks, format checks, versions, inputs.

Kept apart from ``export.py`` so that asking whether an engine is installed, or which
versions it has, never imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from vllm_omni.engines import EngineUnsupported

FORMATS = ("fp32", "int8", "int4")
INSTALL_HINT = "pip install 'qwen3-tts-edge[engines]'"


def missing(*modules: str) -> str | None:
    """Why an engine is unavailable (the first import name not installed), or None."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            return f"python package {m!r} is not installed ({INSTALL_HINT})"
    return None


def dist_versions(*dists: str) -> dict[str, str | None]:
    """Installed versions of distributions by name, None for those not installed."""
    out: dict[str, str | None] = {}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = None
    return out


def check_format(fmt: str, supported: dict[str, str | None], engine: str) -> None:
    """Raise ValueError for an unknown format, EngineUnsupported for one this engine cannot run.

    ``supported`` maps each of :data:`FORMATS` to None (runs) or the reason it does not.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; valid: {', '.join(FORMATS)}")
    reason = supported.get(fmt, f"{engine} has no {fmt} path here")
    if reason is not None:
        raise EngineUnsupported(reason)


def check_threads(threads: int) -> int:
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return threads


def file_bytes(*paths: str | Path) -> int:
    """Total size of the files an engine loads (its model on disk)."""
    return sum(Path(p).stat().st_size for p in paths)


@contextlib.contextmanager
def captured_output():
    """Send file descriptors 1 and 2 (native converters print there) to a buffer.

    Yields a list that holds the captured text once the block ends, for error messages.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as buf:
        try:
            os.dup2(buf.fileno(), 1)
            os.dup2(buf.fileno(), 2)
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            buf.seek(0)
            out.append(buf.read().decode(errors="replace"))
