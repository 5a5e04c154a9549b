"""The projection reproduces the study's §4 table from its own inputs, and its computed
artifacts are committed (whether they are what their command writes today:
tests/test_computed_artifacts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni.bench import cli
from vllm_omni.projection import (
    DEVICES,
    STUDY_INPUTS,
    custom_device,
    get_device,
    project_bytes,
    project_spec,
    project_study_inputs,
)
from vllm_omni.results import load, load_all, published_results_dir

AREA = "device-simulation"
STUDY = load(f"{AREA}/projection-study")
COMPUTED = sorted(
    a.id for a in load_all().values() if a.id.startswith(AREA + "/") and a.origin == "computed"
)
NAME_TO_KEY = {d.name: k for k, d in DEVICES.items()}


def test_study_inputs_are_its_stated_figures():
    inputs = load(f"{AREA}/study-frame-inputs")
    assert STUDY_INPUTS["talker_bytes"] / 1e9 == inputs.value("talker, once per frame", "bytes")
    assert STUDY_INPUTS["predictor_bytes"] / 1e9 == inputs.value("predictor, 15 passes", "bytes")


@pytest.mark.parametrize("row", STUDY.rows, ids=[r[0] for r in STUDY.rows])
def test_reproduces_study_table_from_study_inputs(row):
    name = row[0]
    p = project_study_inputs(NAME_TO_KEY[name])
    assert p.device.bandwidth_gbs == STUDY.value(name, "bandwidth")
    assert p.host_ms == STUDY.value(name, "host work")
    assert p.streaming_ms == pytest.approx(STUDY.value(name, "weight streaming"), rel=0.02)
    if STUDY.value(name, "basis") == "projected":
        # the study rounds to whole ms and two-digit RTFs ("≈26", "≈0.33")
        assert p.ms_per_frame == pytest.approx(STUDY.value(name, "ms/frame"), abs=0.6)
        assert p.rtf == pytest.approx(STUDY.value(name, "RTF"), abs=0.015)
    else:
        # measured H200 frame: the bandwidth + host floor must sit below it
        assert p.ms_per_frame < STUDY.value(name, "ms/frame")


def test_spec_bytes_are_smaller_than_the_study_inputs():
    spec, study = project_spec("orin_agx_64g"), project_study_inputs("orin_agx_64g")
    assert round(spec.total_bytes / 1e9, 2) == 3.31
    assert study.total_bytes == 3.6e9
    assert spec.predictor_bytes == pytest.approx(study.predictor_bytes, rel=0.01)  # 2.42 vs 2.4 GB
    assert spec.talker_bytes < 0.75 * study.talker_bytes  # 0.887 vs 1.2 GB: the difference
    assert spec.streaming_ms == pytest.approx(16.16, abs=0.01)


def test_only_the_nominal_size_matches_the_studys_talker_figure():
    rows = load(f"{AREA}/talker-bytes-0.6b").rows
    matching = [what for what, gb in rows if abs(gb - 1.2) < 0.05]
    assert matching == ["0.6e9 parameters (the size in the model's name) x 2 B"]


def test_int4_cuts_streaming_about_three_and_a_half_times():
    bf16, int4 = project_spec("orin_nx_16g", "0.6B", "bf16"), project_spec("orin_nx_16g", "0.6B", "int4")
    assert 3.4 < bf16.streaming_ms / int4.streaming_ms < 3.7
    assert project_spec("thor", "1.7B", "bf16").other_bytes == 62_945_280


def test_rtf_is_ms_over_the_80ms_frame():
    p = project_bytes(custom_device(100.0, host_ms=0.0), 4e9, 4e9)
    assert p.streaming_ms == pytest.approx(80.0)
    assert p.rtf == pytest.approx(1.0)
    assert p.realtime_bandwidth_gbs == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: get_device("orin_nano"), "valid: h200, orin_agx_64g, orin_nx_16g, thor"),
        (lambda: custom_device(-1.0), "positive, finite number of GB/s"),
        (lambda: custom_device(0), "positive, finite number of GB/s"),
        (lambda: custom_device(float("inf")), "positive, finite number of GB/s"),
        (lambda: custom_device(100.0, host_ms=-2), "finite number of ms, zero or more"),
        (lambda: custom_device(100.0, host_ms=float("inf")), "finite number of ms, zero or more"),
        (lambda: project_spec("h200", "0.6B", "q4_0"), "valid: fp32, bf16, int8, int4"),
        (lambda: project_spec("h200", "3B", "bf16"), "valid: 0.6B, 1.7B"),
        (lambda: project_bytes("h200", -1, 0), "zero or more"),
    ],
)
def test_bad_input_raises_valueerror_with_choices(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "nope"], "valid: h200"),
        (["--bandwidth-gbs", "-5"], "positive, finite number"),
        (["--bandwidth-gbs", "inf"], "positive, finite number"),
        (["--weights", "q4"], "valid: fp32, bf16, int8, int4, all"),
        (["--model", "9B"], "valid: 0.6B, 1.7B"),
        (["--host-ms", "3"], "goes with --bandwidth-gbs"),
        (["--bandwidth-gbs", "68", "--host-ms", "-3"], "host work must be a finite number of ms, zero or more"),
        # options a table with inputs of its own would ignore
        (["--study-inputs", "--model", "1.7B"], "--study-inputs has inputs of its own and takes no --model"),
        (["--frame-bytes", "--weights", "int4", "--device", "h200"],
         "--frame-bytes has inputs of its own and takes no --weights, --device"),
    ],
)
def test_cli_reports_bad_input_on_one_line(argv, message, capsys, tmp_path):
    assert cli.main(["project", *argv, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vllm-omni-bench project: error:") and message in err
    assert "\n" not in err
    assert not any(tmp_path.iterdir())


def test_custom_device_never_overwrites_committed_ids(tmp_path, capsys):
    assert cli.main(["project", "--bandwidth-gbs", "68", "--host-ms", "10", "--output", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert written == [f"{AREA}/projection-spec-0.6b-bf16-custom.json"]
    data = json.loads((tmp_path / written[0]).read_text())
    assert data["provenance"]["command"] == "vllm-omni-bench project --model 0.6B --weights bf16 --bandwidth-gbs 68 --host-ms 10"
    assert data["rows"][0][-1] == pytest.approx((3.309813248 / 68 * 1e3 + 10) / 80, abs=1e-4)
    # the study's inputs on a custom device as well
    assert cli.main(["project", "--study-inputs", "--bandwidth-gbs", "68", "--output", str(tmp_path / "s")]) == 0
    written = sorted(p.relative_to(tmp_path / "s").as_posix() for p in (tmp_path / "s").rglob("*.json"))
    assert written == [f"{AREA}/projection-study-inputs-custom.json"]


def test_computed_artifacts_exist():
    expected = {f"{AREA}/projection-study-inputs", f"{AREA}/frame-bytes", f"{AREA}/talker-bytes-0.6b"}
    expected |= {f"{AREA}/projection-spec-{m}-{f}" for m in ("0.6b", "1.7b") for f in ("fp32", "bf16", "int8", "int4")}
    assert expected <= set(COMPUTED)


def test_project_is_a_registered_subcommand():
    assert "project" in cli.SUBCOMMAND_MODULES


def test_committed_files_are_under_results():
    assert (published_results_dir() / AREA / "projection-study.json").is_file()
    assert Path(load(f"{AREA}/projection-study").path).name == "projection-study.json"
