"""``vllm-omni-bench gpu-matmul``: the bf16 matmul TFLOPS probe as a measured artifact."""

from __future__ import annotations

import argparse

from vllm_omni.bench.common import BenchError, add_name, add_output, gpu_slug, positive_int, write_measured


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-matmul", help="dense bf16 matmul TFLOPS on cuda:0 (identifies the GPU class)")
    p.add_argument("--n", type=positive_int, default=8192, help="matrix size (default 8192, as in the study)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed iterations (default 20, as in the study)")
    add_name(p, "environment", "gpu-matmul-<gpu>")
    add_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vllm_omni.gpu_probe import matmul_tflops

    try:
        r = matmul_tflops(args.n, args.iters)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    write_measured(
        args,
        artifact_id=f"environment/gpu-matmul-{gpu_slug(r['device'])}",
        title=f"Dense bf16 matmul throughput on {r['device']}",
        columns=[{"name": "measurement", "unit": None, "type": "text"}, {"name": "value", "unit": None, "type": "number"},
                 {"name": "unit", "unit": None, "type": "text"}],
        rows=[[f"bf16 matmul ({r['n']}³, {r['iters']} iterations)", round(r["tflops"], 1), "TFLOPS"],
              ["streaming multiprocessors", r["sms"], "SMs"],
              ["device memory", round(r["memory_gib"], 1), "GiB"]],
        model=None, weights="random", quantization="bf16", threads=None,
        source="vllm-omni-bench gpu-matmul",
        compare={"tolerance": 0.10, "key_columns": ["measurement"], "columns": ["value"]},
    )
    return 0
