"""Every computed artifact is exactly what its own command writes today.

A computed artifact is derived by the package (the projection, the claims audit, the targets
scoreboard); its provenance names the command. Rerunning that command into a scratch folder
must reproduce the committed file, apart from the date, or the file is stale.
"""

from __future__ import annotations

import json
import shlex

import pytest

from vllm_omni.bench import cli
from vllm_omni.results import load_all

COMPUTED = sorted(art_id for art_id, art in load_all().items() if art.origin == "computed")


def _without_date(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    data["provenance"].pop("date")
    return data


def test_the_computed_artifacts_are_found():
    areas = {art_id.split("/")[0] for art_id in COMPUTED}
    assert {"audit", "cpu-path", "device-simulation"} <= areas


def _tools_missing(artifact_id: str) -> str | None:
    """Why an artifact computed from compiled code (arm/: llvm-mca on the kernels) cannot be recomputed here."""
    if artifact_id.startswith("arm/"):
        from vllm_omni.cpu.loop_analysis import tools_missing

        return tools_missing()
    return None


@pytest.mark.parametrize("artifact_id", COMPUTED)
def test_committed_computed_artifact_is_fresh(artifact_id, tmp_path, capsys):
    reason = _tools_missing(artifact_id)
    if reason:
        pytest.skip(reason)
    committed = load_all()[artifact_id]
    argv = shlex.split(committed.provenance["command"])
    assert argv[0] == "vllm-omni-bench", f"{artifact_id}: a computed artifact is written by vllm-omni-bench"
    assert cli.main([*argv[1:], "--output", str(tmp_path)]) == 0
    fresh = json.loads((tmp_path / f"{artifact_id}.json").read_text())
    assert _without_date(fresh) == _without_date(committed.raw), (
        f"{artifact_id} is stale: rerun `{committed.provenance['command']}`"
    )
