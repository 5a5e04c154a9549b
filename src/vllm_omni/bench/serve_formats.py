"""``vllm-omni-bench serve-formats``: what each response format and delivery costs a client.

It starts ``qwen3-tts-edge serve`` on 127.0.0.1 (as ``serve-load`` does) and sends one client's
requests one after another: every format whole, streamed and as server-sent events, and speeds
other than 1. For each it records when the first bytes came (or the first ``speech.audio.delta`` event),
the request's RTF and the bytes per second of audio, medians over ``--repeats`` rounds sent
interleaved. Beside them, in this process, what the encoder and the speed change cost on the
same audio (the server's own PCM of the first prompt): milliseconds of one core per second of
audio, fed in four-frame chunks as the server feeds them.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time

from vllm_omni.bench.common import (
    BenchError, add_name, add_output, folder_path, nonnegative_int, positive_int, write_measured,
)

PROMPT = "Streaming audio starts playing before the sentence is finished, in the format the client asked for."
SPEAKER, LANGUAGE, RATE, CHUNK = "ryan", "english", 24000, 4 * 1920
CASES = ([(fmt, delivery, 1.0) for fmt in ("mp3", "opus", "flac", "wav", "pcm")
          for delivery in ("whole", "stream", "sse")]
         + [("pcm", "stream", 0.5), ("pcm", "stream", 2.0), ("mp3", "stream", 1.5)])


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-formats", help="first audio, RTF and size of each response format, stream and SSE")
    p.add_argument("--model", choices=("0.6B", "1.7B"), default="0.6B", help="size of the random checkpoint")
    p.add_argument("--model-dir", type=folder_path, default=None, help="a checkpoint directory (default: as speak)")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--threads", type=positive_int, default=None, help="the server's threads (default: all usable)")
    p.add_argument("--frames", type=positive_int, default=None, help="frames per request (default 50; quick 3)")
    p.add_argument("--repeats", type=positive_int, default=None, help="rounds of every case (default 5; quick 1)")
    p.add_argument("--quick", action="store_true", help="a shallow checkpoint, short requests: for doctests only")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random checkpoint")
    add_name(p, "serving", "formats-<model>")
    add_output(p)
    p.set_defaults(func=run, core_clock=True)


def _request(base: str, fmt: str, delivery: str, speed: float) -> dict:
    """One request: its first bytes (of the body, or of the first delta event), total time, bytes of audio."""
    import httpx

    body = {"model": "bench", "input": PROMPT, "voice": SPEAKER, "language": LANGUAGE, "response_format": fmt,
            "speed": speed, "stream": delivery == "stream"}
    if delivery == "sse":
        body["stream_format"] = "sse"
    t0 = time.perf_counter()
    first, audio = None, bytearray()
    with httpx.stream("POST", f"{base}/v1/audio/speech", json=body, timeout=600) as r:
        if r.status_code != 200:
            r.read()
            raise BenchError(f"{fmt} {delivery}: HTTP {r.status_code}: {r.text[:300]}")
        if delivery == "sse":
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "speech.audio.delta":
                        first = first or time.perf_counter() - t0
                        audio += base64.b64decode(event["audio"])
                    elif event["type"] == "speech.audio.error":
                        raise BenchError(f"{fmt} sse: {event['error']}")
        else:
            for part in r.iter_raw():
                if part:
                    first = first or time.perf_counter() - t0
                    audio += part
    return {"first_s": first, "total_s": time.perf_counter() - t0, "bytes": bytes(audio)}


def _cpu_ms_per_audio_s(fn, samples, repeats: int) -> float:
    """Median process CPU time of ``fn(samples)`` per second of audio, in ms."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn(samples)
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3 / (len(samples) / RATE)


