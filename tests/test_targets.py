"""The CPU-path scoreboard: which runs it reads, how it judges them, and its refusals."""

from __future__ import annotations

import pytest

from vllm_omni.bench import cli, targets
from vllm_omni.results.schema import ArtifactError
from vllm_omni.results import load
from vllm_omni.testing.results_tree import copy_results, edit_artifact

BOARD = load("cpu-path/targets")
NAMES = [c.name for c in BOARD.columns]


def rows(art_rows=None):
    return [dict(zip(NAMES, r)) for r in (BOARD.rows if art_rows is None else art_rows)]




def _faster_at_two_threads(data):
    """The fused 2-thread row of a predictor artifact, made to meet the pass target (1.25)."""
    for row in data["rows"]:
        if row[0] == "fused" and row[2] == 2:
            row[9] = 1.25  # pass / floor


def test_targets_is_a_registered_subcommand():
    assert "targets" in cli.SUBCOMMAND_MODULES


def test_every_fused_pass_at_one_and_two_threads_has_a_row():
    expected = set()
    for art_id in ("cpu-path/predictor-both-int4-t1-2-zen1", "cpu-path/predictor-both-int4-t1-16-device-host",
                   "cpu-path/predictor-fused-fp32-t1-2-device-host"):
        art = load(art_id)
        impl, threads = art.column_index("impl"), art.column_index("threads")
        expected |= {(art_id, r[threads]) for r in art.rows if r[impl] == "fused" and r[threads] <= 2}
    found = {(r["artifact"], r["threads"]) for r in rows() if r["target"] == targets.PASS_TARGET}
    assert expected <= found
    # the 16-thread sweep contributes its 1- and 2-thread rows only
    assert {t for a, t in found if a.endswith("t1-16-device-host")} == {1, 2}


def test_pass_rows_copy_the_run_and_judge_it():
    art = load("cpu-path/predictor-both-int8-t1-2-zen1")
    src = {(r[0], r[2]): dict(zip([c.name for c in art.columns], r)) for r in art.rows}
    for r in rows():
        if r["artifact"] != art.id:
            continue
        fused, eager = src[("fused", r["threads"])], src[("reference", r["threads"])]
        assert r["measured"] == fused["pass / floor"]
        assert r["met"] == ("yes" if fused["pass / floor"] <= 1.3 else "no")
        assert r["eager / fused"] == pytest.approx(eager["pass median"] / fused["pass median"], abs=0.006)
        assert r["peak memory"] == art.provenance["run"]["peak_rss_mib"]
        assert r["kernels"] == "AVX2" and r["host"].startswith("AMD EPYC (family 23, model 1), AVX2")


def test_the_core_clock_is_copied_where_the_run_recorded_it():
    for art_id in ("cpu-path/predictor-both-int4-t1-2-zen1-run3", "cpu-path/frame-fused-int4-t2-zen1-run3",
                   "cpu-path/predictor-both-int4-t1-2-zen1"):
        clock = load(art_id).provenance["run"].get("core_clock_ghz") or {}
        mine = [r for r in rows() if r["artifact"] == art_id]
        assert mine
        for r in mine:
            assert r["clock at start"] == (round(clock["start"], 2) if clock else None)
            assert r["clock at end"] == (round(clock["end"], 2) if clock else None)


def test_frames_give_an_rtf_and_a_sampler_row_each():
    frame = load("cpu-path/frame-fused-int4-t2-zen1")
    median = dict((r[0], r[1]) for r in frame.rows)
    mine = {r["target"]: r for r in rows() if r["artifact"] == frame.id}
    assert mine[targets.RTF_TARGET]["measured"] == pytest.approx(median["total"] / 80, abs=5e-4)
    assert mine[targets.SAMPLER_TARGET]["measured"] == pytest.approx(100 * median["sampler"] / median["total"], abs=5e-3)
    # frames at other thread counts, the eager frame, and the larger model are outside the frame target
    outside = {"cpu-path/frame-fused-int4-t8-device-host", "cpu-path/frame-reference-fp32-t2",
               "cpu-path/frame-fused-int4-t2-1.7b-zen1"}
    assert load("cpu-path/frame-fused-int4-t2-1.7b-zen1").provenance["model"] == "Qwen3-TTS-12Hz-1.7B"
    assert not outside & {r["artifact"] for r in rows()}


def test_a_faster_run_flips_its_verdict(tmp_path):
    root = copy_results(tmp_path)
    art_id = "cpu-path/predictor-both-int4-t1-2-zen1"

    edit_artifact(root, art_id, _faster_at_two_threads)
    board = {(r["artifact"], r["threads"], r["target"]): r for r in rows(targets.scoreboard(root))}
    assert board[(art_id, 2, targets.PASS_TARGET)]["met"] == "yes"
    assert board[(art_id, 1, targets.PASS_TARGET)]["met"] == "no"


def test_a_run_without_its_peak_memory_is_refused(tmp_path):
    root = copy_results(tmp_path)
    edit_artifact(root, "cpu-path/frame-fused-int4-t2-zen1", lambda d: d["provenance"]["run"].pop("peak_rss_mib"))
    with pytest.raises(ArtifactError, match=r"frame-fused-int4-t2-zen1.json: provenance.run.peak_rss_mib: missing"):
        targets.scoreboard(root)


