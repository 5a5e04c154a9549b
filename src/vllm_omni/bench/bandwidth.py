"""``vllm-omni-bench bandwidth``: this host's read bandwidth per thread count (the floor's denominator)."""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import add_name, add_output, cpu_threads, resolve_threads, write_measured


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bandwidth", help="read bandwidth at 1..N threads (native and torch probes)")
    p.add_argument("--threads", type=cpu_threads, default=None,
                   help="highest thread count to probe (default: all usable cores); 1..N are measured")
    p.add_argument("--quick", action="store_true", help="256 MiB buffer, fewer sweeps: for doctests, not for figures")
    add_name(p, "cpu-path", "read-bandwidth")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)  # a timed CPU run: its artifact records the core clock


def run(args: argparse.Namespace) -> int:
    from vllm_omni.cpu.bandwidth import read_bandwidth_probes

    top = resolve_threads(args.threads)
    rows = []
    for t in range(1, top + 1):
        r = read_bandwidth_probes(t, quick=args.quick)
        rows.append([t, round(r["native"], 2), round(r["torch"], 2), round(r["best"], 2)])
        print(f"threads {t}: native {r['native']:.1f} GB/s, torch sum {r['torch']:.1f} GB/s")
    write_measured(
        args,
        artifact_id=f"cpu-path/read-bandwidth{'-quick' if args.quick else ''}",
        title="Read bandwidth of this host by thread count",
        columns=[
            {"name": "threads", "unit": None, "type": "number"},
            {"name": "native probe", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "torch sum", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "best", "unit": "GB/s", "type": "number", "format": ".1f"},
        ],
        rows=rows,
        # every thread count probed, as the predictor's sweeps record theirs ("1,2"), not the highest alone
        model=None, weights=None, quantization=None, threads=",".join(str(t) for t in range(1, top + 1)),
        source="vllm-omni-bench bandwidth",
        compare={"tolerance": 0.15, "key_columns": ["threads"], "columns": ["best"]},
        notes=("Best of several sweeps over a "
               + ("256 MiB" if args.quick else "1 GiB")
               + " buffer; GB/s = 1e9 B/s. 'best' is the floor's denominator: the larger of a native "
               "OpenMP wide-load read probe and torch's read-only sum at the same thread count. "
               "A second busy process on a shared machine lowers these figures."),
    )
    return 0
