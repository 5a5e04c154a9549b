"""``vllm-omni-bench vllm-two-engines``: two vLLM CPU engines in one process, one per stage.

Starts two engines on the tiny random-weight Qwen3 model (:mod:`vllm_omni.testing.tiny_qwen3`)
with vLLM's default multiprocess layout (an EngineCore and a worker process per engine),
tagged ``talker`` and ``code2wav`` through ``additional_config``, each with its own explicit
``kv_cache_memory_bytes`` while ``VLLM_CPU_KVCACHE_SPACE`` is set for the whole process.
Records, per engine: the KV budget asked for, the budget in the engine's config after
startup, the KV blocks allocated, and the CPUs the worker's threads are bound to (read
from ``/proc/<pid>/task/*/status``). Both engines then generate a few greedy tokens.

The patches reach the EngineCore and worker processes only through the installed
``vllm.general_plugins`` entry point, so the command refuses to run without it.
Timings of this tiny model describe vLLM's fixed overheads, not a real model.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, folder_path, nonnegative_int, positive_int, require_vllm_plugin,
    tiny_model_dir, write_measured,
)
from vllm_omni.results import provenance

STAGES = ("talker", "code2wav")
MiB = 1 << 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm-two-engines",
                       help="two vLLM CPU engines (talker, code2wav) on one socket: cores and KV budgets")
    p.add_argument("--kv-mib", type=positive_int, nargs=2, default=[64, 32], metavar=("TALKER", "CODE2WAV"),
                   help="explicit KV budget of each engine in MiB (default: 64 32)")
    p.add_argument("--env-kv-gib", type=nonnegative_int, default=1,
                   help="VLLM_CPU_KVCACHE_SPACE set for the process, in GiB (0: leave unset; default 1)")
    p.add_argument("--tokens", type=positive_int, default=8, help="greedy tokens each engine generates (default 8)")
    p.add_argument("--model-dir", type=folder_path, default=None,
                   help="where to build the tiny model (default: a temporary folder, removed afterwards)")
    add_name(p, "vllm", "two-engines")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def _cpus(pid: int) -> list[int]:
    """Union of the CPU affinities of all threads of ``pid``."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out |= os.sched_getaffinity(int(task.name))
        except OSError:
            continue
    return sorted(out)


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def run(args: argparse.Namespace) -> int:
    if provenance.usable_cpus() < 2:
        raise BenchError("needs at least 2 usable CPUs (one per stage)")
    require_vllm_plugin("psutil")

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: EngineCore + worker processes
    if args.env_kv_gib:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.env_kv_gib)
    else:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    with tiny_model_dir(args.model_dir) as model_dir:
        return _measure(args, str(model_dir))


def _measure(args: argparse.Namespace, model: str) -> int:
    import psutil
    from vllm import LLM, SamplingParams

    me = psutil.Process()
    engines, rows = [], []
    for stage, kv_mib in zip(STAGES, args.kv_mib):
        before = {p.pid for p in me.children(recursive=True)}
        t0 = time.perf_counter()
        llm = LLM(model, enforce_eager=True, dtype="float32", max_model_len=256, seed=0,
                  kv_cache_memory_bytes=kv_mib * MiB, additional_config={"vllm_omni": {"stage": stage}})
        start_s = time.perf_counter() - t0
        new = [p for p in me.children(recursive=True) if p.pid not in before]
        # The worker is the new process whose parent is another new process (the EngineCore).
        new_pids = {p.pid for p in new}
        workers = [p for p in new if p.ppid() in new_pids]
        if len(workers) != 1:
            raise BenchError(f"expected one worker process for stage {stage}, found {[(p.pid, p.name()) for p in new]}")
        engines.append((stage, kv_mib, llm, workers[0], start_s))

    sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    for stage, kv_mib, llm, worker, start_s in engines:
        t0 = time.perf_counter()
        out = llm.generate(["Hello world"], sp, use_tqdm=False)
        gen_s = time.perf_counter() - t0
        cache = llm.llm_engine.vllm_config.cache_config
        kv_after = cache.kv_cache_memory_bytes
        rows.append([
            stage, kv_mib, None if kv_after is None else round(kv_after / MiB, 3), cache.num_gpu_blocks,
            _cpu_list(_cpus(worker.pid)), round(start_s, 2), len(out[0].outputs[0].token_ids), round(gen_s, 3),
        ])
    cores = [set(r[4].split(",")) for r in rows]
    disjoint = not (cores[0] & cores[1])
    honoured = all(r[1] == r[2] for r in rows)
    write_measured(
        args,
        artifact_id="vllm/two-engines",
        title="Two vLLM CPU engines on one socket: worker cores and explicit KV budgets, with the patches",
        columns=[
            {"name": "stage", "unit": None, "type": "text"},
            {"name": "kv asked", "unit": "MiB", "type": "number"},
            {"name": "kv after startup", "unit": "MiB", "type": "number"},
            {"name": "kv blocks", "unit": None, "type": "number"},
            {"name": "worker cpus", "unit": None, "type": "text"},
            {"name": "engine start", "unit": "s", "type": "number", "format": ".1f"},
            {"name": "tokens", "unit": None, "type": "number"},
            {"name": "generate", "unit": "s", "type": "number", "format": ".3f"},
        ],
        rows=rows,
        model="tiny random-weight Qwen3 (vllm_omni.testing.tiny_qwen3, 2 layers, hidden 128)",
        weights="random, seed 0", quantization="fp32", threads=provenance.usable_cpus(),
        source="vllm-omni-bench vllm-two-engines",
        compare={"tolerance": 0.01, "key_columns": ["stage"], "columns": ["kv asked", "kv after startup", "kv blocks", "tokens"]},
        notes=(f"VLLM_CPU_KVCACHE_SPACE={args.env_kv_gib or 'unset'} for the whole process; worker cores disjoint: "
               f"{disjoint}; explicit KV budgets kept: {honoured}. Worker CPUs are the union of the affinities "
               "of the worker process's threads. Random weights: timings describe vLLM's fixed overheads."),
        run={"disjoint_cores": disjoint, "kv_budgets_honoured": honoured, "env_kv_gib": args.env_kv_gib},
    )
    for _, _, llm, _, _ in engines:
        llm.llm_engine.engine_core.shutdown()
    return 0
