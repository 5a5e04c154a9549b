"""Every code block in docs/ and snippets/ is a test (Sybil), with hardware flags.

- Python blocks (plain or ``>>>``) run in-process, one namespace per page.
- ``bash`` blocks run through ``bash -euo pipefail`` from the repo root, with the venv's
  ``bin`` on PATH and ``VLLM_OMNI_RESULTS_DIR`` pointing at a temporary folder, so a
  benchmark run from a page never overwrites a committed artifact. That folder is removed
  when the session passes, as pytest does with ``tmp_path`` (``tmp_path_retention_policy``).
- ``--8<--`` includes are expanded with pymdownx's own preprocessor, exactly as the site does.
- ``<!-- skip: next if(not HAS_CUDA, reason="...") -->`` skips the next block; the flags
  (HAS_CUDA, HAS_MPS, HAS_AVX2, HAS_AVX512, HAS_AMX, HAS_TORCH, HAS_VLLM, HAS_CXX, HAS_ENGINES,
  HAS_ARM_EMULATION) are in the
  namespace. Ordinary tests use the mirroring pytest markers (gpu, mps, avx512, amx, vllm, engines).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import markdown
import pytest
from sybil import Document, Sybil
from sybil.parsers.markdown import ClearNamespaceParser, CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.rest import DocTestParser

from vllm_omni.capabilities import MARKERS, flags

ROOT = Path(__file__).resolve().parent
SNIPPETS = ROOT / "snippets"
_results_tmp: list[str] = []  # made on first use: processes that only import this module make none


def results_tmp() -> str:
    """The session's folder for artifacts written by page blocks."""
    if not _results_tmp:
        _results_tmp.append(tempfile.mkdtemp(prefix="vllm-omni-doc-results-"))
    return _results_tmp[0]


def expand_snippets(text: str) -> str:
    """Run pymdownx.snippets over ``text`` with the site's settings (base_path, check_paths)."""
    md = markdown.Markdown(
        extensions=["pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(SNIPPETS)], "check_paths": True}},
    )
    return "\n".join(md.preprocessors["snippet"].run(text.split("\n")))


class SnippetExpandingDocument(Document):
    """A Markdown page as the site renders it: includes expanded before parsing."""

    @classmethod
    def parse(cls, path: str, *parsers, encoding: str = "utf-8") -> Document:
        text = expand_snippets(Path(path).read_text(encoding=encoding))
        document = cls(text, path)
        for parser in parsers:
            for region in parser(document):
                document.add(region)
        return document


def doc_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["VLLM_OMNI_RESULTS_DIR"] = results_tmp()
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def evaluate_bash(example) -> str | None:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.parsed],
        cwd=ROOT, env=doc_env(), capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        return f"bash exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return None


def setup_namespace(namespace: dict) -> None:
    namespace.update(flags())
    namespace["RESULTS_TMP"] = os.environ["VLLM_OMNI_RESULTS_DIR"] = results_tmp()


def teardown_namespace(namespace: dict) -> None:
    os.environ.pop("VLLM_OMNI_RESULTS_DIR", None)


_PARSERS = [
    PythonCodeBlockParser(),
    CodeBlockParser(language="bash", evaluator=evaluate_bash),
    SkipParser(),
    ClearNamespaceParser(),
]

_docs = Sybil(
    parsers=_PARSERS,
    path="docs",
    patterns=["*.md"],  # matched from the right: covers docs/*.md and every depth below
    document_types={".md": SnippetExpandingDocument},
    setup=setup_namespace,
    teardown=teardown_namespace,
    name="docs",
)
# Docstring examples in snippet files; tests/test_snippets.py also runs each file whole.
_snippets = Sybil(
    parsers=[DocTestParser()], path="snippets", patterns=["*.py"], setup=setup_namespace,
    teardown=teardown_namespace, name="snippets",
)
pytest_collect_file = (_docs + _snippets).pytest()


SCRATCH_GB = 3  # what a session writes into the temporary folder at most (engine exports, GGUFs)


def pytest_report_header(config):
    """Free space where the tests write: a full disk otherwise shows up only as scattered
    errors and a pytest internal error, far from the cause."""
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 1e9
    line = f"temporary folder: {where}, {free:.1f} GB free (the tests write up to about {SCRATCH_GB} GB there)"
    if free < SCRATCH_GB + 1:
        line += f"\nWARNING: too little free space in {where}: free some, or set TMPDIR to a larger disk"
    return line


def pytest_sessionfinish(session, exitstatus):
    """Drop the doc blocks' results folder after a passing session; keep it to inspect a failure."""
    if exitstatus == 0:
        for path in _results_tmp:
            shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Skip tests whose hardware marker this machine lacks, with the flag as the reason."""
    have = flags()
    for item in items:
        for marker, flag in MARKERS.items():
            if item.get_closest_marker(marker) and not have[flag]:
                item.add_marker(pytest.mark.skip(reason=f"needs {flag} ({marker})"))
