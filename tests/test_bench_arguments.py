"""Every numeric flag of every `vllm-omni-bench` subcommand refuses a bad value before anything
runs: counts below 1, seeds and positions below 0, more threads than the process's CPUs, and a
duration that is not above 0."""

from __future__ import annotations

import argparse

import pytest

from vllm_omni.bench import cli
from vllm_omni.bench.common import cpu_threads, nonnegative_int, positive_int, positive_number
from vllm_omni.results import provenance

USABLE = provenance.usable_cpus()
VALIDATORS = {positive_int: ("0", "must be at least 1, got 0"),
              nonnegative_int: ("-1", "must be at least 0, got -1"),
              cpu_threads: (str(USABLE + 1), f"more than the {USABLE} CPUs this process may run on"),
              positive_number: ("0", "must be a finite number above 0, got 0")}
NOT_A_NUMBER = {positive_number: "expected a number, got 'two'"}  # the others: "expected a whole number"
# float flags checked after parsing, each with its own message (tests/test_compare.py, tests/test_projection.py)
CHECKED_LATER = {("compare", "--tolerance"), ("project", "--bandwidth-gbs"), ("project", "--host-ms")}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def _numeric_flags():
    for command, parser in sorted(_subparsers().items()):
        for action in parser._actions:
            if action.type in (int, float) or action.type in VALIDATORS:
                yield command, action


def test_no_numeric_flag_takes_a_bare_int():
    bare = [f"{command} {action.option_strings[0]}" for command, action in _numeric_flags() if action.type is int]
    assert not bare, f"use positive_int, nonnegative_int or cpu_threads from bench.common: {bare}"


def test_every_bare_float_flag_is_checked_after_parsing():
    bare = {(command, action.option_strings[0]) for command, action in _numeric_flags() if action.type is float}
    assert bare == CHECKED_LATER


def test_the_threads_flags_are_bounded_by_the_cpus():
    flags = {(c, a.option_strings[0]) for c, a in _numeric_flags() if a.type is cpu_threads}
    assert ("predictor", "--threads") in flags and ("bandwidth", "--threads") in flags
    assert all(flag in ("--threads", "--stage2-threads") for _, flag in flags)