def _chunked(make):
    """A run of ``make()``'s stage (an encoder or a speed change: ``add``, then ``finish``) over samples fed in
    four-frame chunks, as the server feeds it."""
    def go(samples):
        stage = make()
        for i in range(0, len(samples), CHUNK):
            stage.add(samples[i:i + CHUNK])
        stage.finish()
    return go


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from vllm_omni.bench.serve_load import _Server
    from vllm_omni.bench.speak import checkpoint_note, random_checkpoint
    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.encode import Encoder
    from vllm_omni.tts.time_stretch import TimeStretch

    frames = args.frames or (3 if args.quick else 50)
    repeats = args.repeats or (1 if args.quick else 5)
    model_dir = args.model_dir or random_checkpoint(args.model, args.seed, args.quick)
    cfg = load_config(model_dir)
    server = _Server(model_dir, args.weights, args.threads, frames, 1, 4)
    try:
        ready_s = server.wait_ready()
        pcm = _request(server.base, "pcm", "whole", 1.0)["bytes"]  # also warms the server up
        results: dict[tuple, list[dict]] = {case: [] for case in CASES}
        for _ in range(repeats):  # rounds interleave the cases: drift in the host hits each alike
            for case in CASES:
                results[case].append(_request(server.base, *case))
    finally:
        server.stop()
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767.0
    audio_s = len(samples) / RATE
    cpu_repeats = max(3, repeats)
    encode_ms = {fmt: _cpu_ms_per_audio_s(_chunked(lambda f=fmt: Encoder(f, RATE)), samples, cpu_repeats)
                 for fmt in ("mp3", "opus", "flac", "wav", "pcm")}
    stretch_ms = {speed: _cpu_ms_per_audio_s(_chunked(lambda v=speed: TimeStretch(v, RATE)), samples, cpu_repeats)
                  for speed in sorted({c[2] for c in CASES if c[2] != 1.0})}
    rows = []
    for fmt, delivery, speed in CASES:
        got = results[(fmt, delivery, speed)]
        out_s = audio_s / speed
        rows.append([fmt, delivery, speed,
                     round(statistics.median(r["first_s"] for r in got) * 1e3, 1),
                     round(statistics.median(r["total_s"] for r in got) / out_s, 3),
                     round(statistics.median(len(r["bytes"]) for r in got) / out_s),
                     round(encode_ms[fmt], 2),
                     round(stretch_ms[speed], 2) if speed != 1.0 else None])
    write_measured(
        args,
        artifact_id=f"serving/formats-{args.model.lower()}" + ("-quick" if args.quick and not args.name else ""),
        title=f"Each response format, streamed, whole and as server-sent events ({cfg.family}, {args.weights}, "
              "one client on loopback)",
        columns=[
            {"name": "format", "unit": None, "type": "text"},
            {"name": "delivery", "unit": None, "type": "text"},
            {"name": "speed", "unit": None, "type": "number", "format": ".2f"},
            {"name": "first bytes", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF", "unit": None, "type": "number", "format": ".2f"},
            {"name": "bytes per audio second", "unit": "B", "type": "number", "format": ".0f"},
            {"name": "encode per audio second", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "speed change per audio second", "unit": "ms", "type": "number", "format": ".1f"},
        ],
        rows=rows, model=cfg.family, weights=checkpoint_note(args, model_dir), quantization=args.weights,
        threads=args.threads or "all", source="vllm-omni-bench serve-formats",
        compare={"tolerance": 0.25, "key_columns": ["format", "delivery", "speed"], "columns": ["RTF"]},
        run={"prompt": PROMPT, "speaker": SPEAKER, "language": LANGUAGE, "frames_per_request": frames,
             "repeats": repeats, "audio_s": round(audio_s, 3), "server_command": server.cmd[1:],
             "server_ready_s": round(ready_s, 2), "cpu_repeats": cpu_repeats, "chunk_samples": CHUNK},
        notes=("One client sends each case in turn (rounds interleaved; medians of run.repeats). First bytes: from "
               "sending the request to the first body bytes, or to the first speech.audio.delta event (sse); a whole "
               "response's first bytes come when it is complete. Streamed opus and flac begin with their headers "
               "(Ogg's first pages, FLAC's STREAMINFO): their first audio follows an Ogg page (about a second of "
               "audio) or a FLAC block later. RTF: the request's wall time over the audio it "
               "returns (at a speed other than 1, the audio is shorter or longer). Bytes per audio second: the "
               "audio bytes (decoded from base64 for sse) over that audio's length. Encode and speed change per "
               "audio second: this process's CPU time to encode (vllm_omni.tts.encode) or stretch "
               "(vllm_omni.tts.time_stretch) the server's PCM of the prompt in four-frame chunks, per second of "
               "input audio, median of run.cpu_repeats. Random weights of the published shapes: every request is "
               "cut at run.frames_per_request frames.")
              + (" Quick mode: a shallow checkpoint and short requests, not a figure." if args.quick else ""),
    )
    return 0
