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
    """One artifact by id (``area/name``). A missing one is named with the ids of its area, or
    with the areas there are when its own has none."""
    root = Path(root) if root is not None else published_results_dir()
    if not root.is_dir():
        raise ArtifactError(root, "(folder)", "no results folder here (it does not exist, or is a file)")
    path = root / f"{artifact_id}.json"
    if not path.is_file():
        known = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.json"))
        area = artifact_id.split("/", 1)[0] + "/"
        same = [k for k in known if k.startswith(area)]
        areas = sorted({k.split("/", 1)[0] for k in known})
        hint = f"known: {', '.join(same)}" if same else f"none in {area}; areas: {', '.join(areas) or 'none'}"
        raise ArtifactError(path, "id", f"no artifact {artifact_id!r}; {hint}")
    return load_file(path)


def folder_problem(folder: str | Path) -> str | None:
    """Why artifacts could not be written under ``folder`` (None if they can): checked before a
    benchmark measures anything, so that a bad ``--output`` never costs a run."""
    folder = Path(folder)
    probe = folder
    while not probe.exists():  # the nearest folder that exists must take new entries
        if probe.parent == probe:
            break
        probe = probe.parent
    where = "" if probe == folder else f"{probe}, above it, "
    if not probe.is_dir():
        return f"{where}is not a folder" if where else "not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{where}cannot be written" if where else "cannot be written"
    return None


def _path_problem(path: Path) -> str | None:
    if path.exists() and not path.is_file():
        return "is there and is not a file"
    return folder_problem(path.parent)


def write(artifact: Artifact | dict, root: str | Path | None = None) -> Path:
    """Validate, then write ``<root>/<id>.json`` (stable key order, trailing newline) through a
    temporary file that never stays behind. A value JSON cannot hold (NaN, infinity) or a path
    that cannot be written raises ArtifactError, naming the file."""
    return write_all([artifact], root)[0]


def write_all(artifacts: list[Artifact | dict], root: str | Path | None = None) -> list[Path]:
    """Write several artifacts: every one is validated and serialised, and every path checked,
    before the first is written, so that a file refused for its content or its place never
    leaves the others half written."""
    root = Path(root) if root is not None else default_results_dir()
    staged: list[tuple[Path, str]] = []
    for artifact in artifacts:
        data = artifact.to_dict() if isinstance(artifact, Artifact) else artifact
        path = root / f"{data['id']}.json"
        validate(data, path)  # refuse to write what the site would reject
        try:
            text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        except ValueError:
            raise ArtifactError(path, "(json)", "a number is NaN or infinite, which JSON cannot hold") from None
        problem = _path_problem(path)
        if problem:
            raise ArtifactError(path, "(file)", f"cannot write: {problem}")
        staged.append((path, text))
    for path, text in staged:
        tmp = path.with_suffix(".json.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ArtifactError(path, "(file)", f"cannot write: {exc.strerror or exc}") from None
    return [path for path, _ in staged]
