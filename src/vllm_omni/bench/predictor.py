"""``vllm-omni-bench predictor``: per-pass and per-frame time of the code predictor vs its floor.

One run can time the eager reference and the fused kernel interleaved (``--impl both``, the
default), so their ratio and the bandwidth floor come from the same minutes on the same host;
``--impl all`` adds the predictor compiled by ``torch.compile`` (fp32, ``vllm_omni.cpu.compiled``).
For every thread count it runs rounds that alternate the implementations, each round preceded
by the read-bandwidth probes at that thread count.

- per pass: one single-token pass (5 layers, final norm, one ``lm_head``) at KV position 8;
- per frame: the 15 passes of a frame with top-k Gumbel sampling from fixed uniforms,
  reported also divided by 15;
- floor: weight bytes per pass in the format (``vllm_omni.models.predictor_pass_bytes``)
  divided by the best read bandwidth measured in the run; the probes (``vllm_omni.cpu.bandwidth``,
  among them one that re-reads a buffer the size of the pass, as the passes re-read their
  weights) run before every round, and each round's pass median over that round's floor is
  reported too. Each round times its passes after ``PASS_WARMUP`` untimed ones, so that they
  start from the cache state the floor's probe measures;
- reads alone: the floor takes the probe's best sweep, a pass is reported by its median, and
  on a shared host a working set near the size of the L3 reads at very different speeds from
  sweep to sweep. The working-set probe's median sweep says what a pass that only read its
  bytes would score against the floor, and the pass is also put over that.
"""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import (
    BenchError, WEIGHT_FORMATS, add_name, add_output, cpu_threads, median, nonnegative_int, positive_int, thread_counts,
    time_calls, write_measured,
)
from vllm_omni.cpu.native import VARIANT_FLAGS
from vllm_omni.models import get_model, predictor_pass_bytes

FUSED_FORMATS = ("fp32", "int8", "int4")
COMPILED_FORMATS = ("fp32",)  # vllm_omni.cpu.compiled.FORMATS, without importing torch here
IMPLS = {"reference": ["reference"], "compiled": ["compiled"], "fused": ["fused"],
         "both": ["reference", "fused"], "all": ["reference", "compiled", "fused"]}
PASS_POSITION = 8
# Untimed passes before each round's timed ones. The probes and the other implementation run
# just before and push the weights out of the caches; the floor is the working-set probe's best
# sweep, taken once the cache has settled, and on the development host the pass takes about ten
# passes to settle there too (from about 2 to about 1.5 times the floor at 1 thread). In the
# frame loop the talker step comes between frames; `vllm-omni-bench frame` times the passes
# that way.
PASS_WARMUP = 10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predictor", help="time the code predictor (per pass and per frame) against its bandwidth floor")
    p.add_argument("--threads", type=cpu_threads, default=None,
                   help="threads (default: all usable cores); see --thread-counts for a sweep")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts measured in one run, e.g. 1,2")
    p.add_argument("--weights", choices=WEIGHT_FORMATS, default="int4", help="weight format")
    p.add_argument("--impl", choices=tuple(IMPLS), default="both",
                   help="eager reference, torch.compile of the static-cache predictor (fp32), fused kernel, "
                        "reference and fused interleaved in one run (both), or all three (all; with weights other "
                        "than fp32, the two that run them)")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="model size (random weights)")
    p.add_argument("--quick", action="store_true", help="few repetitions: for doctests, not for figures")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--rounds", type=positive_int, default=None, help="interleaved rounds (default 5; --quick 1)")
    p.add_argument("--variant", choices=tuple(VARIANT_FLAGS), default="native",
                   help="build of the fused kernels: this CPU's full ISA (default), AVX2 only, or plain C "
                        "(the fused kernel only)")
    add_name(p, "cpu-path", "predictor-<impl>-<weights>-t<thread counts>[-<model>][-<variant>]")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


