"""``vllm-omni-bench speak``: speech end to end -- time to first audio, RTF and where a frame goes.

It runs the same path as ``qwen3-tts-edge speak`` (``vllm_omni.tts.pipeline.Speech``) on a
checkpoint in the official layout: ``--model-dir``, or a random-weight checkpoint of the
published shapes that it writes once into a cache folder. For every weight format, thread
count and text mode it speaks a fixed text ``--repeats`` times, each utterance ``--frames``
frames long (random weights rarely say EOS, so the length is fixed), and records the medians.
With ``--official`` it also runs the official ``qwen-tts`` (fp32, its own environment) on the
same checkpoint and host, and the decoder alone against the official decode, so the speed-ups
are measured in one run, not quoted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from vllm_omni.bench.common import (
    BenchError, add_build, add_name, add_output, folder_path, nonnegative_int, on_build, parse_list, positive_int,
    thread_counts, write_measured,
)

TEXT = "Hello! This short sentence is spoken on two CPU cores, one frame at a time."
SPEAKER, LANGUAGE = "ryan", "english"
FORMATS = ("int4", "int8", "fp32")  # int4 first: the peak memory recorded with its rows is its own


def weight_choices() -> list[str]:
    """What ``--weights`` takes (each format for both parts, and each mix), in the order the rows are
    measured: fewest fp32 parts first, then fewest int8 ones, so that the peak memory recorded with a
    row, the process's highest so far, is its own."""
    from vllm_omni.tts.weight_choice import weight_parts

    def heavier(w: str) -> tuple[int, int]:
        parts = weight_parts(w)
        return parts.count("fp32"), parts.count("int8")

    return sorted((f"{t}+{p}" if t != p else t for t in FORMATS for p in FORMATS), key=heavier)


