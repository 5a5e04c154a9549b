"""``vllm-omni-bench talker``: one talker step (28 layers + codec head) at a given KV length.

Also holds the pieces the ``frame`` benchmark shares: building a talker or predictor for an
``--impl``/``--weights`` pair, and the bandwidth floor.
"""

from __future__ import annotations

import argparse
from typing import Any

from vllm_omni.bench.common import (
    BenchError, add_common, add_name, median, nonnegative_int, positive_int, resolve_threads, set_threads, time_calls,
    write_measured,
)
from vllm_omni.models import get_model
from vllm_omni.models.counts import layer_bytes, talker_frame_bytes

QUICK_LAYERS = 2  # --quick runs a shallow stack so doctests take seconds; never a figure


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="model size (random weights)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help=f"talker layers to build (default: all 28; --quick: {QUICK_LAYERS}); fewer than all "
                        "add -l<layers> to the artifact's name")


def add_kv_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache", choices=("fp32", "fp16"), default=None,
                   help="fused talker's KV cache precision (default: fp32 for fp32 weights, fp16 otherwise)")


def kv_cache_of(talker: Any) -> str | None:
    """The fused talker's KV cache precision; None for the eager reference (its activation dtype)."""
    return getattr(talker, "kv_cache", None)


def talker_layers(args: argparse.Namespace) -> int:
    """The talker layers to build: ``--layers``, else all (or the quick stack), checked."""
    spec = get_model(args.model)
    n = args.layers or (QUICK_LAYERS if args.quick else spec.talker.layers)
    if not 0 < n <= spec.talker.layers:
        raise BenchError(f"--layers must be in 1..{spec.talker.layers}, got {n}")
    return n


def build_talker(args: argparse.Namespace, threads: int) -> tuple[Any, Any]:
    """(talker, its TalkerWeights) for ``args.impl`` and ``args.weights``."""
    from vllm_omni.cpu.weights import random_talker_weights

    w = random_talker_weights(get_model(args.model), seed=args.seed, layers=talker_layers(args))
    if args.impl == "fused":
        from vllm_omni.cpu.fused_talker import FusedTalker

        try:
            return FusedTalker(w, fmt=args.weights, threads=threads, kv_cache=getattr(args, "kv_cache", None)), w
        except (ValueError, NotImplementedError, RuntimeError, OSError) as exc:
            raise BenchError(f"FusedTalker cannot run --weights {args.weights}: {exc}") from None
    if getattr(args, "kv_cache", None):
        raise BenchError("--kv-cache applies to --impl fused only")
    from vllm_omni.cpu.reference import ReferenceTalker

    return ReferenceTalker(w, fmt=args.weights), w


def build_predictor(args: argparse.Namespace, threads: int) -> Any:
    from vllm_omni.cpu.weights import random_predictor_weights

    w = random_predictor_weights(get_model(args.model), seed=args.seed)
    if args.impl == "fused":
        from vllm_omni.cpu.predictor import FusedPredictor

        try:
            return FusedPredictor(w, fmt=args.weights, threads=threads)
        except (ValueError, NotImplementedError, RuntimeError, OSError) as exc:
            raise BenchError(f"FusedPredictor cannot run --weights {args.weights}: {exc}") from None
    from vllm_omni.cpu.reference import ReferencePredictor

    return ReferencePredictor(w, fmt=args.weights)


def id_suffix(args: argparse.Namespace) -> str:
    """Artifact-id tail: the model when it is not 0.6B, ``-l<layers>`` when ``--layers`` asks
    for fewer than the model has (a shallow stack never takes a full run's file),
    ``-kv<cache>`` when ``--kv-cache`` is given, and ``-quick`` for quick runs."""
    model = "" if args.model == "0.6B" else f"-{args.model.lower()}"
    shallow = args.layers is not None and args.layers != get_model(args.model).talker.layers
    layers = f"-l{args.layers}" if shallow else ""
    kv = f"-kv{args.kv_cache}" if getattr(args, "kv_cache", None) else ""
    return model + layers + kv + ("-quick" if args.quick else "")


