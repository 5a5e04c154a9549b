"""Malformed artifacts fail loudly, naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm_omni.results import ArtifactError, load_all, load_file, markdown_table, to_frame, validate, write

FIXTURES = Path(__file__).parent / "fixtures"

# fixture name -> the field the error must name
BAD = {
    "missing-provenance": "provenance",
    "missing-provenance-host": "provenance.host",
    "wrong-type-title": "title",
    "wrong-type-memory": "provenance.host.memory_gib",
    "wrong-type-cpu-id": "provenance.host.cpu_id",
    "unknown-origin": "origin",
    "row-length": "rows[2]",
    "non-number": "rows[2][1] (ms)",
    "bad-date": "provenance.date",
    "unknown-field": "comment",
    "measured-without-command": "provenance.command",
    "measured-without-peak-memory": "provenance.run.peak_rss_mib",
    "steal-share-out-of-range": "provenance.run.host_steal_share",
    "core-clock-not-positive": "provenance.run.core_clock_ghz.end",
    "core-clock-not-start-and-end": "provenance.run.core_clock_ghz",
    "round-trip-not-positive": "provenance.run.core_round_trip_ns.2[1][1]",
    "bad-column-type": "columns[1].type",
    "bad-column-digits": "columns[1].digits",
    "column-digits-and-format": "columns[1].digits",
    "invalid-json": "(json)",
}


@pytest.mark.parametrize("name,field", sorted(BAD.items()))
def test_bad_artifact_names_file_and_field(name, field):
    path = FIXTURES / "bad" / f"{name}.json"
    with pytest.raises(ArtifactError) as info:
        load_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {field}:"), message
    assert info.value.field == field


def test_every_bad_fixture_is_covered():
    assert {p.stem for p in (FIXTURES / "bad").glob("*.json")} == set(BAD)


def test_good_fixture_loads_and_renders():
    art = load_file(FIXTURES / "good" / "good.json")
    assert art.value("predictor", "ms") == 97.1
    table = markdown_table(art)
    assert table.splitlines()[0] == "| component | ms (ms) |"
    assert "| predictor | 97.1 |" in table
    df = to_frame(art)
    assert list(df["ms"]) == [97.1, 25.4]
    assert df.attrs["units"] == {"component": None, "ms": "ms"}


def test_duplicate_id_is_refused(tmp_path):
    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    good["id"] = "area/one"
    root = tmp_path / "results"
    write(good, root)
    # Same id in a file at another place: the id check against the path catches it first.
    (root / "area" / "two.json").write_text(json.dumps(good))
    with pytest.raises(ArtifactError, match=r"two\.json: id: 'area/one' does not match"):
        load_all(root)


def test_duplicate_id_outside_results_tree(tmp_path):
    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(good))
    with pytest.raises(ArtifactError, match="duplicate id 'fixture/good'"):
        load_all(tmp_path)


def test_write_refuses_invalid(tmp_path):
    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    good["rows"][0][1] = "fast"
    with pytest.raises(ArtifactError, match=r"rows\[0\]\[1\]"):
        write(good, tmp_path / "results")
    assert not list(tmp_path.rglob("*.json"))


def test_unknown_id_lists_known(tmp_path):
    from vllm_omni.results import load

    with pytest.raises(ArtifactError, match="no artifact 'nope/nothing'"):
        load("nope/nothing", root=tmp_path)


def test_unknown_id_is_named_with_its_area_or_the_areas(tmp_path):
    from vllm_omni.results import load

    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    write(good, tmp_path)
    with pytest.raises(ArtifactError, match="no artifact 'fixture/nope'; known: fixture/good$"):
        load("fixture/nope", root=tmp_path)
    with pytest.raises(ArtifactError, match="none in other/; areas: fixture$"):
        load("other/nope", root=tmp_path)
    with pytest.raises(ArtifactError, match=r"no results folder here"):
        load("fixture/good", root=tmp_path / "missing")


def test_write_all_writes_every_artifact_or_none(tmp_path):
    """One path that cannot be written stops the whole set before any file is written, and no
    temporary file stays behind."""
    from vllm_omni.results.store import write_all

    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    other = {**good, "id": "fixture/other"}
    (tmp_path / "fixture" / "other.json").mkdir(parents=True)  # a folder where a file must go
    with pytest.raises(ArtifactError, match=r"other\.json: \(file\): cannot write: is there and is not a file"):
        write_all([good, other], tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # good.json neither, nor a .tmp
    paths = write_all([good, {**good, "id": "fixture/third"}], tmp_path / "fresh")
    assert [p.name for p in paths] == ["good.json", "third.json"] and all(p.is_file() for p in paths)


def test_numbers_json_cannot_hold_are_refused_both_ways(tmp_path):
    good = json.loads((FIXTURES / "good" / "good.json").read_text())
    good["rows"][0][1] = float("inf")
    with pytest.raises(ArtifactError, match=r"good\.json: \(json\): a number is NaN or infinite"):
        write(good, tmp_path)
    assert not list(tmp_path.rglob("*"))
    (tmp_path / "inf.json").write_text((FIXTURES / "good" / "good.json").read_text().replace("97.1", "Infinity"))
    with pytest.raises(ArtifactError, match=r"inf\.json: \(json\): Infinity is not a JSON number"):
        load_file(tmp_path / "inf.json")


def test_a_file_that_is_not_text_is_named(tmp_path):
    (tmp_path / "blob.json").write_bytes(b"\xb6\x00\xff")
    with pytest.raises(ArtifactError, match=r"blob\.json: \(file\): not UTF-8 text"):
        load_file(tmp_path / "blob.json")


def test_committed_artifacts_are_valid():
    arts = load_all()
    assert arts, "results/ holds no artifacts"
    for art in arts.values():
        validate(art.raw, art.path)


def test_hook_aborts_build_on_malformed_artifact(tmp_path):
    """A broken file anywhere under results/ stops the build, naming it."""
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    from vllm_omni.results import mkdocs_hook

    (tmp_path / "results" / "x").mkdir(parents=True)
    shutil.copy(FIXTURES / "bad" / "non-number.json", tmp_path / "results" / "x" / "broken.json")

    class Config:
        config_file_path = str(tmp_path / "mkdocs.yml")

    with pytest.raises(PluginError, match=r"results/x/broken\.json: id|results/x/broken\.json: rows"):
        mkdocs_hook.on_config(Config())
