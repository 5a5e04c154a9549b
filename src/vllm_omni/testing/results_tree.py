"""A scratch copy of the committed results tree, for tests that edit an artifact and rerun a computed one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from vllm_omni.results.store import published_results_dir


def copy_results(tmp_path: Path) -> Path:
    """``results/`` copied under ``tmp_path``; returns the copy's root."""
    root = tmp_path / "results"
    shutil.copytree(published_results_dir(), root)
    return root


def edit_artifact(root: Path, art_id: str, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``change`` to the JSON of ``art_id`` under ``root``, in place."""
    path = root / f"{art_id}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
