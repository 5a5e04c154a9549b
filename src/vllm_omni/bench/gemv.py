"""``vllm-omni-bench gemv``: how fast the fused GEMVs decode packed weights, by where they sit.

A predictor pass that misses its read floor is held back either by the reads or by the work
its row dots do in the core. This benchmark separates the two (``vllm_omni.cpu.gemv_speed``).
For each format and thread count it times sweeps of GEMVs, matrix after matrix as in a pass,
over four weight sets, each beside the read probe re-reading a buffer of the same size and
beside sweeps that make the same reads as the GEMVs with no arithmetic (*plain reads*):

- *in L2*: half this host's L2 cache per thread, so the weights come from each core's L2;
- *in L3*: 3/8 of the L3 cache, read from the L3 on every sweep;
- *pass matrices*: the 21 matrices one predictor pass reads (5 x qkv, o, gate_up, down; one
  head), with the pass itself timed in the same round, so that the share of the pass spent
  outside its GEMVs (norms, activation quantisation, attention, the call) shows;
- *memory*: at least 8 times the L3, streamed from memory on every sweep.

Where the weights sit in a cache the probe reads far faster than memory: a GEMV well below the
probe there is limited by its work in the core, whatever the memory does. A GEMV that keeps up
with its plain reads is limited by those reads: only a different read pattern, or fewer bytes,
would make it faster.
"""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, median, nonnegative_int, parse_list, positive_int, thread_counts, time_calls,
    write_measured,
)
from vllm_omni.bench.predictor import PASS_POSITION
from vllm_omni.cpu.native import VARIANT_FLAGS
from vllm_omni.models import get_model