class _Reference:
    """Eager ReferencePredictor with a single-pass timer at a fixed KV position."""

    def __init__(self, weights, fmt: str):
        import torch

        from vllm_omni.cpu.reference import ReferencePredictor

        self.torch = torch
        self.p = ReferencePredictor(weights, fmt=fmt)
        h = weights.spec.predictor.hidden
        g = torch.Generator().manual_seed(1)
        self.prefix = (torch.randn(PASS_POSITION, h, generator=g) * 0.5).to(self.p.stack.dtype)
        self.x = (torch.randn(1, h, generator=g) * 0.5).to(self.p.stack.dtype)
        with torch.inference_mode():
            self.p.stack.clear()
            self.p.stack.forward_last(self.prefix)

    def set_threads(self, t: int) -> None:
        self.torch.set_num_threads(t)

    def pass_once(self) -> None:
        with self.torch.inference_mode():
            h = self.p.stack.forward_last(self.x)
            self.p.heads[0](h)
        for c in self.p.stack.caches:  # back to the fixed position
            c.length = PASS_POSITION

    def frame(self, ph, c0, u) -> None:
        self.p.frame(ph, c0, greedy=False, uniforms=u)
        with self.torch.inference_mode():  # restore the pass timer's prefix
            self.p.stack.clear()
            self.p.stack.forward_last(self.prefix)


class _Compiled:
    """The static-cache predictor with its pass compiled; the pass timer feeds one token at
    position 8 through the compiled 1-token graph that passes 2..15 of a frame share."""

    def __init__(self, weights, fmt: str):
        import torch

        from vllm_omni.cpu.compiled import CompiledPredictor

        self.torch = torch
        self.p = CompiledPredictor(weights, fmt=fmt)
        self.x = torch.randn(1, weights.spec.predictor.hidden, generator=torch.Generator().manual_seed(1)) * 0.5
        self.pos = torch.tensor([PASS_POSITION])

    def set_threads(self, t: int) -> None:
        self.torch.set_num_threads(t)  # the next call compiles for t threads: the warm-up pays it

    def pass_once(self) -> None:
        with self.torch.no_grad():
            self.p.pass_logits(self.x, self.pos, self.p.heads[0])

    def frame(self, ph, c0, u) -> None:
        self.p.frame(ph, c0, u)


