"""Every file in snippets/ runs on its own, whether or not a page includes it.

A comment ``# requires: HAS_CUDA`` in a file's first three lines (any flags of
vllm_omni.capabilities, comma-separated) skips it on machines without them, with the flags as
the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.capabilities import flags

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = sorted(p for p in (ROOT / "snippets").iterdir() if p.suffix in (".py", ".sh"))
REQUIRES_RE = re.compile(r"^#\s*requires:\s*(.+)$", re.M)


def requirements(path: Path) -> list[str]:
    head = "\n".join(path.read_text().splitlines()[:3])
    return [f.strip() for m in REQUIRES_RE.finditer(head) for f in m.group(1).split(",")]


def test_there_are_snippets():
    assert SNIPPETS


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.name)
def test_snippet_runs(path: Path, tmp_path):
    have = flags()
    for flag in requirements(path):
        if flag not in have:
            pytest.fail(f"{path.name}: unknown requirement {flag!r}; known: {', '.join(have)}")
        if not have[flag]:
            pytest.skip(f"needs {flag}")
    env = dict(os.environ, VLLM_OMNI_RESULTS_DIR=str(tmp_path), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [sys.executable, str(path)] if path.suffix == ".py" else ["bash", "-euo", "pipefail", str(path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_examples_remove_their_temporary_folders():
    """Page blocks, snippets and the package write scratch files only into folders that are
    removed afterwards (``TemporaryDirectory``, ``tiny_qwen3()``, pytest's ``tmp_path``): every
    test run executes them, and a bare ``mkdtemp()`` left gigabytes of exports behind each time."""
    files = [*(ROOT / "docs").rglob("*.md"), *SNIPPETS, *(ROOT / "src" / "vllm_omni").rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in files
                 for n, line in enumerate(p.read_text().splitlines(), 1) if "mkdtemp(" in line]
    assert not offenders, f"a temporary folder nobody removes: {', '.join(offenders)}"
