"""``vllm-omni-bench quality``: code agreement of every predictor build with the fp32 reference.

The study compared each quantized build with its own bf16 over 12 greedy prompts. With
random weights there are no prompts and no "right" audio, so the honest version is: the same
12 seeded inputs (past hidden state and codebook-0 embedding), greedy decoding, and the
fraction of the 15 residual codes of each frame that match the eager fp32 reference. fp32
builds must agree exactly; quantized builds show how far quantization moves greedy choices.
"""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, cpu_threads, nonnegative_int, resolve_threads, set_threads, write_measured,
)

SEEDS = tuple(range(12))
# (implementation, weight format); the eager fp32 reference is the baseline.
BUILDS = (
    ("reference", "bf16"), ("reference", "int8"), ("reference", "int4"),
    ("fused", "fp32"), ("fused", "int8"), ("fused", "int4"),
)


def frame_inputs(spec, seed: int):
    """The seeded (past_hidden, c0_embed) pair of one quality input."""
    import torch

    from vllm_omni.cpu.weights import EMBED_STD

    g = torch.Generator().manual_seed(10_000 + seed)
    past_hidden = torch.randn(spec.talker.hidden, generator=g)  # post-norm hidden: unit RMS
    c0_embed = torch.randn(spec.talker.hidden, generator=g) * EMBED_STD
    return past_hidden, c0_embed


def greedy_codes(predictor, spec, seeds=SEEDS):
    return [predictor.frame(*frame_inputs(spec, s), greedy=True)[0].tolist() for s in seeds]


def agreement(codes, baseline) -> tuple[float, int, float]:
    """(% of codes equal, frames fully equal, mean index of the first differing code)."""
    total = same = exact = 0
    first_diff = []
    for a, b in zip(codes, baseline):
        eq = [x == y for x, y in zip(a, b)]
        total, same = total + len(eq), same + sum(eq)
        exact += all(eq)
        first_diff.append(eq.index(False) + 1 if not all(eq) else len(eq) + 1)
    return 100.0 * same / total, exact, sum(first_diff) / len(first_diff)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quality", help="greedy code agreement of each predictor build with the fp32 reference")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="model size (random weights)")
    p.add_argument("--threads", type=cpu_threads, default=None, help="threads (default: all usable cores)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights")
    p.add_argument("--quick", action="store_true", help="3 inputs instead of 12 (for doctests)")
    add_name(p, "cpu-path", "quality-<model>")
    add_output(p)
    # untimed, but it builds the native kernels: a bad VLLM_OMNI_Q4_PREFETCH stops it before the baseline
    p.set_defaults(func=run, native_kernels=True)


def run(args: argparse.Namespace) -> int:
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.reference import ReferencePredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.models import get_model

    threads = resolve_threads(args.threads)
    set_threads(threads)
    spec = get_model(args.model)
    seeds = SEEDS[:3] if args.quick else SEEDS
    weights = random_predictor_weights(spec, seed=args.seed)
    baseline = greedy_codes(ReferencePredictor(weights, "fp32"), spec, seeds)
    rows = []
    for impl, fmt in BUILDS:
        try:
            pred = ReferencePredictor(weights, fmt) if impl == "reference" else FusedPredictor(weights, fmt, threads)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            raise BenchError(f"cannot build the {impl} {fmt} predictor: {exc}") from None
        pct, exact, first = agreement(greedy_codes(pred, spec, seeds), baseline)
        rows.append([f"{impl} {fmt}", round(pct, 1), exact, round(first, 2)])
    write_measured(
        args,
        artifact_id=f"cpu-path/quality-{args.model.lower()}" + ("-quick" if args.quick else ""),
        title=f"Greedy code agreement with the fp32 reference, {len(seeds)} seeded inputs ({args.model} predictor)",
        columns=[
            {"name": "build", "unit": None, "type": "text"},
            {"name": "codes equal to fp32 reference", "unit": "%", "type": "number"},
            {"name": f"frames identical (of {len(seeds)})", "unit": None, "type": "number"},
            {"name": "mean position of first difference (16 = none)", "unit": None, "type": "number"},
        ],
        rows=rows,
        model=spec.name, weights=f"random, seed {args.seed}, published shapes",
        quantization="fp32 baseline; bf16, int8 (per-row scales), int4 (groups of 32, fp16 scales)",
        threads=threads,
        source="vllm-omni-bench quality",
        compare={"tolerance": 0.05, "key_columns": ["build"]},
        notes=f"Inputs: seeds {seeds[0]}..{seeds[-1]} of a unit-RMS past hidden state and a codebook-0 embedding; greedy "
              "decoding of the 15 residual codes. The reference int8 build uses torch's dynamic int8 "
              "linear; the reference int4 build uses torch's int4 weight-only matmul.",
    )
    return 0