class _Fused:
    def __init__(self, weights, fmt: str, threads: int, variant: str = "native"):
        import torch

        from vllm_omni.cpu.predictor import FusedPredictor

        self.p = FusedPredictor(weights, fmt=fmt, threads=threads, variant=variant)
        self.x = torch.randn(1, weights.spec.predictor.hidden, generator=torch.Generator().manual_seed(1)) * 0.5

    def set_threads(self, t: int) -> None:
        self.p.set_threads(t)

    def pass_once(self) -> None:
        self.p.pass_once(self.x, position=PASS_POSITION, head=0)

    def frame(self, ph, c0, u) -> None:
        self.p.frame(ph, c0, greedy=False, uniforms=u)


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu.bandwidth import read_bandwidth_probes
    from vllm_omni.cpu.native import isa, kernel_settings
    from vllm_omni.cpu.placement import recorded_round_trip
    from vllm_omni.cpu.sampler import draw_uniforms
    from vllm_omni.cpu.weights import random_predictor_weights

    spec = get_model(args.model)
    counts = thread_counts(args)
    impls = IMPLS[args.impl]
    for impl, formats in (("fused", FUSED_FORMATS), ("compiled", COMPILED_FORMATS)):
        if impl in impls and args.weights not in formats:
            if args.impl == impl or impl == "fused":  # both or all without the fused kernel is no comparison
                alone = "" if args.impl == impl else "; --impl reference times the eager predictor alone"
                raise BenchError(f"the {impl} predictor supports --weights {', '.join(formats)}, not {args.weights}{alone}")
            impls = [i for i in impls if i != impl]  # all: compiled runs fp32 only
    if args.variant != "native" and "fused" not in impls:
        raise BenchError(f"--variant picks a build of the fused kernels, which --impl {args.impl} does not run")
    rounds = args.rounds or (1 if args.quick else 5)
    pass_reps, frame_reps = (3, 1) if args.quick else (20, 2)
    pass_warmup = 1 if args.quick else PASS_WARMUP

    w = random_predictor_weights(spec, seed=args.seed)
    make = {"reference": lambda: _Reference(w, args.weights), "compiled": lambda: _Compiled(w, args.weights),
            "fused": lambda: _Fused(w, args.weights, max(counts), args.variant)}
    runners = {}
    for impl in impls:
        try:
            runners[impl] = make[impl]()
        except (ValueError, NotImplementedError, RuntimeError, OSError) as exc:
            raise BenchError(f"--impl {impl} cannot run --weights {args.weights}: {exc}") from None
    g = torch.Generator().manual_seed(args.seed + 1)
    ph = torch.randn(spec.talker.hidden, generator=g)
    c0 = w.codec_embedding[0, 7].clone()
    u = draw_uniforms(g, spec.residual_codebooks, spec.codebook_size)
    nbytes = predictor_pass_bytes(spec, args.weights)
    passes = spec.residual_codebooks

    rows, bandwidth, round_trips = [], {}, {}
    for t in counts:
        samples = {impl: {"pass": [], "frame": []} for impl in impls}
        paired = {impl: [] for impl in impls}  # per round: pass median / that round's floor
        probes = []
        for r in runners.values():
            r.set_threads(t)
            r.pass_once()
            r.frame(ph, c0, u)  # warm-up
        for _ in range(rounds):
            # The probes run before every round: this host's bandwidth moves between runs
            # (the placement of its vCPUs), and the floor takes the best reading of the run.
            # At 2 threads or more the round trip between two cores, before the probes and
            # after the round's timings, says which placement the round met.
            trip_before = recorded_round_trip(t)
            bw = read_bandwidth_probes(t, quick=args.quick, working_set=nbytes)
            probes.append(bw)
            round_floor_ms = nbytes / (bw["best"] * 1e9) * 1e3
            for impl, r in runners.items():
                ps = time_calls(r.pass_once, repeats=pass_reps, warmup=pass_warmup)
                samples[impl]["pass"] += ps
                paired[impl].append(median(ps) / round_floor_ms)
                samples[impl]["frame"] += time_calls(lambda r=r: r.frame(ph, c0, u), repeats=frame_reps, warmup=0)
            if t >= 2:
                round_trips.setdefault(str(t), []).append([trip_before, recorded_round_trip(t)])
        best = max(p["best"] for p in probes)
        stream = max(max(p["native"], p["torch"]) for p in probes)
        working_set = max(p["working_set"] for p in probes)
        # a pass that only read its bytes, at the working-set probe's median sweep (median over rounds)
        ws_median = median([p["working_set_median"] for p in probes])
        bandwidth[str(t)] = {k: [round(p[k], 2) for p in probes] for k in probes[0]} | {"run_best": round(best, 2)}
        floor_ms = nbytes / (best * 1e9) * 1e3
        for impl in impls:
            p_med, p_min = median(samples[impl]["pass"]), min(samples[impl]["pass"])
            f_med = median(samples[impl]["frame"])
            per_round, over_stream = median(paired[impl]), p_med / (nbytes / (stream * 1e9) * 1e3)
            rows.append([
                impl, args.weights, t, round(p_med, 3), round(p_min, 3), round(f_med, 2), round(f_med / passes, 3),
                round(best, 2), round(floor_ms, 3), round(p_med / floor_ms, 3), round(f_med / passes / floor_ms, 3),
                round(per_round, 3), round(stream, 2), round(working_set, 2), round(over_stream, 3),
                round(ws_median, 2), round(best / ws_median, 3), round(p_med / (nbytes / (ws_median * 1e9) * 1e3), 3),
            ])
            print(f"{impl:9s} {args.weights} t={t}: pass {p_med:.2f} ms (min {p_min:.2f}), frame {f_med:.1f} ms "
                  f"({f_med / passes:.2f}/pass), floor {floor_ms:.2f} ms/pass at {best:.1f} GB/s, "
                  f"pass/floor {p_med / floor_ms:.2f} (paired by round {per_round:.2f}; over the "
                  f"{stream:.1f} GB/s streaming floor {over_stream:.2f}; reads alone at the working-set "
                  f"probe's median {ws_median:.1f} GB/s would score {best / ws_median:.2f})")
    ref_vs_fused = None
    if {"reference", "fused"} <= set(impls):
        pass_ms = {(r[0], r[2]): r[3] for r in rows}
        ref_vs_fused = {str(t): round(pass_ms["reference", t] / pass_ms["fused", t], 2) for t in counts}
    model = "" if args.model == "0.6B" else f"-{args.model.lower()}"
    tcs = "-".join(str(t) for t in counts)
    write_measured(
        args,
        artifact_id=(f"cpu-path/predictor-{args.impl}-{args.weights}-t{tcs}{model}"
                     f"{'' if args.variant == 'native' else '-' + args.variant}{'-quick' if args.quick else ''}"),
        title=f"Code predictor per pass and per frame vs the bandwidth floor ({args.model}, {args.weights})",
        columns=[
            {"name": "impl", "unit": None, "type": "text"},
            {"name": "weights", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number"},
            {"name": "pass median", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "pass min", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "frame median", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "frame / 15", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "read bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "floor per pass", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "pass / floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "frame pass / floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "pass / round floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "stream bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "working-set bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "pass / stream floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "working-set median", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "reads alone / floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "pass / reads alone", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=rows,
        model=spec.name,
        weights=f"random, seed {args.seed}, published shapes",
        quantization=args.weights,
        threads=",".join(str(t) for t in counts),
        source=f"vllm-omni-bench predictor ({args.impl})",
        compare={"tolerance": 0.15, "key_columns": ["impl", "weights", "threads"],
                 "columns": ["pass median", "frame median", "pass / floor", "frame pass / floor"]},
        run={"bytes_per_pass": nbytes, "read_bandwidth_gbps": bandwidth,
             "native_isa": isa(args.variant) if "fused" in impls else None, "variant": args.variant,
             **kernel_settings(args.variant, used="fused" in impls),
             "rounds": rounds, "pass_warmup_per_round": pass_warmup, "pass_repeats_per_round": pass_reps,
             "frame_repeats_per_round": frame_reps,
             "pass_kv_position": PASS_POSITION, "reference_over_fused_pass": ref_vs_fused,
             "core_round_trip_ns": round_trips},
        notes=("Random weights of the published shapes: speed does not depend on weight values. "
               "Floor = weight bytes per pass in the format (5 blocks + final norm + one lm_head) / 'read bandwidth', "
               "the best read bandwidth measured in the same run at the same thread count: 'stream bandwidth' is "
               "the best of a native wide-load probe and torch sum streaming 1 GiB, 'working-set bandwidth' the "
               "native probe re-reading a buffer the size of the pass (part of it stays in the L3 cache from sweep "
               "to sweep), all probed before every round (each round's figures in provenance.run; at 2 threads or "
               "more, run.core_round_trip_ns has each round's round trip of a cache line between two threads, "
               "before its probes and after its timings, which tells on a VM whether the two cores shared an L3: "
               "vllm-omni-bench placement). 'pass / round "
               "floor' is the median over rounds of each round's pass median over the floor from the probes just "
               "before it; 'pass / stream floor' puts the pass median over the streaming floor alone. 'working-set "
               "median' is the working-set probe's median sweep (the best of its 1 to 4 streams per thread; "
               "median over rounds), and 'reads alone / floor' the floor's bandwidth over it: what a pass that did "
               "nothing but read its bytes, as fast as that median sweep, would score against the floor; 'pass / "
               "reads alone' is the pass median over the time of such a read. Passes are "
               "timed after untimed ones (provenance.run.pass_warmup_per_round) that bring the weights back into "
               "the caches after the probes and the other implementation, the state the floor's probe is in. "
               "Eager reference int8 = torch quantize_dynamic, int4 = torch _weight_int4pack_mm_for_cpu (bf16 "
               "activations); their stored bytes differ slightly from the format's. 'compiled' (fp32 only) is the "
               "static-cache predictor of vllm_omni.gpu.static_frame with its pass under torch.compile (inductor, "
               "fullgraph, static shapes; compiled during each thread count's untimed warm-up); its attention "
               "covers all 16 cache slots with a mask, and its code choices run eagerly. Frames use top-k 50 "
               "Gumbel sampling at temperature 0.9 from fixed uniforms."
               + (" Quick mode: few repetitions, for doctests only, not a figure." if args.quick else "")),
    )
    return 0
