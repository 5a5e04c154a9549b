"""Nothing under results/ may be ignored by git or left untracked (the study lost artifacts
to a blanket ``*.json`` rule)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def in_git():
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def test_no_result_is_ignored(in_git):
    ignored = git("ls-files", "--others", "--ignored", "--exclude-standard", "results")
    assert ignored == "", f"ignored by .gitignore: {ignored}"


def test_a_new_json_under_results_would_not_be_ignored(in_git):
    # check-ignore exits 1 when the path is NOT ignored.
    proc = subprocess.run(["git", "check-ignore", "-q", "results/any/new.json"], cwd=ROOT)
    assert proc.returncode == 1


def test_no_result_is_untracked(in_git):
    untracked = git("ls-files", "--others", "--exclude-standard", "results")
    assert untracked == "", f"artifacts not committed: {untracked}"
