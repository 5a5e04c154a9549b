"""Finding, loading and writing artifacts under a ``results/`` tree."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .schema import Artifact, ArtifactError, load_file, validate

RESULTS_DIR_ENV = "VLLM_OMNI_RESULTS_DIR"


def repo_root() -> Path:
    """The checkout this package lives in (src layout), else the working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "results").is_dir():
            return parent
    return Path.cwd()


def default_results_dir() -> Path:
    """Where benchmarks write: ``$VLLM_OMNI_RESULTS_DIR`` if set, else ``<repo>/results``."""
    env = os.environ.get(RESULTS_DIR_ENV)
    return Path(env) if env else repo_root() / "results"


def published_results_dir() -> Path:
    """The committed artifacts the site is built from (never redirected by the env var)."""
    return repo_root() / "results"


def load_all(root: str | Path | None = None) -> dict[str, Artifact]:
    """Every artifact under ``root``, keyed by id. Any malformed file raises, naming it."""
    root = Path(root) if root is not None else published_results_dir()
    found: dict[str, Artifact] = {}
    for path in sorted(root.rglob("*.json")):
        art = load_file(path)
        if art.id in found:
            raise ArtifactError(path, "id", f"duplicate id {art.id!r}, also used by {found[art.id].path}")
        found[art.id] = art
    return found


def load(artifact_id: str, root: str | Path | None = None) -> Artifact:
    """One artifact by id (``area/name``)."""
    root = Path(root) if root is not None else published_results_dir()
    path = root / f"{artifact_id}.json"
    if not path.is_file():
        known = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.json"))
        raise ArtifactError(path, "id", f"no artifact {artifact_id!r}; known: {', '.join(known) or 'none'}")
    return load_file(path)


def write(artifact: Artifact | dict, root: str | Path | None = None) -> Path:
    """Validate, then write ``<root>/<id>.json`` (stable key order, trailing newline)."""
    data = artifact.to_dict() if isinstance(artifact, Artifact) else artifact
    root = Path(root) if root is not None else default_results_dir()
    path = root / f"{data['id']}.json"
    validate(data, path)  # refuse to write what the site would reject
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
