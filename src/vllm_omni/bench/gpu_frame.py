"""``vllm-omni-bench gpu-frame``: the model's own GPU work per frame under MPS SM caps.

The random-weight talker step and the predictor's 15-pass frame run on cuda:0 in bf16 with
static KV caches, eagerly and as CUDA graphs, once per SM cap. Each cap runs in its own child
process (``vllm_omni.gpu.child``), a client of one private MPS daemon (``vllm_omni.mps``),
with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in its environment before CUDA starts. The parent
never initialises CUDA: a probe child says which GPU there is, or that there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from vllm_omni import mps
from vllm_omni.bench.common import (
    BenchError, add_name, add_output, gpu_slug, named_id, nonnegative_int, positive_int, positive_number, written,
)
from vllm_omni.bench.talker import add_model_args, id_suffix, talker_layers
from vllm_omni.models import get_model

DEFAULT_CAPS = (100, 25, 12, 6)  # the study's sweep: all, ~33, ~16 (Orin AGX), ~8 (Orin NX) of 132 SMs
QUICK_CAPS = (100, 12)
MODE_LABELS = {"graph": "CUDA graph", "eager": "eager"}
CHILD_MODULE = "vllm_omni.gpu.child"


@dataclass(frozen=True)
class ChildRun:
    """One child process: ``cap`` is its SM percentage, or None for a plain process without MPS."""

    cap: int | None

    @property
    def setting(self) -> str:
        return "no MPS" if self.cap is None else f"{self.cap} % (MPS)"


def parse_caps(text: str) -> tuple[int, ...]:
    """``"100,25,12,6"`` -> (100, 25, 12, 6); each an integer percentage in 1..100, no repeats."""
    caps: list[int] = []
    for item in text.split(","):
        item = item.strip().rstrip("%").strip()
        if not item.isdigit() or not 1 <= int(item) <= 100:
            raise BenchError(f"--caps: {item!r} is not a percentage in 1..100 (e.g. --caps 100,25,12,6)")
        if int(item) in caps:
            raise BenchError(f"--caps: {item} % is listed twice")
        caps.append(int(item))
    return tuple(caps)


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODE_LABELS]
    if bad or not modes:
        raise BenchError(f"--modes: {bad[0] if bad else text!r} is not one of {', '.join(MODE_LABELS)}")
    return modes


def plan(caps: tuple[int, ...], use_mps: bool) -> list[ChildRun]:
    """The child processes to start, in order: one per cap under MPS, or a single plain one."""
    return [ChildRun(c) for c in caps] if use_mps else [ChildRun(None)]


def child_env(run: ChildRun, pipe_dir: Any, log_dir: Any, base: Mapping[str, str]) -> dict[str, str]:
    """A capped child talks to the daemon, sees its GPU as device 0 and carries its percentage;
    a plain child keeps the caller's environment as it is."""
    if run.cap is None:
        return dict(base)
    return mps.client_env(pipe_dir, log_dir, run.cap, base)


def child_command(config: Mapping[str, Any]) -> list[str]:
    return [sys.executable, "-m", CHILD_MODULE, json.dumps(dict(config), sort_keys=True)]


def child_config(args: argparse.Namespace) -> dict[str, Any]:
    layers = talker_layers(args)
    return {
        "model": args.model, "layers": layers, "dtype": "bfloat16", "seed": args.seed,
        "cache": args.cache if args.cache is not None else (8 if args.quick else 256),
        "frames": args.frames or (5 if args.quick else 200),
        "warmup": args.warmup if args.warmup is not None else (2 if args.quick else 20),
        "modes": list(parse_modes(args.modes)), "greedy_residuals": args.greedy_residuals,
    }


def run_child(config: Mapping[str, Any], env: Mapping[str, str], timeout_s: float, what: str) -> dict[str, Any]:
    """Start one child, wait, and return the JSON it printed; any failure is a BenchError."""
    from vllm_omni.gpu.child import RESULT_MARK

    try:
        proc = subprocess.run(child_command(config), env=dict(env), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what}: no result within {timeout_s:.0f} s (raise --child-timeout)") from None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK + " "):
            return json.loads(line[len(RESULT_MARK) + 1:])
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:]) or "no output"
    raise BenchError(f"{what}: exit {proc.returncode} without a result: {tail}")


