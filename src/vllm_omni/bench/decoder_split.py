"""``vllm-omni-bench decoder-split``: where the streaming decoder's time goes, against what the host can do.

For each decoder precision (fp32; bf16 where the CPU multiplies it natively; int8 where it
multiplies int8 in SIMD) and thread
count, it pushes an utterance in the chunks the pipeline uses once it streams (four frames a
call) and times each stage of ``StreamingDecoder.push`` (``StreamingDecoder.stages``): ms per
frame, multiply-adds per frame from the weights' shapes, and the rate those make. In the same
run it times a large matrix product (2048 x 2048 x 2048, PyTorch's oneDNN/BLAS path) in the
same precision and thread count: the rate a stage would reach if it were one large GEMM. A
stage near that rate is limited by arithmetic; far below, by its shape (short calls, few
channels, data movement between layers). int8 has no large product in PyTorch to time: its
"of a large matmul" is left empty.

``--build no-bf16`` (or ``no-amx``) runs the decoder on another build of the kernels: this CPU's
without AMX and AVX-512 BF16, the loops a CPU with AVX-512 VNNI alone runs (Ice Lake, Cascade
Lake). Its times are this CPU's running those loops, not another CPU's.
"""

from __future__ import annotations

import argparse
import statistics
import time

from vllm_omni.bench.common import BenchError, add_build, add_name, add_output, folder_path, nonnegative_int, \
    on_build, positive_int, thread_counts, write_measured

CHUNK = 4  # frames a call, as the pipeline once it streams (pipeline.chunk_schedule)
MATMUL = 2048


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decoder-split", help="the streaming decoder stage by stage, against a large matmul's rate")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None, help="a checkpoint directory (default: as speak)")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts (default: 1 and all usable)")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per timed utterance (default 32; quick 8)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed utterances per setting (default 5; quick 1)")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_build(p)
    add_name(p, "end-to-end", "decoder-split-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def matmul_gmacs(precision: str, repeats: int = 5) -> float:
    """Multiply-adds per second (G) of a large square matrix product in ``precision`` (best of ``repeats``)."""
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL, MATMUL, generator=g).to(dtype) for _ in range(2))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return MATMUL ** 3 / best / 1e9


def run(args: argparse.Namespace) -> int:
    return on_build(args, _run)


def _run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.cpu import conv

    from vllm_omni.bench.speak import checkpoint_note, random_checkpoint
    from vllm_omni.tts.checkpoint import load_checkpoint
    from vllm_omni.tts.decoder import StreamingDecoder, bf16_helps, int8_helps

    counts = thread_counts(args) if args.thread_counts else sorted({1, thread_counts(args)[0]})
    frames = args.frames or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 5)
    if frames % CHUNK:
        raise BenchError(f"--frames must be a multiple of {CHUNK} (the frames a call), got {frames}")
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    ck = load_checkpoint(model_dir)
    codes = torch.randint(0, ck.config.decoder.spec.codebook_size, (frames, ck.config.decoder.spec.quantizers),
                          generator=torch.Generator().manual_seed(0))
    # bf16 where its convs are native in this build (not PyTorch's, which another build cannot change)
    precisions = ("fp32",) + (("bf16",) if bf16_helps() and (args.build == "native" or conv.available()) else ()) + (
        ("int8",) if int8_helps() else ())
    rows, matmul, snr, ref = [], {}, {}, None
    for precision in precisions:
        dec = StreamingDecoder(ck.decoder, ck.config.decoder, precision)
        stages = dec.stages()
        total_macs = sum(m for _, m in stages)
        for t in counts:
            torch.set_num_threads(t)
            rate = matmul_gmacs(precision) if precision != "int8" else None
            if rate is not None:
                matmul[f"{precision}-t{t}"] = round(rate, 1)
            dec.decode(codes[:CHUNK])  # warm-up
            runs: list[dict[str, float]] = []
            for _ in range(repeats):
                dec.reset()
                times: dict[str, float] = {}
                audio = torch.cat([dec.push(codes[a:a + CHUNK], times) for a in range(0, frames, CHUNK)])
                runs.append(times)
            if precision == "fp32":
                ref = audio if ref is None else ref  # what the other precisions are held to
            elif precision not in snr:
                snr[precision] = round(float(10 * torch.log10(ref.pow(2).sum() / (audio - ref).pow(2).sum())), 1)
            ms = {name: statistics.median(r[name] for r in runs) * 1e3 / frames for name, _ in stages}
            whole = sum(ms.values())
            for name, macs in [*stages, ("whole decoder", total_macs)]:
                m = whole if name == "whole decoder" else ms[name]
                gmacs = macs / (m / 1e3) / 1e9
                rows.append([f"{precision} t{t} {name}", precision, t, name, round(m, 3), round(100 * m / whole, 1),
                             round(macs / 1e6, 1), round(gmacs, 1), None if rate is None else round(gmacs / rate, 3)])
    cfg = ck.config
    write_measured(
        args,
        artifact_id=f"end-to-end/decoder-split-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"The streaming decoder stage by stage, against a large matmul's rate ({cfg.family})",
        columns=[
            {"name": "setting", "unit": None, "type": "text"},
            {"name": "precision", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number", "format": ".0f"},
            {"name": "stage", "unit": None, "type": "text"},
            {"name": "ms per frame", "unit": "ms", "type": "number", "format": ".2f"},
            {"name": "share", "unit": "%", "type": "number", "format": ".0f"},
            {"name": "multiply-adds per frame", "unit": "M", "type": "number", "format": ".0f"},
            {"name": "rate", "unit": "GMAC/s", "type": "number", "format": ".0f"},
            {"name": "of a large matmul", "unit": None, "type": "number", "format": ".2f"},
        ],
        rows=rows, model=cfg.family, weights=checkpoint_note(args, model_dir), quantization=",".join(precisions),
        threads=",".join(map(str, counts)), source="vllm-omni-bench decoder-split",
        compare={"tolerance": 0.25, "key_columns": ["setting"], "columns": ["ms per frame"]},
        run={"frames": frames, "frames_per_call": CHUNK, "repeats": repeats, "matmul_size": MATMUL,
             "matmul_gmacs": matmul, "snr_vs_fp32_db": snr, "build": args.build, "conv_loops": {"bf16": conv.path(), "int8": conv.int8_path()}},
        notes=("Median ms per frame of each stage of StreamingDecoder.push over run.repeats utterances of "
               "run.frames random codes, pushed run.frames_per_call frames a call. Multiply-adds per frame: the "
               "products of the stage's weights (StreamingDecoder.stages; attention's own products, a few per "
               "cent of the transformer's, left out). Rate: those over the stage's time. Of a large matmul: that "
               "rate over the best rate of a run.matmul_size-cubed matrix product in the same precision and "
               "thread count timed in the same run (run.matmul_gmacs, GMAC/s). run.snr_vs_fp32_db: each lossy "
               "precision's audio over its difference from the fp32 decode of the same codes (dB). Random weights: "
               "speed does not depend on the values; how far a precision strays from fp32 may.") + (
               f" Built as {args.build} (run.build): the decoder's native loops are those of run.conv_loops; the large "
               "matmul is PyTorch's on this CPU whatever the build." if args.build != "native" else "") + (" Quick mode: a shallow checkpoint, not a figure." if args.quick else ""),
    )
    return 0
