"""``vllm-omni-bench engines``: one code-predictor pass in every engine, one host, one run.

Every engine runs the same pass -- one token through the 5 blocks, final norm and one
``lm_head`` at KV position 8 (``bench.predictor.PASS_POSITION``) -- with the same random
weights and exactly ``--threads`` intra-op threads. ONNX Runtime, OpenVINO, ExecuTorch, MNN
and ncnn run the static-shape export of ``vllm_omni.engines.export`` (input: one hidden
vector and the past K/V); llama.cpp runs the same weights as GGUF
(``vllm_omni.engines.llamacpp``, fed a token at the same position); "this project" is
``FusedPredictor.pass_once``, as ``vllm-omni-bench predictor`` times it.

Method: every runner is prepared first (export, conversion, load) and its logits are
compared with the torch export's fp32 logits (relative L2 error; quantized formats show
agreement, not equality). The read bandwidth is measured next, at the same thread count.
Then rounds go round-robin over all runners (each round: a short pause so the previous
engine's spinning threads go idle, one untimed call, then the timed calls), so drift on a
shared host hits every row alike. An engine or format that cannot run gets a row with the
reason and null numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, cpu_threads, folder_path, median, nonnegative_int, parse_list, positive_int,
    resolve_threads, time_calls, write_measured,
)
from vllm_omni.bench.predictor import PASS_POSITION
from vllm_omni.models import get_model, predictor_pass_bytes

# command-line name -> (module under vllm_omni.engines, display name)
ENGINES = {
    "onnxruntime": ("onnxrt", "ONNX Runtime"),
    "openvino": ("openvino_rt", "OpenVINO"),
    "executorch": ("executorch_rt", "ExecuTorch (XNNPACK)"),
    "mnn": ("mnn_rt", "MNN"),
    "ncnn": ("ncnn_rt", "ncnn"),
    "llamacpp": ("llamacpp", "llama.cpp"),
}
FORMATS = ("fp32", "int8", "int4")
OURS = "this project"
PAUSE_S = 0.05  # between engines: OpenMP/ORT worker threads stop spinning well within this


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="one predictor pass in ONNX Runtime, OpenVINO, ExecuTorch, MNN, ncnn, "
                                       "llama.cpp and this project's kernel, interleaved in one run")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help=f"comma-separated engines (default: all of {', '.join(ENGINES)}); this project's "
                        "kernel is always included")
    p.add_argument("--weights", default=",".join(FORMATS), help="comma-separated formats out of fp32,int8,int4")
    p.add_argument("--threads", type=cpu_threads, default=None, help="threads every engine uses (default: all usable cores)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="predictor blocks (default 5, the published depth; --quick 1)")
    p.add_argument("--rounds", type=positive_int, default=None, help="round-robin rounds (default 7; --quick 1)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed passes per runner per round (default 10; --quick 3)")
    p.add_argument("--workdir", type=folder_path, default=None,
                   help="where exported and converted models go (default: a temporary folder, removed afterwards)")
    p.add_argument("--quick", action="store_true", help="one block, few repetitions: for doctests, not for figures")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights")
    add_name(p, "engines", "cross-engine-t<threads>[-l<layers>]")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def relative_error(got: Any, ref: Any) -> float:
    """||got - ref|| / ||ref|| over the logits (both flattened to fp32)."""
    import numpy as np

    g, r = np.asarray(got, dtype=np.float32).reshape(-1), np.asarray(ref, dtype=np.float32).reshape(-1)
    if g.shape != r.shape:
        raise ValueError(f"logits of shape {g.shape} vs {r.shape}")
    return float(np.linalg.norm(g - r) / np.linalg.norm(r))


class OursRunner:
    """This project's fused kernel: one pass at ``position`` with the export's inputs in its cache."""

    def __init__(self, weights, fmt: str, threads: int, position: int):
        from vllm_omni.cpu.predictor import FusedPredictor
        from vllm_omni.engines.export import example_inputs

        self.p = FusedPredictor(weights, fmt=fmt, threads=threads)
        x, past_k, past_v = example_inputs(weights, position)
        for i, (kc, vc) in enumerate(zip(self.p.native.k_cache, self.p.native.v_cache)):
            kc[:, :position] = past_k[i]
            vc[:, :position] = past_v[i]
        self.x, self.position = x, position
        self.model_bytes = None
        self.settings = f"FusedPredictor.pass_once, {threads} OpenMP threads"

    def run_once(self) -> None:
        self.p.pass_once(self.x, position=self.position, head=0)

    def logits(self):
        return self.p.pass_once(self.x, position=self.position, head=0).clone().numpy()


def _engine_module(key: str):
    mod_name, display = ENGINES[key]
    try:
        return importlib.import_module(f"vllm_omni.engines.{mod_name}"), display, None
    except ImportError as exc:
        return None, display, f"vllm_omni.engines.{mod_name} cannot be imported: {exc}"


def _describe(runner) -> tuple[int | None, str | None]:
    """(bytes of the model files the runner loaded, its settings) for the record."""
    nbytes, settings = getattr(runner, "model_bytes", None), getattr(runner, "settings", None)
    gguf = getattr(runner, "gguf", None)  # llama.cpp's runner keeps its GGUF file
    if nbytes is None and gguf is not None:
        nbytes = Path(gguf.path).stat().st_size
        model = getattr(runner, "model", None)
        extra = "extra buffer types on" if getattr(model, "extra_buffers", True) else (
            "extra buffer types off (AMX-INT8 host: llamacpp.default_extra_buffers)")
        settings = (f"n_threads={getattr(model, 'threads', None)}, llama.cpp defaults: F16 KV cache, "
                    f"flash attention auto; {extra}")
    return nbytes, settings


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu.bandwidth import read_bandwidth_probes, working_set_read_bandwidth
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.engines import EngineUnsupported
    from vllm_omni.engines.export import PredictorPass, example_inputs

    engines = parse_list(args.engines, ENGINES, "engines")
    formats = parse_list(args.weights, FORMATS, "weights")
    threads = resolve_threads(args.threads)
    spec = get_model("0.6B")
    layers = args.layers or (1 if args.quick else spec.predictor.layers)
    if not 1 <= layers <= spec.predictor.layers:
        raise BenchError(f"--layers must be in 1..{spec.predictor.layers}, got {layers}")
    rounds = args.rounds or (1 if args.quick else 7)
    repeats = args.repeats or (3 if args.quick else 10)
    position = PASS_POSITION
    torch.set_num_threads(threads)

    weights = random_predictor_weights(spec, seed=args.seed, layers=layers)
    with torch.no_grad():
        ref_logits = PredictorPass(weights, position).eval()(*example_inputs(weights, position))[0].numpy()
    pass_spec = dataclasses.replace(spec, predictor=dataclasses.replace(spec.predictor, layers=layers))

    tmp = None
    workdir = args.workdir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vllm-omni-engines-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)

    # one entry per format and engine: its runner, or the reason it did not run
    entries: list[dict[str, Any]] = []
    builds: dict[str, str | None] = {}
    modules = {key: _engine_module(key) for key in engines}
    for key, (mod, _display, _why) in modules.items():
        if mod is not None and mod.unavailable() is None:
            builds.update(mod.versions())
    try:
        for fmt in formats:
            candidates = [("ours", OURS, None)] + [(k, modules[k][1], modules[k][0]) for k in engines]
            for key, display, mod in candidates:
                e = {"key": key, "engine": display, "fmt": fmt, "runner": None, "reason": None, "error": None,
                     "prepare_s": None, "model_bytes": None, "settings": None}
                t0 = time.perf_counter()
                try:
                    if key == "ours":
                        e["runner"] = OursRunner(weights, fmt, threads, position)
                    elif mod is None:
                        e["reason"] = modules[key][2]
                    elif mod.unavailable():
                        e["reason"] = mod.unavailable()
                    else:
                        print(f"preparing {display} {fmt} ...", flush=True)
                        e["runner"] = mod.prepare(weights, fmt=fmt, threads=threads, workdir=workdir, position=position)
                except EngineUnsupported as exc:
                    e["reason"] = _short(exc)
                except Exception as exc:  # noqa: BLE001 - a converter or runtime failure is a result, recorded
                    e["reason"] = f"failed: {type(exc).__name__}: {_short(exc)}"
                if e["runner"] is not None:
                    e["prepare_s"] = round(time.perf_counter() - t0, 1)
                    e["model_bytes"], e["settings"] = _describe(e["runner"])
                    logits = getattr(e["runner"], "logits", None)
                    if callable(logits):
                        try:
                            e["error"] = relative_error(logits(), ref_logits)
                        except Exception as exc:  # noqa: BLE001
                            e["reason"] = f"ran, but its logits could not be read: {_short(exc)}"
                            e["runner"] = None
                if e["reason"]:
                    print(f"  {display} {fmt}: not run: {e['reason']}")
                entries.append(e)
        gc.collect()

        load_before = [round(x, 2) for x in os.getloadavg()]
        bw = read_bandwidth_probes(threads, quick=args.quick)
        live = [e for e in entries if e["runner"] is not None]
        # per format, the probe that re-reads a buffer of the pass's bytes (vllm_omni.cpu.bandwidth)
        floor_gbps = {
            f: max(bw["best"], working_set_read_bandwidth(threads, predictor_pass_bytes(pass_spec, f), args.quick))
            for f in sorted({e["fmt"] for e in live})
        }
        samples: dict[int, list[float]] = {id(e): [] for e in live}
        for e in live:
            e["runner"].run_once()  # warm-up
        for _ in range(rounds):
            for e in live:
                time.sleep(PAUSE_S)
                samples[id(e)] += time_calls(e["runner"].run_once, repeats=repeats, warmup=1)
        load_after = [round(x, 2) for x in os.getloadavg()]
    finally:
        for e in entries:
            close = getattr(e["runner"], "close", None)
            if callable(close):
                close()
            e["runner"] = None
        gc.collect()
        if tmp is not None:
            tmp.cleanup()

    ours_ms = {e["fmt"]: median(samples[id(e)]) for e in live if e["key"] == "ours"}
    rows = []
    for e in entries:
        nbytes = predictor_pass_bytes(pass_spec, e["fmt"])
        ms = mn = vs = share = None
        if id(e) in samples and samples[id(e)]:
            ms, mn = median(samples[id(e)]), min(samples[id(e)])
            vs = round(ms / ours_ms[e["fmt"]], 2) if e["fmt"] in ours_ms else None
            share = round(nbytes / (ms * 1e-3) / (floor_gbps[e["fmt"]] * 1e9), 3)
            ms, mn = round(ms, 3), round(mn, 3)
        rows.append([
            f"{e['engine']} {e['fmt']}", e["engine"], e["fmt"], threads, ms, mn, vs,
            None if e.get("model_bytes") is None else round(e["model_bytes"] / 2**20, 1),
            round(nbytes / 1e6, 1), share, None if e["error"] is None else float(f"{e['error']:.3g}"), e["reason"],
        ])
        status = f"{ms:.2f} ms (min {mn:.2f}), {share:.2f} of read bandwidth" if ms is not None else e["reason"]
        print(f"{e['engine']:22s} {e['fmt']}: {status}")

    default_layers = 1 if args.quick else spec.predictor.layers
    suffix = ("" if layers == default_layers else f"-l{layers}") + ("-quick" if args.quick else "")
    write_measured(
        args,
        artifact_id=f"engines/cross-engine-t{threads}{suffix}",
        title=f"One code-predictor pass in each engine, same host, same shapes, {threads} thread(s)",
        columns=[
            {"name": "run", "unit": None, "type": "text"},
            {"name": "engine", "unit": None, "type": "text"},
            {"name": "weights", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number"},
            {"name": "pass median", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "pass min", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "vs this project", "unit": "x", "type": "number", "format": ".2f"},
            {"name": "model file", "unit": "MiB", "type": "number", "format": ".1f"},
            {"name": "weight bytes per pass", "unit": "MB", "type": "number", "format": ".1f"},
            {"name": "share of read bandwidth", "unit": None, "type": "number", "format": ".2f"},
            {"name": "logit error vs torch fp32", "unit": None, "type": "number", "format": ".2g"},
            {"name": "not run because", "unit": None, "type": "text"},
        ],
        rows=rows,
        model=spec.name,
        weights=f"random, seed {args.seed}, published shapes ({layers} of {spec.predictor.layers} predictor blocks)",
        quantization=",".join(formats),
        threads=threads,
        builds=builds,
        source="vllm-omni-bench engines",
        compare={"tolerance": 0.2, "key_columns": ["run"], "columns": ["pass median", "vs this project", "share of read bandwidth"]},
        run={"read_bandwidth_gbps": {k: round(v, 2) for k, v in bw.items()},
             "floor_bandwidth_gbps": {f: round(v, 2) for f, v in floor_gbps.items()}, "rounds": rounds,
             "repeats_per_round": repeats, "pass_kv_position": position, "layers": layers,
             "load_average_1_5_15min": {"before timing": load_before, "after timing": load_after},
             "prepare_seconds": {f"{e['engine']} {e['fmt']}": e["prepare_s"] for e in entries},
             "settings": {f"{e['engine']} {e['fmt']}": e["settings"] for e in entries if e["settings"]}},
        notes=(
            "Random weights of the published shapes: speed does not depend on weight values. "
            "Every engine uses exactly the listed thread count. 'weight bytes per pass' is the format's nominal "
            "size (vllm_omni.models.predictor_pass_bytes: int8 = 1 B + a fp32 scale per row, int4 = 4.5 bits); "
            "'share of read bandwidth' = those bytes / median time / the best read bandwidth measured in the same "
            "run for that format (provenance.run.floor_bandwidth_gbps: streaming 1 GiB, or re-reading a buffer of "
            "the pass's bytes, part of which stays in the L3 cache, whichever is faster). 'model file' is what the "
            "engine loads; an engine that repacks or dequantizes at load reads other bytes. 'logit error' = ||logits - torch fp32 export|| / "
            "||torch fp32 export|| for the same inputs; quantized rows show agreement, not equality. llama.cpp "
            "is fed a token and its own F16 KV cache (llama.cpp's defaults), not the export's inputs, so its "
            "error is not comparable and left null (tests/test_engines_llamacpp.py checks its logits). "
            "Settings of each runner (precision hints, memory modes) are in provenance.run.settings; the host's "
            "load average around the timing (other work on a shared host) is in provenance.run."
            + (" Quick mode: one block, few repetitions, for doctests only, not a figure." if args.quick else "")
        ),
    )
    return 0