def rows_for(run: ChildRun, result: Mapping[str, Any], frame_ms: float, total_sms: int) -> list[list[Any]]:
    """One row per timed mode of one child: times, and RTF from the host's wall time.

    ``total_sms`` is the whole GPU's count, from the uncapped probe: the SMs a share asks for
    come from it, while the child's own count is what its capped CUDA context reports, which
    under MPS is the capped count rather than the whole GPU's.
    """
    share = 100 if run.cap is None else run.cap
    rows = []
    for mode, m in result["modes"].items():
        rows.append([
            run.setting, share, mps.estimated_sms(share, total_sms), result["sms"], MODE_LABELS[mode],
            m["talker_ms"], m["predictor_ms"], m["frame_ms"], m["wall_ms"], round(m["wall_ms"] / frame_ms, 4),
        ])
    return rows


COLUMNS = [
    {"name": "setting", "unit": None, "type": "text"},
    {"name": "SM share", "unit": "%", "type": "number"},
    {"name": "SMs asked", "unit": None, "type": "number"},
    {"name": "SMs reported", "unit": None, "type": "number"},
    {"name": "mode", "unit": None, "type": "text"},
    {"name": "talker step", "unit": "ms", "type": "number", "format": ".3f"},
    {"name": "predictor frame", "unit": "ms", "type": "number", "format": ".3f"},
    {"name": "frame", "unit": "ms", "type": "number", "format": ".3f"},
    {"name": "frame wall", "unit": "ms", "type": "number", "format": ".3f"},
    {"name": "RTF", "unit": None, "type": "number", "format": ".3f"},
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpu-frame",
        help="talker step + 15-pass predictor frame on CUDA (bf16, static KV, eager vs CUDA graph) under MPS SM caps",
    )
    add_model_args(p)
    p.add_argument("--caps", default=None,
                   help=f"SM percentages, one child process each (default {','.join(map(str, DEFAULT_CAPS))}; "
                        f"--quick {','.join(map(str, QUICK_CAPS))})")
    p.add_argument("--no-mps", action="store_true", help="one plain child on the whole GPU, no MPS daemon")
    p.add_argument("--modes", default="graph,eager", help="graph, eager or both (default graph,eager)")
    p.add_argument("--cache", type=nonnegative_int, default=None,
                   help="talker KV length before the first frame (default 256; --quick 8)")
    p.add_argument("--frames", type=positive_int, default=None, help="timed frames per mode (default 200; --quick 5)")
    p.add_argument("--warmup", type=nonnegative_int, default=None, help="untimed frames first (default 20; --quick 2)")
    p.add_argument("--greedy-residuals", action="store_true", help="argmax for c1..c15 instead of Gumbel top-50")
    p.add_argument("--child-timeout", type=positive_number, default=180.0, help="seconds one child may take (default 180)")
    p.add_argument("--quick", action="store_true",
                   help="shallow talker, two caps, few frames: for doctests, not figures")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights")
    add_name(p, "device-simulation", "gpu-frame-<gpu>[-<model>][-no-mps]")
    add_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.no_mps and args.caps:
        raise BenchError("--caps sets MPS shares of the SMs and --no-mps runs one uncapped child: give one of them")
    caps = parse_caps(args.caps) if args.caps else (QUICK_CAPS if args.quick else DEFAULT_CAPS)
    config = child_config(args)
    base = dict(os.environ)
    info = run_child({"probe": True}, base, args.child_timeout, "probe")
    if not info.get("cuda"):
        raise BenchError(f"gpu-frame needs a CUDA GPU: {info.get('reason', 'none found')}")
    runs = plan(caps, not args.no_mps)
    results: list[tuple[ChildRun, dict[str, Any]]] = []
    if args.no_mps:
        results.append((runs[0], _measure(runs[0], config, base, args)))
    else:
        if shutil.which(mps.CONTROL) is None:
            raise BenchError(f"SM caps need {mps.CONTROL} (the NVIDIA driver's MPS tools) on PATH; "
                             "pass --no-mps to time the whole GPU without them")
        try:
            with mps.MpsSession(mps.default_root() / "gpu-frame") as session:
                for r in runs:
                    env = child_env(r, session.pipe_dir, session.log_dir, base)
                    results.append((r, _measure(r, config, env, args)))
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None
    _write(args, config, info, results)
    return 0