@pytest.mark.parametrize("command,flag", [(c, a.option_strings[0]) for c, a in _numeric_flags() if a.type in VALIDATORS])
def test_a_bad_value_is_refused_before_anything_runs(command, flag, tmp_path, capsys):
    action = next(a for a in _subparsers()[command]._actions if flag in a.option_strings)
    bad, message = VALIDATORS[action.type]
    values = action.nargs if isinstance(action.nargs, int) else 1
    with pytest.raises(SystemExit) as info:
        cli.main([command, flag, *[bad] * values, "--output", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and message in err
    with pytest.raises(SystemExit):
        cli.main([command, flag, *["two"] * values, "--output", str(tmp_path)])
    assert NOT_A_NUMBER.get(action.type, "expected a whole number, got 'two'") in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_validators_accept_their_bounds():
    assert positive_int("1") == 1 and nonnegative_int("0") == 0 and cpu_threads(str(USABLE)) == USABLE
    assert positive_number("0.5") == 0.5
    for bad in ("inf", "nan", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_number(bad)


def test_thread_counts_are_bounded_by_the_cpus(tmp_path, capsys):
    assert cli.main(["predictor", "--quick", "--thread-counts", f"1,{USABLE + 1}", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--thread-counts '1,{USABLE + 1}'" in err and f"more than the {USABLE} CPUs" in err
    assert cli.main(["predictor", "--quick", "--thread-counts", "1,0", "--output", str(tmp_path)]) == 2
    assert "must be at least 1, got 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "message"), [
    (["--impl", "both", "--weights", "bf16"], "the fused predictor supports --weights fp32, int8, int4, not bf16; "
                                              "--impl reference times the eager predictor alone"),
    (["--impl", "reference", "--variant", "avx2"], "--variant picks a build of the fused kernels"),
    (["--threads", "1", "--thread-counts", "1"], "give --threads or --thread-counts, not both"),
])
def test_predictor_refuses_options_it_would_ignore(argv, message, tmp_path, capsys):
    """An option the run could not honour stops it, instead of a run named for what it did not do."""
    assert cli.main(["predictor", "--quick", *argv, "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["--output", "VLLM_OMNI_RESULTS_DIR"])
def test_a_results_folder_that_cannot_be_written_stops_the_run_before_it_measures(where, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    argv = ["predictor", "--quick", "--threads", "1"]
    if where == "--output":
        argv += ["--output", str(blocker / "below")]
    else:
        monkeypatch.setenv("VLLM_OMNI_RESULTS_DIR", str(blocker))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give a folder to write artifacts into" in err
    assert ("above it, is not a folder" if where == "--output" else "($VLLM_OMNI_RESULTS_DIR): not a folder") in err


def test_folders_and_names_are_checked_as_the_command_line_is_read(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x\n")
    for argv in (["engines", "--workdir", str(blocker)], ["llamacpp", "--workdir", str(blocker)],
                 ["vllm-two-engines", "--model-dir", str(blocker)], ["env", "--name", "a" * 201]):
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, "--output", str(tmp_path / "never")])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "not a folder" in err or "at most 200 characters" in err, err
    assert not (tmp_path / "never").exists()


def test_a_missing_compiler_is_one_line_for_every_command_that_builds_kernels(tmp_path):
    """Commands that build the native kernels say which compiler is missing, without a traceback."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CXX="no-such-cxx", VLLM_OMNI_NATIVE_DIR=str(tmp_path / "native"))
    for argv in (["bandwidth", "--quick", "--threads", "1"], ["sampler", "--quick", "--threads", "1"]):
        proc = subprocess.run([sys.executable, "-m", "vllm_omni.bench.cli", *argv, "--output", str(tmp_path / "out")],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "no-such-cxx" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_help_says_where_artifacts_go_and_how_to_write_elsewhere(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--output DIR, else $VLLM_OMNI_RESULTS_DIR, else the checkout's results/ folder, whose files are committed" in text
    assert 'VLLM_OMNI_RESULTS_DIR="$(mktemp -d)" vllm-omni-bench COMMAND' in text
    for name, sub in _subparsers().items():
        output = [a for a in sub._actions if "--output" in a.option_strings]
        if output:
            assert "whose files are committed" in output[0].help, name


@pytest.mark.parametrize("where", ["--output", "VLLM_OMNI_RESULTS_DIR", "default"])
def test_each_written_file_is_printed_with_the_setting_that_sent_it_there(where, tmp_path, monkeypatch, capsys):
    """`audit` writes two computed artifacts without measuring anything: each gets its line."""
    from vllm_omni.bench import common
    from vllm_omni.results import store

    monkeypatch.delenv("VLLM_OMNI_RESULTS_DIR", raising=False)
    argv = ["audit"]
    if where == "--output":
        argv += ["--output", str(tmp_path)]
    elif where == "VLLM_OMNI_RESULTS_DIR":
        monkeypatch.setenv("VLLM_OMNI_RESULTS_DIR", str(tmp_path))
    else:  # the default, the checkout's results/, stood in for by a scratch folder
        (tmp_path / "results").mkdir()
        monkeypatch.setattr(store, "default_results_dir", lambda: tmp_path / "results")
        assert common.written("x.json", None).endswith(
            "(the checkout's committed results/: pass --output DIR or set $VLLM_OMNI_RESULTS_DIR to write elsewhere)")
    assert cli.main(argv) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("wrote ")]
    folder = tmp_path / "results" if where == "default" else tmp_path
    assert [l.split()[1] for l in lines] == [str(folder / "audit" / "claims.json"), str(folder / "audit" / "verdicts.json")]
    label = {"--output": "(--output)", "VLLM_OMNI_RESULTS_DIR": "($VLLM_OMNI_RESULTS_DIR)",
             "default": "(the checkout's committed results/"}[where]
    assert all(label in l for l in lines)
