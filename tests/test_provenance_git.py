"""The git state a measured artifact records: a clean tree, and a dirty one named by its diff."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_omni.results import ArtifactError, validate
from vllm_omni.results.provenance import MAX_CHANGED_PATHS, git_state

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root,
                          check=True, capture_output=True).stdout


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "src.py").write_text("x = 1\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_clean_tree_records_the_sha_and_nothing_else(repo):
    state = git_state(repo)
    assert state == {"sha": git(repo, "rev-parse", "HEAD").decode().strip(), "dirty": False}


def test_changed_results_alone_leave_the_tree_clean(repo):
    (repo / "results" / "a.json").write_text('{"new": 1}\n')
    (repo / "results" / "b.json").write_text("{}\n")
    assert git_state(repo)["dirty"] is False


def test_a_dirty_tree_records_the_hash_of_its_diff_and_the_changed_paths(repo):
    (repo / "src.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 1\n")
    (repo / "results" / "a.json").write_text('{"new": 1}\n')  # results/ stays out of both
    state = git_state(repo)
    diff = git(repo, "diff", "--binary", "HEAD", "--", ".", ":(exclude)results")
    assert b"x = 2" in diff and b"results" not in diff
    assert state["dirty"] is True and state["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert state["changed"] == [" M src.py", "?? new.py"]
    # another diff, another hash; the same diff again, the same hash
    (repo / "src.py").write_text("x = 3\n")
    other = git_state(repo)
    assert other["diff_sha256"] != state["diff_sha256"]
    (repo / "src.py").write_text("x = 2\n")
    assert git_state(repo) == state


def test_a_long_list_of_changes_is_cut_and_counted(repo):
    for i in range(MAX_CHANGED_PATHS + 3):
        (repo / f"u{i:03d}.txt").write_text("u\n")
    changed = git_state(repo)["changed"]
    assert len(changed) == MAX_CHANGED_PATHS + 1 and changed[-1] == "... and 3 more"


def test_outside_a_repository_nothing_is_guessed(tmp_path):
    assert git_state(tmp_path) == {"sha": None, "dirty": None}


def _with_repo(repo: dict) -> dict:
    data = json.loads((FIXTURES / "good" / "good.json").read_text())
    data = copy.deepcopy(data)
    data["provenance"]["repo"] = repo
    return data


def test_the_schema_takes_the_diff_fields_of_a_dirty_tree_only():
    validate(_with_repo({"sha": "a" * 40, "dirty": True, "diff_sha256": "0" * 64, "changed": [" M x.py"]}))
    validate(_with_repo({"sha": "a" * 40, "dirty": True}))  # recorded before the fields existed
    with pytest.raises(ArtifactError, match="provenance.repo: diff_sha256 and changed describe a dirty tree"):
        validate(_with_repo({"sha": "a" * 40, "dirty": False, "diff_sha256": "0" * 64}))
    with pytest.raises(ArtifactError, match="provenance.repo.diff_sha256: expected 64 lowercase hex digits"):
        validate(_with_repo({"sha": "a" * 40, "dirty": True, "diff_sha256": "abc"}))
    with pytest.raises(ArtifactError, match="provenance.repo.changed: expected a list of strings"):
        validate(_with_repo({"sha": "a" * 40, "dirty": True, "changed": " M x.py"}))