def _measure(r: ChildRun, config: dict[str, Any], env: Mapping[str, str], args: argparse.Namespace) -> dict[str, Any]:
    out = run_child(config, env, args.child_timeout, f"child for {r.setting}")
    if not out.get("cuda"):
        raise BenchError(f"child for {r.setting} sees no CUDA device: {out.get('reason')}")
    if r.cap is not None and out.get("cap_env") != str(r.cap):
        raise BenchError(f"child for {r.setting} started with {out.get('cap_env')!r} as its SM percentage")
    return out


def _write(args: argparse.Namespace, config: dict[str, Any], info: dict[str, Any],
           results: list[tuple[ChildRun, dict[str, Any]]]) -> None:
    from vllm_omni.results import provenance, store
    from vllm_omni.results.schema import validate

    spec = get_model(args.model)
    rows = [row for r, out in results for row in rows_for(r, out, spec.frame_ms, info["sms"])]
    suffix = id_suffix(args) + ("-no-mps" if args.no_mps else "")
    prov = provenance.capture(
        source="vllm-omni-bench gpu-frame", model=spec.name,
        weights=f"random, seed {args.seed}, published shapes", quantization="bf16", threads=None,
        builds={"cuda": info.get("cuda_runtime")},
        run={
            "talker_layers": config["layers"], "talker_kv_first": config["cache"],
            "talker_capacity": results[0][1]["talker_capacity"], "frames": config["frames"],
            "warmup": config["warmup"], "greedy_residuals": config["greedy_residuals"],
            "mps": not args.no_mps, "capability": info.get("capability"),
            "setup_s": {r.setting: out["setup_s"] for r, out in results},
            "peak_gpu_mib": {r.setting: out["peak_gpu_mib"] for r, out in results},
        },
    )
    prov["host"].update(gpu=info["device"], gpu_sms=info["sms"], gpu_memory_gib=info["memory_gib"])
    notes = (
        "Random weights of the published shapes: speed does not depend on weight values. bf16 weights and "
        "activations; static KV caches (the talker attends over all its slots with the unused ones masked; the "
        "predictor has 16). c0 is the argmax over the 2048 codebook ids (no penalties, no top-k); c1..c15 are "
        + ("argmax" if config["greedy_residuals"] else "Gumbel top-50 at temperature 0.9, uniforms drawn on the GPU")
        + ". No engine, scheduler or vocoder: this is the model's own GPU work and its launch cost. Medians over "
        f"{config['frames']} frames after {config['warmup']} warm-up frames per row. talker step, predictor frame and "
        "frame are GPU times between CUDA events; frame wall is the host's time until the 16 codes are on the host, "
        "and RTF = frame wall / 80 ms. Each SM share ran in its own process"
        + (" as a client of one MPS daemon, with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set before CUDA started. SMs asked is "
           "ceil(share x the whole GPU's SMs / 100); SMs reported is the multiprocessor count that the child's "
           "CUDA context reports under its cap, after the driver's rounding." if not args.no_mps
           else " without MPS; SMs reported is the multiprocessor count its CUDA context reports.")
        + (" Quick mode: shallow talker, few frames, for doctests only, not a figure." if args.quick else "")
    )
    data = {
        "schema": 1,
        "id": named_id(args, f"device-simulation/gpu-frame-{gpu_slug(info['device'])}{suffix}"),
        "title": f"The model's GPU work per frame under SM caps ({info['device']}, {args.model}, bf16, static KV)",
        "origin": "measured",
        "provenance": prov,
        "columns": COLUMNS,
        "rows": rows,
        "notes": notes,
        # medians of GPU time on a shared device: a rerun on the same GPU class should land within 15 %
        "compare": {"tolerance": 0.15, "key_columns": ["setting", "mode"],
                    "columns": ["talker step", "predictor frame", "frame", "RTF"]},
    }
    validate(data)
    print(written(store.write(data, args.output), args.output))
