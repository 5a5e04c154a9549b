"""``vllm-omni-bench sampler``: the talker's sampler (eager vs fast) and residual-code sampling.

Why: the study measured sampling as a visible share of a CPU frame; this puts a number on
a generic multi-pass sampler against the one-pass one on the same host, and on the
15 Gumbel top-k draws the predictor makes per frame.
"""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import (
    add_common, add_name, median, positive_int, resolve_threads, set_threads, write_measured,
)

HISTORY = 64  # generated ids before the timed calls: the repetition penalty has work to do


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sampler", help="time the talker sampler (eager and fast) and residual-code sampling")
    add_common(p, weights=False, impl=False)
    p.add_argument("--repeats", type=positive_int, default=None, help="timed samples per row (default 500; --quick 20)")
    add_name(p, "cpu-path", "sampler-t<threads>")
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def run(args: argparse.Namespace) -> int:
    import time

    import torch

    from vllm_omni.cpu.sampler import SAMPLERS, draw_uniforms, residual_choice
    from vllm_omni.cpu.weights import MATRIX_STD

    threads = resolve_threads(args.threads)
    set_threads(threads)
    repeats = args.repeats or (20 if args.quick else 500)
    g = torch.Generator().manual_seed(args.seed)
    # logits of the scale the random-weight talker produces (std ~ 0.02 * sqrt(1024))
    scale = MATRIX_STD * 1024 ** 0.5
    logits = [torch.randn(3072, generator=g) * scale for _ in range(HISTORY + repeats + 1)]

    rows, ms = [], {}
    variants = {
        "eager": lambda: SAMPLERS["eager"](seed=args.seed),
        "fast": lambda: SAMPLERS["fast"](seed=args.seed, native=True),
        "fast, PyTorch stand-in": lambda: SAMPLERS["fast"](seed=args.seed, native=False),
    }
    for kind, make in variants.items():
        s = make()
        for x in logits[:HISTORY]:
            s.sample(x)
        samples = []
        for x in logits[HISTORY:HISTORY + repeats]:
            t0 = time.perf_counter()
            s.sample(x)
            samples.append((time.perf_counter() - t0) * 1e3)
        ms[kind] = median(samples)
        rows.append([f"talker sampler, {kind}", 1, repeats, round(ms[kind], 4), round(min(samples), 4)])

    residual = [torch.randn(15, 2048, generator=g) * scale for _ in range(repeats)]
    samples = []
    for r in residual:
        t0 = time.perf_counter()
        u = draw_uniforms(g)
        for k in range(15):
            residual_choice(r[k], greedy=False, uniforms=u[k])
        samples.append((time.perf_counter() - t0) * 1e3)
    rows.append(["residual codes, Gumbel top-50 (15 per frame, incl. drawing uniforms)", 15, repeats,
                 round(median(samples), 4), round(min(samples), 4)])

    suffix = "-quick" if args.quick else ""
    write_measured(
        args,
        artifact_id=f"cpu-path/sampler-t{threads}{suffix}",
        title=f"Sampling cost per frame on the CPU ({threads} threads)",
        columns=[
            {"name": "sampler", "unit": None, "type": "text"},
            {"name": "draws per frame", "unit": None, "type": "number"},
            {"name": "repeats", "unit": None, "type": "number"},
            {"name": "median", "unit": "ms", "type": "number", "format": ".3f"},
            {"name": "min", "unit": "ms", "type": "number", "format": ".3f"},
        ],
        rows=rows,
        model=None,
        weights="random logits, seed {}".format(args.seed),
        quantization=None,
        threads=threads,
        source="vllm-omni-bench sampler",
        compare={"tolerance": 0.25, "key_columns": ["sampler"], "columns": ["median"]},
        run={"eager_over_fast": round(ms["eager"] / ms["fast"], 2), "history_before_timing": HISTORY},
        notes=("Talker sampler: temperature 0.9, top-k 50, top-p 1.0, repetition penalty 1.05 over a "
               f"3072-entry vocabulary with {HISTORY}+ generated ids, codebook-0 mask. Eager and fast "
               "choose identical ids for the same seed (tests/test_sampler.py)."
               + (" Quick mode: few repeats, for doctests only, not a figure." if args.quick else "")),
    )
    return 0
