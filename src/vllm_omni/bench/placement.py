"""``vllm-omni-bench placement``: the two threads' core-to-core round trip beside their reads, over time.

Why: on a shared VM the 2-thread floor of every CPU benchmark moves between periods, and the
cause decides how to read a 2-thread ratio. This samples, one after another, the round trip of
a cache line between the two threads and the 2-thread reads (a large buffer streamed, and the
int4 predictor pass's bytes re-read, as the floor's probes do), so that each read can be set
beside the placement of the cores that made it (:mod:`vllm_omni.cpu.placement`).
"""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import BenchError, add_name, add_output, positive_int, write_measured

WORKING_SET = ("0.6B", "int4")  # the model and format whose predictor pass the re-read probe sizes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("placement", help="2-thread core-to-core round trip beside 2-thread reads, sample by sample")
    p.add_argument("--samples", type=positive_int, default=None, help="samples in a row (default 60; --quick 3)")
    p.add_argument("--quick", action="store_true", help="few samples and short re-reads: for doctests, not for figures")
    add_name(p, "cpu-path", "placement-t2")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def run(args: argparse.Namespace) -> int:
    from vllm_omni.cpu.placement import TRIPS, PlacementError, timeline
    from vllm_omni.models import get_model
    from vllm_omni.models.counts import predictor_pass_bytes

    model, fmt = WORKING_SET
    nbytes = predictor_pass_bytes(get_model(model), fmt)
    samples = args.samples or (3 if args.quick else 60)
    try:
        readings = timeline(samples, nbytes, quick=args.quick)
    except PlacementError as exc:
        raise BenchError(str(exc)) from None
    names = ["sample", "seconds", "round trip before", "stream read", "round trip between", "working-set read",
             "round trip after"]
    rows = []
    for r in readings:
        rows.append([r["sample"], round(r["seconds"], 2), round(r["round trip before"], 1), round(r["stream read"], 2),
                     round(r["round trip between"], 1), round(r["working-set read"], 2),
                     round(r["round trip after"], 1)])
        print(f"{r['seconds']:6.1f} s  round trip {r['round trip before']:5.0f} ns  stream {r['stream read']:6.1f} GB/s"
              f"  round trip {r['round trip between']:5.0f} ns  re-read {r['working-set read']:6.1f} GB/s"
              f"  round trip {r['round trip after']:5.0f} ns")
    ns = {"unit": "ns", "type": "number", "format": ".0f"}
    gbs = {"unit": "GB/s", "type": "number", "format": ".1f"}
    kinds = {"sample": {"unit": None, "type": "number"}, "seconds": {"unit": "s", "type": "number", "format": ".1f"},
             "stream read": gbs, "working-set read": gbs}
    write_measured(
        args,
        artifact_id="cpu-path/placement-t2" + ("-quick" if args.quick else ""),
        title="Where the two threads' cores sit, and what two threads read, sample by sample",
        columns=[{"name": n, **kinds.get(n, ns)} for n in names],
        rows=rows,
        model=None, weights=None, quantization=None, threads=2,
        source="vllm-omni-bench placement",
        run={"working_set_bytes": nbytes, "round_trip_trips": TRIPS},
        notes=(f"Each sample, in order: the round trip of one cache line between the two threads of a team of two "
               f"(median of three probes of {TRIPS} trips), the best 2-thread read of a 256 MiB buffer (the native "
               f"probe, 1 to 4 streams per thread), the round trip again, the best 2-thread re-read of a buffer the "
               f"size of the {model} {fmt} predictor pass ({nbytes} bytes), and the round trip again. 'seconds' is "
               "when the sample began. Where the round trips on both sides of a read agree, they say which "
               "placement of the two cores the read met."),
    )
    return 0
