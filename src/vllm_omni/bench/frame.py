"""``vllm-omni-bench frame``: whole frames (talker step, sampler, 15 predictor passes,
bookkeeping), split the way the study splits a CPU frame, with the real-time factor."""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import (
    BenchError, add_common, add_name, nonnegative_int, positive_int, resolve_threads, set_threads, write_measured,
)
from vllm_omni.bench.talker import (
    add_kv_cache_arg,
    add_model_args,
    build_predictor,
    build_talker,
    id_suffix,
    kv_cache_of,
    ratio,
    talker_bytes,
    talker_layers,
)
from vllm_omni.models import get_model
from vllm_omni.models.counts import predictor_pass_bytes, projection_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("frame", help="time whole frames: talker, sampler, predictor, bookkeeping; RTF")
    add_common(p)
    add_name(p, "cpu-path", "frame-<impl>-<weights>-t<threads>[-<model>][-kv<cache>]")
    add_model_args(p)
    add_kv_cache_arg(p)
    p.add_argument("--cache", type=nonnegative_int, default=None, help="talker KV length before the first frame (default 256; --quick 8)")
    p.add_argument("--frames", type=positive_int, default=None, help="timed frames (default 20; --quick 2)")
    p.add_argument("--sampler", choices=("eager", "fast"), default=None,
                   help="talker sampler (default: eager with --impl reference, fast with --impl fused)")
    p.add_argument("--greedy-residuals", action="store_true", help="argmax for c1..c15 instead of sampling")
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu.frame import FrameLoop, StepStats, sync_enabled
    from vllm_omni.cpu.native import kernel_settings
    from vllm_omni.cpu.placement import recorded_round_trip
    from vllm_omni.cpu.sampler import SamplerConfig, make_sampler

    try:
        sync_enabled()  # a typo in the variable stops the run before any weights are built
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    spec = get_model(args.model)
    threads = resolve_threads(args.threads)
    set_threads(threads)
    cache = args.cache if args.cache is not None else (8 if args.quick else 256)
    frames = args.frames or (2 if args.quick else 20)
    kind = args.sampler or ("eager" if args.impl == "reference" else "fast")
    layers = talker_layers(args)

    talker, tw = build_talker(args, threads)
    predictor = build_predictor(args, threads)
    sampler = make_sampler(kind, SamplerConfig.for_model(spec), seed=args.seed)
    talker.prefill(cache, seed=args.seed)
    loop = FrameLoop(talker, predictor, sampler, tw.codec_embedding, predictor_greedy=args.greedy_residuals,
                     seed=args.seed, eos_id=spec.eos_id)
    loop.run(1, stop_at_eos=False)  # warm-up frame
    trip_start = recorded_round_trip(threads)  # which placement of two cores the frames met (a VM's)
    result = loop.run(frames, stop_at_eos=False)
    trip_end = recorded_round_trip(threads)
    m = StepStats.median(result.stats)
    total = m.total_ms

    # Floors: the talker step streams its weights once per frame; the predictor's passes
    # re-read theirs fifteen times in a row, so their floor allows for the part the cache
    # keeps (the working-set probe, as in `vllm-omni-bench predictor`).
    from vllm_omni.cpu.bandwidth import read_bandwidth_probes

    pass_bytes = predictor_pass_bytes(spec, args.weights) + projection_bytes(spec, args.weights)
    bw = read_bandwidth_probes(threads, args.quick, working_set=pass_bytes)
    trips = None if trip_start is None and trip_end is None else {
        "frames_start": trip_start, "frames_end": trip_end, "probes_end": recorded_round_trip(threads)}
    stream_gbps = max(bw["native"], bw["torch"])
    talker_floor = talker_bytes(args.model, args.weights, layers) / (stream_gbps * 1e9) * 1e3
    predictor_floor = spec.residual_codebooks * pass_bytes / (bw["best"] * 1e9) * 1e3

    def row(name: str, ms: float, floor_ms: float | None = None) -> list:
        return [name, round(ms, 3), round(100 * ms / total, 1), round(100 * ms / spec.frame_ms, 1),
                None if floor_ms is None else round(floor_ms, 3), ratio(ms, floor_ms)]

    rows = [
        row("talker step", m.talker_ms, talker_floor),
        row("code predictor (15 passes)", m.predictor_ms, predictor_floor),
        row("sampler", m.sampler_ms),
        row("bookkeeping", m.bookkeeping_ms),
        row("total", total, talker_floor + predictor_floor),
    ]
    suffix = id_suffix(args)
    write_measured(
        args,
        artifact_id=f"cpu-path/frame-{args.impl}-{args.weights}-t{threads}{suffix}",
        title=f"Where one frame goes on the CPU ({args.model}, {args.impl}, {args.weights}, {threads} threads)",
        columns=[
            {"name": "component", "unit": None, "type": "text"},
            {"name": "median", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "share of frame", "unit": "%", "type": "number", "format": ".1f"},
            {"name": "share of 80 ms", "unit": "%", "type": "number", "format": ".1f"},
            {"name": "bandwidth floor", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "measured / floor", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=rows,
        model=spec.name,
        weights=f"random, seed {args.seed}, published shapes",
        quantization=args.weights,
        threads=threads,
        source=f"vllm-omni-bench frame ({args.impl})",
        compare={"tolerance": 0.15, "key_columns": ["component"], "columns": ["median", "share of frame", "measured / floor"]},
        run={
            "rtf": round(total / spec.frame_ms, 3),
            "sampler_share": round(m.sampler_ms / total, 4),
            "frames": len(result.stats),
            "talker_layers": layers,
            "talker_kv_first": cache + 2,
            "talker_kv_last": cache + 1 + len(result.stats),
            "talker_kv_cache": kv_cache_of(talker),
            "sampler": kind,
            "greedy_residuals": args.greedy_residuals,
            "read_bandwidth_gbps": {k: round(v, 2) for k, v in bw.items()},
            "core_round_trip_ns": trips,
            **kernel_settings(used=args.impl == "fused"),
            "step_stats_sync": sync_enabled(),
            "torch_threads": torch.get_num_threads(),
        },
        notes=("Random weights of the published shapes: speed does not depend on weight values. Medians over "
               "frames, per component; the total is the sum of the medians. RTF = total / 80 ms. The talker's "
               f"KV cache starts at {cache} positions and grows by one per frame; the text term is a fixed "
               "random vector per frame. Floors count weights only: the talker's at the best streaming read "
               "bandwidth (1 GiB probes), the predictor's at the best of that and re-reading a buffer the size of "
               "one pass (the cache keeps part of it between the 15 passes); run.read_bandwidth_gbps has each probe. "
               "run.core_round_trip_ns (2 threads or more) has the round trip of a cache line between two threads "
               "before and after the timed frames and after the probes: on a VM, whether the cores shared an L3. "
               "run.talker_kv_cache is the fused talker's KV cache precision (null: the eager reference's)."
               + (" Quick mode: shallow talker, two frames, for doctests only, not a figure." if args.quick else "")),
    )
    return 0
