"""``vllm-omni-bench busy-cores``: the ``qwen3-tts-edge speak`` command beside other work.

Benchmarks run on quiet hosts; users do not. This one runs the speak command as users run it,
each utterance a fresh process, beside the fixed loads of ``vllm_omni.bench.competing_load``
(idle, one busy loop, a PyTorch matmul loop, two busy loops), in several thread settings:

- ``default``: the engine as it ships, on the cores other work leaves free
  (``vllm_omni.cpu.free_cores``);
- ``fixed``: ``--fixed-threads``, every usable core whatever else runs (the behaviour before);
- ``t1``: ``--threads 1``;
- ``passive`` and ``spin1k``: ``--fixed-threads`` with OpenMP's waits changed for the process
  (``OMP_WAIT_POLICY=passive``; ``GOMP_SPINCOUNT=1000``), the alternatives measured against
  fitting the threads.

Loads, settings and repeats are interleaved (each repeat starts every load in turn and runs
every setting beside it), so each ratio compares runs made minutes apart at most. A run that
passes ``--timeout`` is recorded as such, never dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, folder_path, nonnegative_int, parse_list, positive_int, positive_number,
    write_measured,
)

TEXT = "Hello! This short sentence is spoken on two CPU cores, one frame at a time."
SPEAKER, LANGUAGE = "ryan", "english"
LOADS = ("idle", "spin", "torch", "spin+spin")
# key: (label, speak arguments, environment)
SETTINGS = {
    "default": ("default (threads fitted to the free cores)", [], {}),
    "fixed": ("--fixed-threads (before)", ["--fixed-threads"], {}),
    "t1": ("--threads 1", ["--threads", "1"], {}),
    "passive": ("--fixed-threads, OMP_WAIT_POLICY=passive", ["--fixed-threads"], {"OMP_WAIT_POLICY": "passive"}),
    "spin1k": ("--fixed-threads, GOMP_SPINCOUNT=1000", ["--fixed-threads"], {"GOMP_SPINCOUNT": "1000"}),
}
OMP_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")  # never inherited: each setting states its own


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("busy-cores", help="the speak command beside other work: idle, one busy core, two, "
                                          "in several thread settings")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None, help="a checkpoint directory (default: as speak)")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated loads (default {','.join(LOADS)})")
    p.add_argument("--settings", default=",".join(SETTINGS),
                   help=f"comma-separated thread settings (default {','.join(SETTINGS)})")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per utterance (default 24; quick 3)")
    p.add_argument("--repeats", type=positive_int, default=None, help="runs per load and setting (default 3; quick 1)")
    p.add_argument("--timeout", type=positive_number, default=300.0, help="seconds a run may take (default 300)")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint and a few frames: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_name(p, "end-to-end", "busy-cores-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def speak_command(model_dir: Path, weights: str, frames: int, out: Path, setting: str) -> list[str]:
    """The speak command of one run (its figures written to ``out``.json)."""
    exe = Path(sys.executable).parent / "qwen3-tts-edge"
    return [str(exe), "speak", "--model", str(model_dir), "--text", TEXT, "--speaker", SPEAKER,
            "--language", LANGUAGE, "--weights", weights, "--max-frames", str(frames), "--out", str(out),
            "--quiet", "--stats-json", str(out.with_suffix(".json")), *SETTINGS[setting][1]]


def speak_once(model_dir: Path, weights: str, frames: int, setting: str, timeout_s: float) -> dict | None:
    """One run of the speak command in ``setting``: its figures (``speak --stats-json``), or None when it
    ran past ``timeout_s``; a BenchError when it failed."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_ENV}
    env.update(SETTINGS[setting][2])
    with tempfile.TemporaryDirectory(prefix="vo-busy-") as tmp:
        out = Path(tmp) / "speech.wav"
        try:
            proc = subprocess.run(speak_command(model_dir, weights, frames, out, setting), env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if proc.returncode != 0:
            raise BenchError(f"speak ({setting}) failed with exit status {proc.returncode}: {proc.stderr[-1500:]}")
        return json.loads(out.with_suffix(".json").read_text())


def _threads_used(runs: list[dict]) -> str:
    """The thread counts the frames of ``runs`` ran on: "2", "1", or "1-2" when they moved."""
    counts = sorted({t for r in runs for t in r["threads"]})
    return "-".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts)) if counts else "?"


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def run(args: argparse.Namespace) -> int:
    from vllm_omni.bench import competing_load
    from vllm_omni.bench.speak import checkpoint_note, random_checkpoint
    from vllm_omni.results.provenance import usable_cpus
    from vllm_omni.tts.config import load_config

    loads = parse_list(args.loads, LOADS, "loads")
    settings = parse_list(args.settings, tuple(SETTINGS), "settings")
    frames = args.frames or (3 if args.quick else 24)
    repeats = args.repeats or (1 if args.quick else 3)
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    try:
        cfg = load_config(model_dir)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    speak_once(model_dir, args.weights, 2, "default", args.timeout)  # packs and caches the weights: not timed
    runs: dict[tuple[str, str], list[dict | None]] = {(lo, s): [] for lo in loads for s in settings}
    started = time.perf_counter()
    for _ in range(repeats):
        for load in loads:
            with competing_load.running(load):
                for setting in settings:
                    runs[(load, setting)].append(speak_once(model_dir, args.weights, frames, setting, args.timeout))
    wall_s = time.perf_counter() - started

    def rtf(load: str, setting: str) -> float | None:
        done = [r["rtf"] for r in runs.get((load, setting), []) if r is not None]
        return _median(done) if done and len(done) == len(runs[(load, setting)]) else None

    rows = []
    for load in loads:
        for setting in settings:
            done = [r for r in runs[(load, setting)] if r is not None]
            rtfs, firsts = [r["rtf"] for r in done], [r["first_audio_s"] * 1e3 for r in done if r["first_audio_s"]]
            one = rtf(load, "t1")
            mine = rtf(load, setting)
            rows.append([competing_load.describe(load), SETTINGS[setting][0], len(runs[(load, setting)]),
                         len(runs[(load, setting)]) - len(done), _threads_used(done) if done else None,
                         mine, round(min(rtfs), 4) if rtfs else None, round(max(rtfs), 4) if rtfs else None,
                         _median(firsts), None if one is None or mine is None else round(mine / one, 3)])
    targets = {}
    for load in ("spin", "torch"):
        if (load, "default") in runs and rtf(load, "t1") and rtf(load, "default"):
            targets[f"{load}: default over 1 thread"] = round(rtf(load, "default") / rtf(load, "t1"), 3)
    if rtf("spin+spin", "default") and rtf("idle", "t1"):
        targets["spin+spin: default over idle 1 thread"] = round(rtf("spin+spin", "default") / rtf("idle", "t1"), 3)
    if rtf("idle", "default") and rtf("idle", "fixed"):
        targets["idle: default over fixed"] = round(rtf("idle", "default") / rtf("idle", "fixed"), 3)
    write_measured(
        args,
        artifact_id=f"end-to-end/busy-cores-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"The speak command beside other work ({cfg.family}, {args.weights}, {usable_cpus()} usable CPUs)",
        columns=[
            {"name": "other work", "unit": None, "type": "text"},
            {"name": "threads setting", "unit": None, "type": "text"},
            {"name": "runs", "unit": None, "type": "number", "format": ".0f"},
            {"name": "timed out", "unit": None, "type": "number", "format": ".0f"},
            {"name": "threads used", "unit": None, "type": "text"},
            {"name": "RTF", "unit": None, "type": "number", "format": ".2f"},
            {"name": "RTF min", "unit": None, "type": "number", "format": ".2f"},
            {"name": "RTF max", "unit": None, "type": "number", "format": ".2f"},
            {"name": "first audio", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF over 1 thread", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=rows, model=cfg.family, weights=checkpoint_note(args, model_dir), quantization=args.weights,
        threads=f"at most {usable_cpus()}", source="vllm-omni-bench busy-cores",
        compare={"tolerance": 0.25, "key_columns": ["other work", "threads setting"], "columns": ["RTF"]},
        run={"text": TEXT, "speaker": SPEAKER, "language": LANGUAGE, "frames_per_utterance": frames,
             "repeats": repeats, "timeout_s": args.timeout, "wall_s": round(wall_s, 1),
             "loads": {lo: competing_load.describe(lo) for lo in loads},
             "settings": {s: {"arguments": SETTINGS[s][1], "environment": SETTINGS[s][2]} for s in settings},
             "speak_command": speak_command(model_dir, args.weights, frames, Path("OUT.wav"), "default")[1:],
             "targets": targets,
             "runs": {f"{lo} / {s}": runs[(lo, s)] for lo in loads for s in settings}},
        notes=("Each run is a fresh `qwen3-tts-edge speak` process (run.speak_command plus the setting's arguments and "
               "environment), its figures from its --stats-json: RTF is the utterance's wall time over its audio "
               "time (prompt and prefill included, loading not), first audio from the request to the first decoded "
               "chunk. Rows give the median over the runs, RTF min and max, and the thread counts the frames ran on. "
               "RTF over 1 thread: the row's median RTF over that of --threads 1 beside the same load, in the same "
               "run. Loads (vllm_omni.bench.competing_load) run as separate processes, started before the settings "
               "of a repeat and stopped after them; repeats, loads and settings are interleaved. A run past "
               "run.timeout_s counts as timed out and has no RTF; a row with one has no median. Random weights of "
               "the published shapes: every utterance is cut at run.frames_per_utterance frames.")
              + (" Quick mode: a shallow checkpoint and three frames, not a figure." if args.quick else ""),
    )
    return 0