@pytest.mark.parametrize(("host", "label"), [
    ({"cpu": "AMD EPYC", "cpu_id": "family 23, model 1, stepping 2", "isa": ["avx2"], "cores_total": 2},
     "AMD EPYC (family 23, model 1), AVX2, 2 cores"),
    ({"cpu": "AMD EPYC", "isa": ["avx2", "avx512f"], "cores_total": 2}, "AMD EPYC, AVX-512, 2 cores"),
    ({"cpu": "Intel(R) Xeon(R) Processor", "cpu_id": "family 6, model 207, stepping 2", "isa": ["avx512f"]},
     "Intel Xeon Processor (family 6, model 207), AVX-512"),
])
def test_host_label_says_only_what_the_artifact_records(host, label):
    assert targets.host_label(host) == label


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch, capsys):
    """`vllm-omni-bench targets --no-write | head -1`: the reader stops early, no traceback."""
    import io
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone
    with capsys.disabled():
        out = io.TextIOWrapper(os.fdopen(write_end, "wb"), line_buffering=True)
        monkeypatch.setattr("sys.stdout", out)
        assert cli.main(["targets", "--no-write"]) == 141
        out.write("after\n")  # stdout now leads nowhere, quietly
        out.close()


@pytest.mark.parametrize("command", ["predictor", "frame", "talker", "sampler", "bandwidth", "gemv", "quality"])
def test_every_cpu_path_benchmark_takes_a_name(command):
    """A second run, or a run on another host, is kept beside the committed one under its own name."""
    args = cli.build_parser().parse_args([command, "--name", "x-other-host"])
    assert args.name == "x-other-host"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--name", "../escape"])


def test_round_trips_are_those_of_the_rows_thread_count(tmp_path):
    root = copy_results(tmp_path)
    pred, frame = "cpu-path/predictor-both-int4-t1-2-zen1", "cpu-path/frame-fused-int4-t2-zen1"
    edit_artifact(root, pred, lambda d: d["provenance"]["run"].update(core_round_trip_ns={"2": [[58.0, 331.5], [60.0, 62.0]]}))
    edit_artifact(root, frame, lambda d: d["provenance"]["run"].update(
        core_round_trip_ns={"frames_start": 55.0, "frames_end": 340.0, "probes_end": None}))
    board = {(r["artifact"], r["threads"], r["target"]): r for r in rows(targets.scoreboard(root))}
    two, one = board[(pred, 2, targets.PASS_TARGET)], board[(pred, 1, targets.PASS_TARGET)]
    assert (two["round trip min"], two["round trip max"]) == (58.0, 331.5)
    assert (one["round trip min"], one["round trip max"]) == (None, None)  # one thread: no pair of cores
    for target in (targets.RTF_TARGET, targets.SAMPLER_TARGET):
        r = board[(frame, 2, target)]
        assert (r["round trip min"], r["round trip max"]) == (55.0, 340.0)


SUMMARY = load("cpu-path/targets-summary")


def test_the_summary_counts_every_scoreboard_row_once():
    names = [c.name for c in SUMMARY.columns]
    groups = [dict(zip(names, r)) for r in SUMMARY.rows]
    assert sum(g["runs"] for g in groups) == len(BOARD.rows)
    for g in groups:
        mine = [r for r in rows() if all(r[k] == g[k] for k in targets.GROUP)]
        figures = sorted(r["measured"] for r in mine)
        assert g["runs"] == len(mine) and g["runs met"] == sum(r["met"] == "yes" for r in mine)
        assert (g["best"], g["worst"]) == (figures[0], figures[-1])
        assert g["best"] <= g["median"] <= g["worst"] and g["limit"] == mine[0]["limit"]
    assert len({tuple(g[k] for k in targets.GROUP) for g in groups}) == len(groups)


def test_the_summary_follows_a_flipped_verdict(tmp_path):
    root = copy_results(tmp_path)
    art_id = "cpu-path/predictor-both-int4-t1-2-zen1"

    key = ("AMD EPYC (family 23, model 1), AVX2, 2 cores", "AVX2", targets.PASS_TARGET, "int4", 2)
    names = [c["name"] for c in targets.SUMMARY_COLUMNS]

    def group(board):
        (g,) = [dict(zip(names, r)) for r in targets.summary(board) if tuple(r[:5]) == key]
        return g

    before = group(targets.scoreboard(root))
    edit_artifact(root, art_id, _faster_at_two_threads)
    after = group(targets.scoreboard(root))
    assert (after["runs"], after["runs met"]) == (before["runs"], before["runs met"] + 1)
    assert after["best"] == 1.25 < before["best"]


def test_clock_readings_no_core_runs_at_are_marked_invalid():
    """The probe error of the 2-core Xeon's first runs (about 14 GHz) is marked in the scoreboard
    itself; every other recorded clock is left unmarked."""
    clocked = [r for r in rows() if r["clock at start"] is not None]
    bad = [r for r in clocked if max(r["clock at start"], r["clock at end"]) > targets.CLOCK_MAX_GHZ]
    assert bad and all(r["clock note"] == targets.CLOCK_INVALID for r in bad)
    assert {r["commit"] for r in bad} == {"70ede71"}
    assert all(r["clock note"] is None for r in rows() if r not in bad)
    assert all(13 < r[k] < 15 for r in bad for k in ("clock at start", "clock at end"))


def test_a_clock_reading_above_the_bound_is_marked_on_any_run(tmp_path):
    root = copy_results(tmp_path)
    art_id = "cpu-path/predictor-both-int8-t1-2-zen1"
    edit_artifact(root, art_id, lambda d: d["provenance"]["run"].update(core_clock_ghz={"start": 2.1, "end": 9.0}))
    board = [r for r in rows(targets.scoreboard(root)) if r["artifact"] == art_id]
    assert board and all(r["clock note"] == targets.CLOCK_INVALID and r["clock at end"] == 9.0 for r in board)