MODES = {"streaming": True, "non-streaming": False}
DECODERS = ("auto", "fp32", "bf16", "int8")
CACHE_ENV = "VLLM_OMNI_CHECKPOINTS"
QUICK_SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("speak", help="speech end to end: time to first audio, RTF, a frame's split, vs qwen-tts")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None,
                   help=f"a checkpoint directory (default: a random one of the published shapes, written once "
                        f"under ${CACHE_ENV} or ~/.cache/vllm_omni/checkpoints)")
    p.add_argument("--weights", default=",".join(FORMATS),
                   help="comma-separated formats (default int4,int8,fp32); TALKER+PREDICTOR for a mix, e.g. int4+int8")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts (default: 1 and all usable)")
    p.add_argument("--text-modes", default=",".join(MODES), help="streaming,non-streaming (default both)")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per utterance (default 40; --quick 3)")
    p.add_argument("--repeats", type=positive_int, default=None, help="utterances per setting (default 3; --quick 1)")
    p.add_argument("--decoders", default="auto",
                   help="comma-separated decoder precisions, auto, fp32, bf16 or int8 (default auto: as speak picks)")
    add_build(p)
    p.add_argument("--official", action="store_true",
                   help="also time the official qwen-tts (fp32) end to end and its decoder on the same checkpoint")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint and a few frames: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_name(p, "end-to-end", "speak-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def checkpoint_cache() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm_omni" / "checkpoints"


def random_checkpoint(size: str, seed: int, quick: bool, folder: Path | None = None) -> Path:
    """A random checkpoint of ``size`` (published shapes; shallow with ``quick``), written once and reused."""
    from vllm_omni.tts.random_checkpoint import write_random_checkpoint

    name = f"qwen3-tts-{size}-random-seed{seed}" + ("-quick" if quick else "")
    out = (folder or checkpoint_cache()) / name
    if not (out / "speech_tokenizer" / "model.safetensors").is_file():
        write_random_checkpoint(out, size, seed=seed, overwrite=True, **(QUICK_SHAPE if quick else {}))
    return out


def sweep(args: argparse.Namespace) -> tuple[list[int], int, int]:
    """The thread counts (1 and all usable unless ``--thread-counts``), frames and repeats of a speech
    benchmark, with ``--official`` refused up front when the official environment is missing."""
    from vllm_omni.testing import official

    counts = thread_counts(args) if args.thread_counts else sorted({1, thread_counts(args)[0]})
    if args.official:
        try:
            official.official_python()
        except official.OfficialUnavailable as exc:
            raise BenchError(f"--official: {exc}") from None
    return counts, args.frames or (3 if args.quick else 40), args.repeats or (1 if args.quick else 3)


def checkpoint_note(args: argparse.Namespace, model_dir: Path) -> str:
    """An artifact's ``weights``: the random checkpoint a run wrote (``random_checkpoint``), or the one it was given."""
    if args.model_dir is not None:
        return f"checkpoint {model_dir}"
    return "random, shallow (quick)" if args.quick else f"random, seed {args.seed}, published shapes"


def _timeline_name(name: str | None) -> str | None:
    """The timeline's artifact name beside a ``--name``d utterance table: speak-X -> timeline-X, so that its
    id starts, as the unnamed one does, with end-to-end/timeline-."""
    if name is None:
        return None
    return "timeline-" + (name[len("speak-"):] if name.startswith("speak-") else name)


def _lossy(r: dict, key: str) -> str:
    """``key`` of a row in run, with "-bf16" or "-int8" where the row's decoder ran in that precision."""
    precision = r.get("decoder_precision", "fp32")
    return key if precision == "fp32" else f"{key}-{precision}"


def _key(r: dict) -> str:
    return _lossy(r, f"{r['weights']}-t{r['threads']}-{r['mode']}")


def _peak_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ours(model_dir: Path, fmt: str, threads: int, modes: list[str], frames: int, repeats: int,
          decoder: str) -> list[dict]:
    from vllm_omni.tts.pipeline import Speech
    from vllm_omni.tts.weight_cache import CACHED_FORMATS, cache_path
    from vllm_omni.tts.weight_choice import weight_parts

    cached = [f for f in dict.fromkeys(weight_parts(fmt)) if f in CACHED_FORMATS]
    for f in cached:
        cache_path(model_dir, f).unlink(missing_ok=True)  # the first start packs (and writes the cache)
    t0 = time.perf_counter()
    speech = Speech.load(model_dir, weights=fmt, threads=threads, max_positions=512, decoder=decoder)
    load_s, cached_load_s = time.perf_counter() - t0, None
    if cached and all(cache_path(model_dir, f).is_file() for f in cached):  # a second start, from that cache
        del speech
        gc.collect()
        t0 = time.perf_counter()
        speech = Speech.load(model_dir, weights=fmt, threads=threads, max_positions=512, decoder=decoder)
        cached_load_s = time.perf_counter() - t0
        if not all(c.hit for c in speech.generator.caches):
            raise BenchError(f"{', '.join(str(cache_path(model_dir, f)) for f in cached)}: the second start did not "
                             "read the packed cache")
    speech.synthesize(TEXT, speaker=SPEAKER, language=LANGUAGE, max_frames=2)  # warm-up
    rows = []
    for mode in modes:
        runs, timeline = [], []
        for r in range(repeats):
            first_ready = None
            for chunk in speech.stream(TEXT, speaker=SPEAKER, language=LANGUAGE, streaming_text=MODES[mode], seed=r,
                                       max_frames=frames):
                first_ready = chunk.ready_s if first_ready is None else first_ready
                if r == 0:  # needed at: when playback that starts with the first chunk reaches this one
                    needed = first_ready + chunk.first_frame * 0.08
                    timeline.append([chunk.first_frame, chunk.frames, round((chunk.first_frame + chunk.frames) * 0.08, 3),
                                     round(chunk.ready_s, 4), round(needed, 4), round(max(0.0, chunk.ready_s - needed), 4)])
            runs.append(speech.last_stats)
        split = [s.median_split() for s in runs]
        part = {k: _median([s[k] for s in split]) for k in split[0]}
        rows.append({
            "impl": "this project", "weights": fmt, "threads": threads, "mode": mode,
            "decoder_precision": speech.decoder.precision,
            "first_audio_ms": _median([s.first_audio_s * 1e3 for s in runs]),
            "first_audio_range": [min(s.first_audio_s for s in runs) * 1e3, max(s.first_audio_s for s in runs) * 1e3],
            "prefill_ms": _median([s.generation.prefill_ms for s in runs]),
            "prefill_positions": runs[0].generation.prefill_positions,
            **{f"{k}_ms": v for k, v in part.items()},
            "frame_ms": sum(part.values()),
            "rtf": _median([s.rtf for s in runs]),
            "rtf_range": [min(s.rtf for s in runs), max(s.rtf for s in runs)],
            "frames": runs[0].frames, "load_s": load_s, "cached_load_s": cached_load_s, "peak_rss_gib": _peak_gib(),
            "timeline": timeline,
        })
    del speech
    gc.collect()
    return rows


def _decoder_alone(model_dir: Path, threads: int, frames: int, repeats: int, build: str = "native") -> dict[str, float]:
    """Our decoder's ms per frame: one frame per call, four per call, and the whole utterance in one call, in
    fp32, bf16 (where the CPU multiplies bf16, in the native build) and int8 (where it multiplies int8 in
    SIMD); and each lossy decode's distance from the fp32 one (dB)."""
    import torch

    from vllm_omni.cpu import conv
    from vllm_omni.tts.checkpoint import load_checkpoint
    from vllm_omni.tts.decoder import StreamingDecoder, bf16_helps, int8_helps

    torch.set_num_threads(threads)
    ck = load_checkpoint(model_dir)
    codes = torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(0))
    out, whole = {}, {}
    bf16 = bf16_helps() and (build == "native" or conv.available())  # under another build, only a native bf16
    precisions = ("fp32",) + (("bf16",) if bf16 else ()) + (("int8",) if int8_helps() else ())
    for precision in precisions:
        dec = StreamingDecoder(ck.decoder, ck.config.decoder, precision)
        suffix = "" if precision == "fp32" else f", {precision}"
        for label, chunk in (("1 frame per call", 1), ("4 frames per call", 4), ("whole utterance", frames)):
            times = []
            dec.decode(codes[:4])
            for _ in range(repeats):
                dec.reset()
                t0 = time.perf_counter()
                for a in range(0, frames, chunk):
                    dec.push(codes[a:a + chunk])
                times.append((time.perf_counter() - t0) * 1e3 / frames)
            out[label + suffix] = _median(times)
        whole[precision] = dec.decode(codes)
    for precision in precisions[1:]:
        err = (whole[precision] - whole["fp32"]).pow(2).mean()
        out[f"{precision} SNR against fp32 (dB)"] = float(10 * torch.log10(whole["fp32"].pow(2).mean() / err))
    return out


