"""``vllm-omni-bench batch-steps``: what one step costs as more streams step together, and why.

For 1, 2, 4 and 8 streams (``--streams``) of one checkpoint (a random one of the published
shapes by default, as ``speak`` writes), it times the parts of one frame of all of them, each in
the call the server's engine makes (``vllm_omni.tts.batch``): the talker step (one
``forward_rows`` call, each stream at its own position in its own cache), the predictor's
fifteen passes (one ``frames`` call), and the decoder (each stream's four-frame chunk in turn,
its state swapped in: decoding is not shared). From these: the step, each stream's RTF if the
step were all it did, the audio seconds a wall second could serve, and the talker's weight
bytes read per second (it reads each weight once per step whatever the number of rows, so
where that rate stops rising with more rows, the step has become compute-bound).
"""

from __future__ import annotations

import argparse
import statistics
import time

from vllm_omni.bench.common import BenchError, add_name, add_output, folder_path, nonnegative_int, positive_int, \
    write_measured

FRAME_MS = 80.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch-steps", help="one frame of 1-8 streams stepped together: talker, predictor, decoder")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None, help="a checkpoint directory (default: as speak)")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--decoder", choices=("auto", "fp32", "bf16"), default="auto", help="the decoder's precision")
    p.add_argument("--threads", type=positive_int, default=None, help="threads (default: all usable)")
    p.add_argument("--streams", default="1,2,4,8", help="comma-separated stream counts (default 1,2,4,8)")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed calls per part (default 15; quick 2)")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_name(p, "serving", "batch-steps-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def _median_ms(fn, repeats: int) -> float:
    """The median ms of ``repeats`` calls of ``fn``, after one untimed call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.bench.speak import checkpoint_note, random_checkpoint
    from vllm_omni.tts.pipeline import Speech

    try:
        counts = sorted({int(c) for c in args.streams.split(",") if c.strip()})
    except ValueError:
        counts = []
    repeats = args.repeats or (2 if args.quick else 15)
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    speech = Speech.load(model_dir, weights=args.weights, threads=args.threads, max_positions=512,
                         decoder=args.decoder)
    gen, dec = speech.generator, speech.decoder
    limit = gen.batch.max_streams
    if not counts or counts[0] < 1 or counts[-1] > limit:
        raise BenchError(f"--streams must be stream counts from 1 to {limit} separated by commas, got {args.streams!r}")
    talker, predictor = gen.talker, gen.predictor
    g = torch.Generator().manual_seed(0)
    h = talker.hidden
    position = 100  # a place in the cache that a short utterance reaches
    step_rows = talker.lib.vo_max_tokens()
    parts = {}  # streams -> the three timed calls
    for n in counts:
        caches = [talker.native.new_cache() for _ in range(n)]
        for c in caches:  # fill each cache up to the position the timed step is at
            for a in range(0, position, step_rows):
                k = min(step_rows, position - a)
                talker.native.forward_rows(torch.randn(k, h, generator=g) * 0.3, list(range(a, a + k)), [c] * k)
        x = torch.randn(n, h, generator=g) * 0.3
        pcaches = [predictor.new_cache() for _ in range(n)]
        ph, c0 = torch.randn(n, predictor.ht, generator=g), torch.randn(n, predictor.ht, generator=g)
        codes = torch.randint(0, 2048, (4, 16), generator=g)
        states = []
        for _ in range(n):
            dec.reset()
            dec.push(codes)  # a stream some frames in
            states.append(dec.save_state())

        def decode_all(n=n, states=states, codes=codes):
            dec.push_streams([codes] * n, states)  # new states returned, not kept: each round decodes the same place

        parts[n] = (
            lambda n=n, x=x, caches=caches: talker.native.forward_rows(x, [position] * n, caches, head=talker.head),
            lambda n=n, ph=ph, c0=c0, pc=pcaches: predictor.frames(ph, c0, pc, greedy=False, noise_keys=list(range(n))),
            decode_all,
        )
    # rounds over every stream count in turn, so that a host whose speed drifts moves all of them alike
    times: dict[int, list[list[float]]] = {n: [[], [], []] for n in counts}
    for _ in range(repeats):
        for n in counts:
            for i, fn in enumerate(parts[n]):
                times[n][i].append(_median_ms(fn, 1) / (4 if i == 2 else 1))  # the decoder per frame
    rows = []
    for n in counts:
        talker_ms, predictor_ms, decoder_ms = (statistics.median(t) for t in times[n])
        step = talker_ms + predictor_ms + decoder_ms
        rows.append([n, round(talker_ms, 2), round(predictor_ms, 2), round(decoder_ms, 2), round(step, 2),
                     round(step / n, 2), round(step / FRAME_MS, 3), round(n * FRAME_MS / step, 3),
                     round(talker.step_bytes / (talker_ms / 1e3) / 1e9, 1)])
    cfg = speech.ckpt.config
    write_measured(
        args,
        artifact_id=f"serving/batch-steps-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"One frame of several streams stepped together ({cfg.family}, {args.weights}, "
              f"{speech.decoder.precision} decoder)",
        columns=[
            {"name": "streams", "unit": None, "type": "number", "format": ".0f"},
            {"name": "talker step", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "predictor frame", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "decoder", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "step", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "step per stream", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "RTF per stream", "unit": None, "type": "number", "format": ".2f"},
            {"name": "audio s per wall s", "unit": None, "type": "number", "format": ".2f"},
            {"name": "talker weights read", "unit": "GB/s", "type": "number", "format": ".0f"},
        ],
        rows=rows, model=cfg.family,
        weights=checkpoint_note(args, model_dir),
        quantization=args.weights, threads=speech.threads, source="vllm-omni-bench batch-steps",
        compare={"tolerance": 0.25, "key_columns": ["streams"], "columns": ["step"]},
        run={"talker_position": position, "repeats": repeats, "decoder_precision": speech.decoder.precision,
             "talker_step_bytes": talker.step_bytes, "decoder_chunk_frames": 4},
        notes=("Median ms of each part over run.repeats rounds; each round times every stream count in turn "
               "(one call of each part after one untimed one), so that a drift of the host's speed moves them alike. Talker step: one native call with one row per "
               "stream, each at position run.talker_position of its own KV cache, and the codec head on every row. "
               "Predictor frame: one native call running the fifteen passes and the sampling of every stream (each "
               "with its own 16-slot cache and noise key). Decoder: every stream's four-frame chunk decoded in turn, "
               "its own state swapped in, per frame (decoding is not shared between streams). Step: their sum, "
               "one frame of every stream, sampling of c0 and bookkeeping left out. RTF per stream: the step over "
               "80 ms; audio s per wall s: streams x 80 ms over the step. Talker weights read: the talker's packed "
               "weight bytes (run.talker_step_bytes) over its step time. Random weights: speed does not depend on "
               "the values.") + (" Quick mode: a shallow checkpoint, not a figure." if args.quick else ""),
    )
    return 0