FORMATS = ("fp32", "int8", "int4")
SETS = ("in L2", "in L3", "pass matrices", "memory")
FALLBACK_L2, FALLBACK_L3 = 1 << 20, 32 << 20  # where Linux does not report the cache sizes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gemv", help="GEMV decode speed of packed weights in L2, L3, a pass's matrices and memory")
    p.add_argument("--weights", default=",".join(FORMATS),
                   help=f"comma-separated weight formats (default {','.join(FORMATS)})")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts (default: all usable cores)")
    p.add_argument("--rounds", type=positive_int, default=None, help="rounds per set, each probe then GEMVs (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true", help="fewer sweeps, a smaller memory set: for doctests, not for figures")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights")
    p.add_argument("--sets", default=",".join(SETS),
                   help=f"comma-separated weight sets to time (default all: {','.join(SETS)}); e.g. 'in L2' alone "
                        "for the loops' own speed, where the memory set of a host with a large L3 takes minutes")
    p.add_argument("--variant", choices=tuple(VARIANT_FLAGS), default="native",
                   help="build of the fused kernels: this CPU's full ISA (default), AVX2 only, or plain C")
    add_name(p, "cpu-path", "gemv-speed-t<thread counts>[-<variant>]")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def set_sizes(threads: int, l2: int, l3: int, quick: bool) -> dict[str, int]:
    """Bytes of the synthetic weight sets at ``threads`` threads (the pass's set has its own size)."""
    return {"in L2": threads * l2 // 2, "in L3": 3 * l3 // 8,
            "memory": max((64 << 20) if quick else (256 << 20), (2 if quick else 8) * l3)}


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu import gemv_speed as G
    from vllm_omni.cpu.bandwidth import working_set_read_bandwidth
    from vllm_omni.cpu.native import isa, kernel_settings
    from vllm_omni.cpu.predictor import FusedPredictor
    from vllm_omni.cpu.weights import random_predictor_weights
    from vllm_omni.results import provenance

    fmts = parse_list(args.weights, FORMATS, "weights")
    chosen = parse_list(args.sets, SETS, "sets")
    counts = thread_counts(args)
    rounds = args.rounds or (1 if args.quick else 3)
    l2, l3 = provenance.cache_bytes(2), provenance.cache_bytes(3)
    l2_used, l3_used = l2 or FALLBACK_L2, l3 or FALLBACK_L3
    pass_reps = 5 if args.quick else 20

    spec = get_model("0.6B")
    w = random_predictor_weights(spec, seed=args.seed)
    x = torch.randn(1, spec.predictor.hidden, generator=torch.Generator().manual_seed(args.seed + 1)) * 0.5
    rows, run_info = [], {}
    for fmt in fmts:
        try:
            p = FusedPredictor(w, fmt=fmt, threads=max(counts), variant=args.variant)
        except (ValueError, RuntimeError, OSError) as exc:
            raise BenchError(f"the fused predictor cannot run --weights {fmt}: {exc}") from None
        by_size: dict[int, G.WeightSet] = {}  # the L3 and memory sets do not depend on the thread count
        for t in counts:
            p.set_threads(t)
            sizes = {k: v for k, v in set_sizes(t, l2_used, l3_used, args.quick).items() if k in chosen}
            for size in sizes.values():
                if size not in by_size:
                    by_size[size] = G.weight_set(fmt, size, seed=args.seed)
            sets = {name: by_size[size] for name, size in sizes.items()}
            if "pass matrices" in chosen:
                sets["pass matrices"] = G.pass_weight_set(p)
            probe = {name: 0.0 for name in chosen}
            sweeps = {name: [] for name in chosen}
            reads = {name: [] for name in chosen}
            passes: list[float] = []
            p.pass_once(x, position=PASS_POSITION, head=0)  # warm-up
            for _ in range(rounds):
                for name in chosen:
                    ws = sets[name]
                    probe[name] = max(probe[name], working_set_read_bandwidth(t, ws.nbytes, args.quick))
                    n = G.sweeps_for(ws.nbytes, args.quick)
                    sweeps[name] += G.gemv_sweep_seconds(ws, t, n + 1, args.variant)[1:]
                    reads[name] += G.read_sweep_seconds(ws, t, n + 1, args.variant)[1:]
                    if name == "pass matrices":
                        passes += time_calls(lambda: p.pass_once(x, position=PASS_POSITION, head=0),
                                             repeats=pass_reps, warmup=1)
            for name in chosen:
                ws, secs = sets[name], sweeps[name]
                med_s, best_s = median(secs), min(secs)
                gb_med, gb_best = ws.nbytes / med_s / 1e9, ws.nbytes / best_s / 1e9
                gb_reads, gb_reads_best = ws.nbytes / median(reads[name]) / 1e9, ws.nbytes / min(reads[name]) / 1e9
                pass_ms = median(passes) if name == "pass matrices" else None
                rows.append([
                    fmt, t, name, round(ws.nbytes / 1e6, 2), round(gb_med, 2), round(gb_best, 2), round(probe[name], 2),
                    round(gb_best / probe[name], 3), round(gb_reads, 2), round(gb_reads_best, 2),
                    round(gb_med / gb_reads, 3), round(gb_reads_best / probe[name], 3),
                    round(med_s * 1e3, 4),
                    None if pass_ms is None else round(pass_ms, 3),
                    None if pass_ms is None else round(med_s * 1e3 / pass_ms, 3),
                ])
                print(f"{fmt} t={t} {name:13s} {ws.nbytes / 1e6:8.1f} MB: GEMVs {gb_med:6.1f} GB/s median, "
                      f"{gb_best:6.1f} best; plain reads {gb_reads:6.1f} median; probe {probe[name]:6.1f} GB/s"
                      + ("" if pass_ms is None else f"; pass {pass_ms:.3f} ms, GEMVs {med_s * 1e3:.3f} ms"))
            run_info[f"{fmt}/t{t}"] = {name: {"matrices": len(sets[name].mats), "sweeps": len(sweeps[name]),
                                              "read_sweeps": len(reads[name])}
                                       for name in chosen}
        del p
    tcs = "-".join(str(t) for t in counts)
    write_measured(
        args,
        artifact_id=(f"cpu-path/gemv-speed-t{tcs}{'' if args.variant == 'native' else '-' + args.variant}"
                     f"{'-quick' if args.quick else ''}"),
        title="GEMV decode speed of packed weights by where they sit, against the read probe",
        columns=[
            {"name": "weights", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number"},
            {"name": "weight set", "unit": None, "type": "text"},
            {"name": "size", "unit": "MB", "type": "number", "format": ".1f"},
            {"name": "GEMVs median", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "GEMVs best", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "read probe", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "GEMVs best / probe", "unit": None, "type": "number", "format": ".2f"},
            {"name": "plain reads median", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "plain reads best", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "GEMVs / plain reads", "unit": None, "type": "number", "format": ".2f"},
            {"name": "plain reads best / probe", "unit": None, "type": "number", "format": ".2f"},
            {"name": "GEMV sweep median", "unit": "ms", "type": "number", "format": ".3f"},
            {"name": "pass median", "unit": "ms", "type": "number", "format": ".3f"},
            {"name": "GEMVs / pass", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=rows,
        model=spec.name,
        weights=f"random, seed {args.seed}, published shapes (code predictor)",
        quantization=",".join(fmts),
        threads=tcs.replace("-", ","),
        source="vllm-omni-bench gemv",
        compare={"tolerance": 0.15, "key_columns": ["weights", "threads", "weight set"],
                 "columns": ["GEMVs median", "GEMVs best / probe"]},
        run={"l2_bytes_per_core": l2, "l3_bytes": l3, "rounds": rounds, "pass_repeats_per_round": pass_reps,
             "pass_kv_position": PASS_POSITION, "native_isa": isa(args.variant), "variant": args.variant,
             "weight_sets": list(chosen),
             **kernel_settings(args.variant),
             "sets": run_info},
        notes=("GB/s = packed weight bytes (with their scales) decoded per second, 1e9 B/s. A sweep runs the "
               "GEMVs of every matrix of the set one after another, each ending in a barrier, inside one parallel "
               "region (vo_gemv_sweeps); activations are quantised once, before the timing. 'in L2' = half the "
               "L2 cache per thread, 'in L3' = 3/8 of the L3, 'memory' = at least 8x the L3 (matrices of "
               "1024 inputs, about 2 MiB each, copied from one random matrix); 'pass matrices' = the 21 matrices "
               "of one predictor pass, with the pass itself (FusedPredictor.pass_once at KV position 8, as "
               "vllm-omni-bench predictor times it) in the same rounds: 'GEMVs / pass' is the share of the pass "
               "its GEMVs take. 'read probe' = the best sweep of the native probe re-reading a buffer of the "
               "set's size (1 to 4 streams per thread), the best of the rounds. 'plain reads median' = the "
               "median sweep of vo_read_sweeps over the same set in the same rounds: the GEMVs' reads (same "
               "matrices, rows, thread shares, read streams and barriers) with each 64-byte line only added into "
               "an accumulator; 'GEMVs / plain reads' = GEMVs median over plain reads median, 1 where the GEMVs "
               "are held back by their reads alone; 'plain reads best / probe' = how close the GEMVs' way of "
               "reading comes to the probe's one buffer, best sweep against best sweep."
               + (" Quick mode: few sweeps, a smaller memory set; for doctests only, not a figure." if args.quick else "")),
    )
    return 0
