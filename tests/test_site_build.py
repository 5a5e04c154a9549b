"""The hook inside a real (tiny) MkDocs build: tables appear, mistakes abort the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "src" / "vllm_omni" / "results" / "mkdocs_hook.py"
GOOD = ROOT / "tests" / "fixtures" / "good" / "good.json"


def make_site(tmp_path: Path, page: str, artifact: Path = GOOD) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page)
    (tmp_path / "results" / "fixture").mkdir(parents=True)
    shutil.copy(artifact, tmp_path / "results" / "fixture" / "good.json")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\nstrict: true\nhooks:\n  - {HOOK}\nnav:\n  - index.md\n  - artifacts/index.md\n"
        "validation:\n  omitted_files: warn\n  absolute_links: warn\n  unrecognized_links: warn\n  anchors: warn\n"
    )
    return tmp_path


def build(site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site / "mkdocs.yml")],
        capture_output=True, text=True, timeout=120,
    )


def test_table_and_artifact_page_are_built(tmp_path):
    site = make_site(tmp_path, "# Home\n\n<!-- table: fixture/good -->\n")
    proc = build(site)
    assert proc.returncode == 0, proc.stderr
    html = (site / "site" / "index.html").read_text()
    assert ">predictor</td>" in html
    artifact_page = (site / "site" / "artifacts" / "fixture" / "good" / "index.html").read_text()
    assert "Cited by" in artifact_page and "raw JSON" in artifact_page
    assert (site / "site" / "results" / "fixture" / "good.json").is_file()


@pytest.mark.parametrize(
    "page, expected",
    [
        ("# Home\n\n<!-- table: fixture/missing -->\n",
         ("docs/index.md:3: no artifact 'fixture/missing'", "in <!-- table: fixture/missing -->")),
        # a nested list by two spaces would come out flat: the line is named
        ("# Home\n\n- parent:\n  - child\n", ("docs/index.md:4", "indent nested lists by 4 spaces")),
        # a later paragraph by two spaces ends the list and runs the next item into it
        ("# Home\n\n- first\n\n  second paragraph\n- second item\n", ("docs/index.md", "'second item'")),
        # a precision that is not a number of significant figures
        ("# Home\n\n<!-- table: fixture/good digits=0 -->\n", ("docs/index.md:3", "digits='0'", "from 1 to 15")),
    ],
    ids=["unknown-id", "shallow-nested-list", "list-run-into-paragraph", "bad-digits"],
)
def test_a_page_mistake_fails_and_says_where(tmp_path, page, expected):
    proc = build(make_site(tmp_path, page))
    assert proc.returncode != 0
    assert all(e in proc.stderr for e in expected), proc.stderr


def test_malformed_artifact_fails_and_names_the_file(tmp_path):
    site = make_site(tmp_path, "# Home\n", artifact=ROOT / "tests" / "fixtures" / "bad" / "non-number.json")
    proc = build(site)
    assert proc.returncode != 0
    assert "results/fixture/good.json: rows[2][1] (ms)" in proc.stderr


def test_a_malformed_column_precision_fails_and_names_the_file_and_field(tmp_path):
    site = make_site(tmp_path, "# Home\n", artifact=ROOT / "tests" / "fixtures" / "bad" / "bad-column-digits.json")
    proc = build(site)
    assert proc.returncode != 0
    assert "results/fixture/good.json: columns[1].digits: expected a whole number" in proc.stderr