def talker_bytes(model: str, fmt: str, layers: int) -> int:
    """Weight bytes one talker step reads, for a possibly shallow stack."""
    spec = get_model(model)
    return talker_frame_bytes(spec, fmt) - (spec.talker.layers - layers) * layer_bytes(spec.talker, fmt)


def bandwidth_floor(nbytes: int, threads: int, quick: bool) -> tuple[float | None, float | None]:
    """(floor ms to read ``nbytes`` once, read GB/s measured now at ``threads``)."""
    from vllm_omni.cpu.bandwidth import measure_read_bandwidth

    gbps = float(measure_read_bandwidth(threads, quick))
    return nbytes / (gbps * 1e9) * 1e3, gbps


def ratio(measured: float, floor: float | None) -> float | None:
    return None if floor is None else round(measured / floor, 3)


# -------------------------------------------------------------------------------------------------

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("talker", help="time one talker step (28 layers + codec head) at a KV length")
    add_common(p)
    add_name(p, "cpu-path", "talker-<impl>-<weights>-t<threads>[-<model>][-kv<cache>]")
    add_model_args(p)
    add_kv_cache_arg(p)
    p.add_argument("--cache", type=nonnegative_int, default=None, help="KV length before the timed steps (default 256; --quick 16)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed steps (default 20; --quick 3)")
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu.native import kernel_settings

    threads = resolve_threads(args.threads)
    set_threads(threads)
    cache = args.cache if args.cache is not None else (16 if args.quick else 256)
    repeats = args.repeats or (3 if args.quick else 20)
    layers = talker_layers(args)
    talker, w = build_talker(args, threads)
    talker.prefill(cache, seed=args.seed)
    x = w.codec_embedding[2149].clone()
    samples = time_calls(lambda: talker.step(x), repeats=repeats, warmup=1, progress="talker")
    kv_first, kv_last = cache + 2, cache + 1 + repeats  # keys attended by the first/last timed step
    med = median(samples)
    floor, gbps = bandwidth_floor(talker_bytes(args.model, args.weights, layers), threads, args.quick)
    suffix = id_suffix(args)
    write_measured(
        args,
        artifact_id=f"cpu-path/talker-{args.impl}-{args.weights}-t{threads}{suffix}",
        title=f"One talker step on the CPU ({args.model}, {args.impl}, {args.weights}, {threads} threads)",
        columns=[
            {"name": "layers", "unit": None, "type": "number"},
            {"name": "kv length (first timed step)", "unit": "positions", "type": "number"},
            {"name": "kv length (last timed step)", "unit": "positions", "type": "number"},
            {"name": "repeats", "unit": None, "type": "number"},
            {"name": "median", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "min", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "bandwidth floor", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "measured / floor", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=[[layers, kv_first, kv_last, repeats, round(med, 3), round(min(samples), 3),
               None if floor is None else round(floor, 3), ratio(med, floor)]],
        model=get_model(args.model).name,
        weights=f"random, seed {args.seed}, published shapes",
        quantization=args.weights,
        threads=threads,
        source=f"vllm-omni-bench talker ({args.impl})",
        compare={"tolerance": 0.15, "key_columns": ["layers"], "columns": ["median", "measured / floor"]},
        run={"read_bandwidth_gbps": gbps, "torch_threads": torch.get_num_threads(), "kv_cache": kv_cache_of(talker),
             **kernel_settings(used=args.impl == "fused")},
        notes=("Random weights of the published shapes: speed does not depend on weight values. "
               "Each timed step appends to the KV cache, so the KV length grows by one per step; run.kv_cache is "
               "the fused talker's cache precision (null: the eager reference's, its activation dtype). The floor "
               "counts weights only, not the cache."
               + (" Quick mode: shallow stack and few repeats, for doctests only, not a figure." if args.quick else "")),
    )
    return 0