def _official(model_dir: Path, threads: int, modes: list[str], frames: int, repeats: int, decode_frames: int) -> dict:
    from vllm_omni.testing import official

    with tempfile.TemporaryDirectory(prefix="vo-official-bench-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "out.json"
        prompts = [dict(text=TEXT, speaker=SPEAKER, language=LANGUAGE, non_streaming_mode=not MODES[m],
                        max_new_tokens=frames + 1) for m in modes]
        req.write_text(json.dumps({"prompts": prompts, "repeats": repeats, "threads": threads, "do_sample": True,
                                   "decode_frames": decode_frames}))
        official.run_side("bench", model_dir, req, out, threads=threads, timeout=3600)
        return json.loads(out.read_text())


def run(args: argparse.Namespace) -> int:
    return on_build(args, _run)


def _run(args: argparse.Namespace) -> int:
    import torch

    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.pipeline import decoder_precision
    from vllm_omni.tts.text import assistant_text

    choices = weight_choices()
    formats = parse_list(args.weights, choices, "weights")
    formats = [f for f in choices if f in formats]
    modes = parse_list(args.text_modes, tuple(MODES), "text-modes")
    counts, frames, repeats = sweep(args)
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    try:
        cfg = load_config(model_dir)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    from vllm_omni.tts.text import load_tokenizer

    tok = load_tokenizer(cfg)
    text_tokens = len(tok.encode(assistant_text(TEXT))) - 8
    rows: list[dict] = []
    decoders = parse_list(args.decoders, DECODERS, "decoders")
    for fmt in formats:
        for t in counts:
            for decoder in dict.fromkeys(decoder_precision(d, fmt) for d in decoders):
                rows += _ours(model_dir, fmt, t, modes, frames, repeats, decoder)
    decoder = {t: _decoder_alone(model_dir, t, max(frames, 8), repeats, args.build) for t in counts}
    official_runs = {}
    if args.official:
        for t in counts:
            official_runs[t] = _official(model_dir, t, modes, frames, repeats, max(frames, 8))
    best_official = {}
    for t, res in official_runs.items():
        for mode in modes:
            runs = [r for r in res["runs"] if r["non_streaming_mode"] == (not MODES[mode])]
            gen = _median([r["generate_s"] for r in runs])
            dec = _median([r["decode_s"] for r in runs])
            n = max(1, runs[0]["frames"])
            row = {"impl": "official qwen-tts", "weights": "fp32", "threads": t, "mode": mode,
                   "first_audio_ms": (gen + dec) * 1e3, "prefill_ms": None, "frame_ms": (gen + dec) * 1e3 / n,
                   "decoder_ms": dec * 1e3 / n, "rtf": (gen + dec) / (n * 0.08), "frames": runs[0]["frames"],
                   "load_s": res["load_s"]}
            rows.append(row)
            best_official[(t, mode)] = row
    columns = [
        {"name": "setting", "unit": None, "type": "text"},
        {"name": "implementation", "unit": None, "type": "text"},
        {"name": "weights", "unit": None, "type": "text"},
        {"name": "threads", "unit": None, "type": "number", "format": ".0f"},
        {"name": "text", "unit": None, "type": "text"},
        {"name": "decoder precision", "unit": None, "type": "text"},
        {"name": "first audio", "unit": "ms", "type": "number", "format": ".0f"},
        {"name": "prefill", "unit": "ms", "type": "number", "format": ".1f"},
        {"name": "talker", "unit": "ms", "type": "number", "format": ".1f"},
        {"name": "predictor", "unit": "ms", "type": "number", "format": ".1f"},
        {"name": "sampler", "unit": "ms", "type": "number", "format": ".2f"},
        {"name": "decoder", "unit": "ms", "type": "number", "format": ".1f"},
        {"name": "bookkeeping", "unit": "ms", "type": "number", "format": ".2f"},
        {"name": "frame", "unit": "ms", "type": "number", "format": ".1f"},
        {"name": "RTF", "unit": None, "type": "number", "format": ".3f"},
        {"name": "speed-up over official", "unit": None, "type": "number", "format": ".1f"},
        {"name": "peak memory", "unit": "GiB", "type": "number", "format": ".2f"},
    ]

    def r3(x):
        return None if x is None else round(float(x), 3)

    table = []
    for r in rows:
        ref = best_official.get((r["threads"], r["mode"]))
        speedup = None if ref is None or r["impl"] != "this project" else round(ref["rtf"] / r["rtf"], 2)
        who = "ours" if r["impl"] == "this project" else "official"
        dec = r.get("decoder_precision", "fp32")
        label = f"{who} {r['weights']} t{r['threads']} {r['mode']}" + (f" {dec} decoder" if dec != "fp32" else "")
        table.append([label, r["impl"], r["weights"], r["threads"], r["mode"], dec, r3(r["first_audio_ms"]), r3(r["prefill_ms"]),
                      r3(r.get("talker_ms")), r3(r.get("predictor_ms")), r3(r.get("sampler_ms")),
                      r3(r.get("decoder_ms")), r3(r.get("bookkeeping_ms")), r3(r["frame_ms"]), r3(r["rtf"]), speedup,
                      r.get("peak_rss_gib")])
    spec = cfg.spec
    weights_note = ("random, seed %d, published shapes" % args.seed) if args.model_dir is None and not args.quick else (
        "random, shallow (quick)" if args.quick else f"checkpoint {model_dir}")
    slug = (args.model if args.model_dir is None else cfg.family).lower() + ("-quick" if args.quick and not args.name else "")
    first = next(r for r in rows if r["impl"] == "this project" and r["mode"] == modes[0] and r["threads"] == counts[-1])
    timeline_args = argparse.Namespace(**{**vars(args), "name": _timeline_name(args.name)})
    write_measured(
        timeline_args,
        artifact_id=f"end-to-end/timeline-{slug}",
        title=f"One streamed utterance: when each chunk of audio was ready ({cfg.family}, {first['weights']}, "
              f"{first['threads']} threads, {modes[0]} text)",
        columns=[{"name": "first frame", "unit": None, "type": "number", "format": ".0f"},
                 {"name": "frames", "unit": None, "type": "number", "format": ".0f"},
                 {"name": "audio until", "unit": "s", "type": "number", "format": ".2f"},
                 {"name": "ready at", "unit": "s", "type": "number", "format": ".3f"},
                 {"name": "needed at", "unit": "s", "type": "number", "format": ".3f"},
                 {"name": "playback waits", "unit": "s", "type": "number", "format": ".3f"}],
        rows=first["timeline"], model=cfg.family, weights=weights_note, quantization=first["weights"],
        threads=first["threads"], source="vllm-omni-bench speak",
        compare={"tolerance": 0.25, "key_columns": ["first frame"], "columns": ["ready at"]},
        run={"text": TEXT, "speaker": SPEAKER, "language": LANGUAGE, "frames_per_utterance": frames},
        notes=("The first utterance of the row it comes from in the speak artifact. A chunk is ready when its samples "
               "are decoded. Needed at: when playback that starts as the first chunk is ready reaches the chunk (the "
               "first chunk's ready time plus the audio before it). Playback waits: how long that playback would "
               "stall before the chunk (0 when it is ready in time).")
               + (" Quick mode: not a figure." if args.quick else ""),
    )
    write_measured(
        args,
        artifact_id=f"end-to-end/speak-{slug}",
        title=f"Speech end to end on the CPU ({cfg.family}): first audio, RTF, and where a frame goes",
        columns=columns, rows=table, model=cfg.family, weights=weights_note, quantization=",".join(formats),
        threads=",".join(map(str, counts)), source="vllm-omni-bench speak",
        compare={"tolerance": 0.2, "key_columns": ["setting"],
                 "columns": ["RTF", "frame"]},
        run={
            "text": TEXT, "text_tokens": text_tokens, "speaker": SPEAKER, "language": LANGUAGE,
            "frames_per_utterance": frames, "repeats": repeats,
            "prefill_positions": {r["mode"]: r["prefill_positions"] for r in rows if "prefill_positions" in r},
            "first_audio_range_ms": {_key(r): [round(v, 1) for v in r["first_audio_range"]]
                                     for r in rows if "first_audio_range" in r},
            "rtf_range": {_key(r): [round(v, 3) for v in r["rtf_range"]] for r in rows if "rtf_range" in r},
            "load_s": {r["impl"] + "-" + _lossy(r, f"{r['weights']}-t{r['threads']}"): round(r["load_s"], 2)
                       for r in rows},
            "cached_load_s": {_lossy(r, f"{r['weights']}-t{r['threads']}"): round(r["cached_load_s"], 2)
                              for r in rows if r.get("cached_load_s") is not None} or None,
            "decoder_ms_per_frame": {str(t): {k: round(v, 2) for k, v in d.items()} for t, d in decoder.items()},
            "official": {str(t): {"versions": res.get("versions"),
                                  "decode_only_ms_per_frame": round(_median(res["decode_only"]["seconds"]) * 1e3
                                                                    / res["decode_only"]["frames"], 2)}
                         for t, res in official_runs.items()} or None,
            "talker_layers": spec.talker.layers, "torch_threads": torch.get_num_threads(), "build": args.build,
        },
        notes=("Random weights of the published shapes stand in for the checkpoint: speed does not depend on the "
               "values, voice quality cannot be judged from them. Each row: the medians over the repeats of one "
               "fixed text, speaker and length (run.frames_per_utterance frames of 80 ms; random weights rarely "
               "say EOS). First audio: from the request to the first chunk of samples (one frame decoded), prompt "
               "and prefill included. Talker, predictor, sampler, decoder and bookkeeping: median ms per frame; "
               "frame is their sum. RTF: wall time of the whole utterance (prefill included) over its audio time. "
               "The official qwen-tts does not stream: its first audio is its whole generate plus decode; it "
               "samples as its defaults say, this project with the same rules and its own noise. Peak memory: "
               "the process's peak resident set after that row (formats run int4 first). run.load_s: a first start "
               "(int8 and int4 packed, and the packed weights written next to the checkpoint); run.cached_load_s: "
               "the second start, from that cache, whose speech the row measures. Decoder precision: bf16 runs "
               "the decoder's long convolutions in bf16 (speak's default with int8/int4 weights where the CPU "
               "multiplies bf16). run.decoder_ms_per_frame times the decoder alone on random codes, in fp32 and "
               "bf16, with the bf16 decode's distance from the fp32 one (signal over difference, dB); run.official.decode_only_ms_per_frame the official decode "
               "of the same codes in one call."
               + (" Quick mode: a shallow checkpoint and three frames, for doctests only, not a figure."
                  if args.quick else "")),
    )
    return 0
