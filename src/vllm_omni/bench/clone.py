"""``vllm-omni-bench clone``: cloning a voice and speaking in it, against a preset voice and the official code.

On a Base checkpoint of the published shapes (random weights, written once) and a CustomVoice one
beside it, with a reference of real speech (the English test recording twice: 10.0 s at 22050
Hz), it times, per thread count:

- making a voice: the speaker embedding and the reference codes of the 10 s reference;
- getting an in-context voice ready to speak: the decoder primed on its reference codes, once
  per voice (``Speech.prepare_voice``);
- speaking: first audio and RTF in an x-vector voice, an in-context voice (its prompt holds every
  reference frame) and a CustomVoice preset speaker, each utterance ``--frames`` frames long.

With ``--official`` it runs the official ``create_voice_clone_prompt`` and ``generate_voice_clone``
(fp32, its own environment) on the same checkpoint, reference, text and length, so the speed-up
is measured in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from vllm_omni.bench.common import BenchError, add_name, add_output, nonnegative_int, positive_int, write_measured

TEXT = "Hello! This short sentence is spoken on two CPU cores, one frame at a time."
EN = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old tree."
REFERENCE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "speech" / "reference-en.wav"
QUICK_SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384,
                   encoder_layers=2)
MODES = ("x_vector", "icl")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clone", help="cloning a voice and speaking in it: encode times, first audio, RTF, vs qwen-tts")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoints")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--thread-counts", default=None, help="comma-separated thread counts (default: 1 and all usable)")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per utterance (default 40; --quick 3)")
    p.add_argument("--repeats", type=positive_int, default=None, help="runs per setting (default 3; --quick 1)")
    p.add_argument("--official", action="store_true", help="also time the official qwen-tts (fp32) on the same checkpoint")
    p.add_argument("--quick", action="store_true", help="shallow checkpoints and a few frames: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoints")
    add_name(p, "end-to-end", "clone-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def reference_10s(folder: Path) -> Path:
    """The English test recording twice over (10.0 s at its own 22050 Hz), as a WAV in ``folder``."""
    import numpy as np
    import soundfile as sf

    samples, rate = sf.read(REFERENCE, dtype="int16")
    out = folder / "reference-10s.wav"
    sf.write(out, np.concatenate([samples, samples]), rate, subtype="PCM_16")
    return out


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def _speak(speech, frames: int, repeats: int, **kw) -> dict:
    """Median first audio (ms), RTF and prefill of ``repeats`` utterances of ``frames`` frames."""
    speech.synthesize(TEXT, max_frames=2, **kw)  # warm-up
    runs = []
    for r in range(repeats):
        speech.synthesize(TEXT, seed=r, max_frames=frames, **kw)
        runs.append(speech.last_stats)
    return {"first_audio_ms": _median([s.first_audio_s * 1e3 for s in runs]), "rtf": _median([s.rtf for s in runs]),
            "rtf_range": [round(min(s.rtf for s in runs), 3), round(max(s.rtf for s in runs), 3)],
            "prefill_ms": _median([s.generation.prefill_ms for s in runs]),
            "prefill_positions": runs[0].generation.prefill_positions, "frames": runs[0].frames}


def _ours(base: Path, custom: Path, reference: Path, fmt: str, threads: int, frames: int, repeats: int) -> list[dict]:
    import gc

    from vllm_omni.tts.pipeline import Speech
    from vllm_omni.tts.reference_audio import read_reference

    rows = []
    speech = Speech.load(base, weights=fmt, threads=threads, max_positions=1024)
    audio = read_reference(reference)
    voices = {}
    embed_ms, codes_ms, prime_ms = [], [], []
    for _ in range(repeats + 1):  # the first makes the encoders (reads their weights): not timed
        voice = speech.clone(audio, EN)
        embed_ms.append(voice.made["speaker_encoder_ms"])
        codes_ms.append(voice.made["speech_encoder_ms"])
        t0 = time.perf_counter()
        speech.prepare_voice(voice)
        prime_ms.append((time.perf_counter() - t0) * 1e3)
        voices["icl"] = voice
    voices["x_vector"] = speech.clone(audio, x_vector_only=True)
    encode = {"speaker_embedding_ms": _median(embed_ms[1:]), "reference_codes_ms": _median(codes_ms[1:]),
              "prime_ms": _median(prime_ms[1:]), "reference_s": round(audio.seconds, 2),
              "reference_frames": int(voices["icl"].codes.shape[0])}
    for mode in MODES:
        rows.append({"setting": f"ours {fmt} t{threads} {mode.replace('_', '-')}", "impl": "this project",
                     "threads": threads, "mode": mode, **encode, **_speak(speech, frames, repeats, voice=voices[mode],
                                                                          language="english")})
    del speech
    gc.collect()
    speech = Speech.load(custom, weights=fmt, threads=threads, max_positions=1024)
    rows.append({"setting": f"ours {fmt} t{threads} preset speaker", "impl": "this project", "threads": threads,
                 "mode": "preset", **_speak(speech, frames, repeats, speaker="ryan", language="english")})
    del speech
    gc.collect()
    return rows


def _official(base: Path, reference: Path, threads: int, frames: int, repeats: int) -> dict:
    from vllm_omni.testing import official

    with tempfile.TemporaryDirectory(prefix="vo-official-clone-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "out.json"
        req.write_text(json.dumps({"reference": str(reference), "ref_text": EN, "text": TEXT, "language": "english",
                                   "max_new_tokens": frames + 1, "repeats": repeats, "threads": threads}))
        official.run_side("bench_clone", base, req, out, threads=threads, timeout=3600)
        return json.loads(out.read_text())


def run(args: argparse.Namespace) -> int:
    from vllm_omni.bench.speak import random_checkpoint, sweep
    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.random_checkpoint import write_random_checkpoint

    counts, frames, repeats = sweep(args)
    custom = random_checkpoint(args.model, args.seed, args.quick)
    base = custom.parent / (custom.name.replace("-random-", "-base-random-"))
    if not (base / "speech_tokenizer" / "model.safetensors").is_file():
        write_random_checkpoint(base, args.model, seed=args.seed, overwrite=True, model_type="base",
                                **(QUICK_SHAPE if args.quick else {}))
    cfg = load_config(base)
    if not REFERENCE.is_file():
        raise BenchError(f"{REFERENCE}: the reference recording is missing (the benchmark runs from a checkout)")
    rows: list[dict] = []
    official_runs = {}
    with tempfile.TemporaryDirectory(prefix="vo-clone-bench-") as tmp:
        reference = reference_10s(Path(tmp))
        for t in counts:
            rows += _ours(base, custom, reference, args.weights, t, frames, repeats)
        if args.official:
            for t in counts:
                official_runs[t] = _official(base, reference, t, frames, repeats)
    for t, res in official_runs.items():
        for mode in MODES:
            runs = [r for r in res["runs"] if r["mode"] == mode]
            total = statistics.median(r["generate_s"] for r in runs)
            n = max(1, runs[0]["frames"])
            rows.append({"setting": f"official fp32 t{t} {mode.replace('_', '-')}", "impl": "official qwen-tts",
                         "threads": t, "mode": mode, "first_audio_ms": round(total * 1e3, 1),
                         "rtf": round(total / (n * 0.08), 3), "frames": n,
                         "encode_ms": _median([r["prompt_s"] * 1e3 for r in runs])})
    best = {(r["threads"], r["mode"]): r for r in rows if r["impl"] != "this project"}
    table = []
    for r in rows:
        ref = best.get((r["threads"], r["mode"]))
        speedup = round(ref["rtf"] / r["rtf"], 2) if ref and r["impl"] == "this project" else None
        encode = r.get("encode_ms") if r["impl"] != "this project" else (
            round(r["speaker_embedding_ms"] + (r["reference_codes_ms"] if r["mode"] == "icl" else 0), 1)
            if "speaker_embedding_ms" in r else None)
        table.append([r["setting"], r["impl"], r["threads"], r["mode"], r.get("prefill_positions"), encode,
                      r.get("prime_ms") if r["mode"] == "icl" else None, r["first_audio_ms"], r.get("prefill_ms"),
                      r["rtf"], speedup])
    weights_note = "random, shallow (quick)" if args.quick else f"random, seed {args.seed}, published shapes"
    write_measured(
        args,
        artifact_id=f"end-to-end/clone-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"Cloning a voice and speaking in it ({cfg.family}, {args.weights}), against a preset voice and "
              "the official code",
        columns=[
            {"name": "setting", "unit": None, "type": "text"},
            {"name": "implementation", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number", "format": ".0f"},
            {"name": "voice", "unit": None, "type": "text"},
            {"name": "prefill positions", "unit": None, "type": "number", "format": ".0f"},
            {"name": "making the voice", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "priming the decoder", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "first audio", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "prefill", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF", "unit": None, "type": "number", "format": ".2f"},
            {"name": "speed-up over official", "unit": None, "type": "number", "format": ".1f"},
        ],
        rows=table, model=cfg.family, weights=weights_note, quantization=args.weights,
        threads=",".join(map(str, counts)), source="vllm-omni-bench clone",
        compare={"tolerance": 0.25, "key_columns": ["setting"], "columns": ["RTF", "first audio"]},
        run={"text": TEXT, "ref_text": EN, "language": "english", "frames_per_utterance": frames, "repeats": repeats,
             "reference": "tests/fixtures/speech/reference-en.wav twice over, 22050 Hz",
             "ours": {r["setting"]: {k: v for k, v in r.items() if k not in ("setting", "impl")} for r in rows
                      if r["impl"] == "this project"},
             "official": {str(t): res.get("versions") for t, res in official_runs.items()} or None},
        notes=("Random weights of the published shapes: speed does not depend on the values; how alike the clone "
               "sounds cannot be judged from them. Making the voice: the speaker embedding, plus for in context the "
               "reference codes, of the 10.0 s reference (median of the repeats after a first that reads the "
               "encoders' weights); the official row times create_voice_clone_prompt, which also reads and "
               "resamples the file. Priming the decoder: decoding the reference codes once per voice, before its "
               "first utterance (not in first audio). First audio: from the request to the first decoded chunk, "
               "prompt and prefill included; the official code does not stream, so its first audio is the whole "
               "generate_voice_clone (its decode of the reference in front included). RTF: wall time over audio "
               "time. Each utterance is run.frames_per_utterance frames (random weights rarely say EOS); the "
               "preset speaker row speaks with a CustomVoice checkpoint of the same shapes.")
              + (" Quick mode: shallow checkpoints and three frames, not a figure." if args.quick else ""),
    )
    return 0
