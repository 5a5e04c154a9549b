"""The ``qwen3-tts-edge`` command: speak a text with a checkpoint, or write a random-weight one.

    qwen3-tts-edge speak --model DIR --text "Hello." --speaker ryan --language english --out hello.wav
    qwen3-tts-edge clone --model BASE_DIR --ref-audio me.wav --ref-text "What I said." --out me.voice
    qwen3-tts-edge speak --model BASE_DIR --voice me.voice --text "Hello." --out hello.wav
    qwen3-tts-edge random-checkpoint --out DIR [--size 0.6B] [--type base]
    qwen3-tts-edge voices --model DIR
    qwen3-tts-edge serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]

Every argument is checked before a weight is read: a bad path, an unknown speaker or language,
empty text or a thread count out of range ends with one line on standard error and exit
status 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_omni.tts.config import CheckpointError
from vllm_omni.tts.encode import FORMATS

EXIT_BAD_INPUT = 2


def _whole(lo: int, hi: int | None = None):
    """An argparse type: a whole number in lo..hi (no upper bound when hi is None)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = lo - 1
        if n < lo or (hi is not None and n > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be a whole number {bound}, got {text!r}")
        return n

    return parse


_threads, _positive, _count, _port = _whole(1, 1024), _whole(1), _whole(0), _whole(0, 65535)


def _text(args: argparse.Namespace) -> str:
    if args.text is not None and args.text_file is not None:
        raise ValueError("give --text or --text-file, not both")
    if args.text_file is not None:
        src = sys.stdin if args.text_file == "-" else None
        try:
            text = src.read() if src else Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--text-file {args.text_file}: cannot be read ({exc})") from None
    elif args.text is not None:
        text = args.text
    else:
        raise ValueError("give the words to speak with --text or --text-file")
    if not text.strip():
        raise ValueError("the text is empty: give the words to speak")
    return text.strip()


def _ref_text(args: argparse.Namespace) -> str | None:
    if args.ref_text is not None and args.ref_text_file is not None:
        raise ValueError("give --ref-text or --ref-text-file, not both")
    if args.ref_text_file is None:
        return args.ref_text
    try:
        return Path(args.ref_text_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--ref-text-file {args.ref_text_file}: cannot be read ({exc})") from None


def _check_voice_options(cfg, args: argparse.Namespace) -> None:
    """The voice options against the checkpoint's type, before a weight is read: a Base checkpoint speaks in a
    cloned voice (--voice, or --ref-audio to clone one now), the others in preset or described ones."""
    given = [o for o, v in (("--voice", args.voice), ("--ref-audio", args.ref_audio), ("--ref-text", args.ref_text),
                            ("--ref-text-file", args.ref_text_file), ("--x-vector-only", args.x_vector_only)) if v]
    if not cfg.clones:
        if given:
            raise ValueError(f"{given[0]}: {cfg.family} speaks in its preset or described voices; cloned voices need a "
                             "Base checkpoint")
        return
    if args.speaker or args.instruct:
        option = "--speaker" if args.speaker else "--instruct"
        raise ValueError(f"{option}: {cfg.family} speaks in a voice cloned from reference audio (give --voice FILE, or "
                         "--ref-audio FILE with --ref-text or --x-vector-only)")
    if bool(args.voice) == bool(args.ref_audio):
        raise ValueError(f"{cfg.family} speaks in a cloned voice: give --voice FILE (from `qwen3-tts-edge clone`) or "
                         "--ref-audio FILE, not " + ("both" if args.voice else "neither"))
    if args.voice and len(given) > 1:
        raise ValueError(f"{given[1]}: the voice file holds its reference already; give it with --voice alone")
    if args.voice and not Path(args.voice).is_file():
        raise ValueError(f"--voice {args.voice}: no such voice file")
    if args.ref_audio and not Path(args.ref_audio).is_file():
        raise ValueError(f"--ref-audio {args.ref_audio}: no such file")


def speak(args: argparse.Namespace) -> int:
    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.wav import WavWriter, check_output

    text = _text(args)
    check_output(args.out)
    cfg = load_config(args.model)  # configs first: a wrong folder fails in milliseconds
    from vllm_omni.tts.pipeline import Speech
    from vllm_omni.tts.prompt import resolve_language, resolve_speaker

    _check_voice_options(cfg, args)
    ref_text = _ref_text(args)
    resolve_language(cfg, args.language, None if cfg.clones else resolve_speaker(cfg, args.speaker))
    audio = None
    if args.ref_audio:  # read and checked before any weight is
        from vllm_omni.tts.reference_audio import read_reference

        audio = read_reference(args.ref_audio, param="--ref-audio")
    speech = Speech.load(args.model, weights=args.weights, threads=args.threads, cache=not args.no_cache,
                         decoder=args.decoder, share_cores=not args.fixed_threads)
    voice = None
    if args.voice:
        voice = speech.load_voice(args.voice)
    elif audio is not None:
        voice = speech.clone(audio, ref_text, args.x_vector_only)
    chunks = speech.stream(text, speaker=args.speaker, voice=voice, language=args.language, instruct=args.instruct,
                           streaming_text=not args.non_streaming_text, greedy=True if args.greedy else None,
                           seed=args.seed, max_frames=args.max_frames)
    to_file = args.out != "-"
    bar = None
    if to_file and not args.quiet:
        from tqdm import tqdm

        bar = tqdm(unit="frame", desc="speaking", file=sys.stderr, leave=False)
    held = []
    with WavWriter(args.out, speech.sample_rate) as wav:
        for chunk in chunks:
            if args.stream or not to_file:
                wav.write(chunk.samples)
            else:
                held.append(chunk.samples)
            if bar is not None:
                bar.update(chunk.frames)
        for samples in held:
            wav.write(samples)
    if bar is not None:
        bar.close()
    st = speech.last_stats
    if args.stats_json:
        _write_stats(args.stats_json, speech, st)
    if not args.quiet:
        first = f"{st.first_audio_s * 1e3:.0f} ms" if st.first_audio_s is not None else "none"
        rtf = f"{st.rtf:.2f}" if st.rtf is not None else "n/a"
        where = "standard output" if not to_file else args.out
        print(f"{st.frames} frames, {st.audio_s:.2f} s of audio in {st.total_s:.2f} s (RTF {rtf}, first audio "
              f"after {first}) -> {where}", file=sys.stderr)
    return 0


def _write_stats(path: str, speech, st) -> None:
    """The figures of the summary line, and the threads each frame ran on, as JSON (written whole)."""
    import json
    import os
    import tempfile

    doc = {"frames": st.frames, "audio_s": round(st.audio_s, 3), "total_s": round(st.total_s, 4),
           "rtf": None if st.rtf is None else round(st.rtf, 4),
           "first_audio_s": None if st.first_audio_s is None else round(st.first_audio_s, 4),
           "max_threads": speech.threads, "threads": st.generation.threads}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def clone(args: argparse.Namespace) -> int:
    from vllm_omni.tts.checkpoint import load_checkpoint
    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.reference_audio import read_reference
    from vllm_omni.tts.voice import Cloner, save_voice
    from vllm_omni.tts.wav import check_output

    check_output(args.out)
    cfg = load_config(args.model)
    if not cfg.clones:
        raise ValueError(f"--model {args.model}: {cfg.family} has no speaker encoder; voices are cloned with a Base "
                         "checkpoint (Qwen3-TTS-12Hz-0.6B-Base or 1.7B-Base)")
    ref_text = _ref_text(args)
    if not args.x_vector_only and not (ref_text and ref_text.strip()):
        raise ValueError("--ref-text is required to clone in context (what is said in the reference audio); or give "
                         "--x-vector-only to clone from the speaker embedding alone")
    audio = read_reference(args.ref_audio, param="--ref-audio")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    voice = Cloner(load_checkpoint(args.model)).clone(audio, ref_text, args.x_vector_only)
    save_voice(voice, args.out)
    made = voice.made
    what = (f"in context, {voice.codes.shape[0]} reference frames" if voice.icl else "x-vector only")
    print(f"cloned {audio.seconds:.1f} s of {audio.source} ({what}; speaker embedding {made['speaker_encoder_ms']:.0f} ms"
          + (f", reference codes {made['speech_encoder_ms']:.0f} ms" if voice.icl else "") + f") -> {args.out}",
          file=sys.stderr)
    return 0


def random_checkpoint(args: argparse.Namespace) -> int:
    from vllm_omni.tts.random_checkpoint import write_random_checkpoint

    shape = {k: getattr(args, k) for k in ("talker_layers", "predictor_layers", "decoder_layers", "text_hidden",
                                           "decoder_dim", "encoder_layers") if getattr(args, k)}
    shape["model_type"] = args.type.replace("-", "_")
    out = write_random_checkpoint(args.out, args.size, seed=args.seed, dtype=args.dtype, overwrite=args.overwrite,
                                  **shape)
    kind = {"custom-voice": "CustomVoice", "voice-design": "VoiceDesign", "base": "Base"}[args.type]
    print(f"wrote a random-weight {args.size}-{kind} checkpoint to {out} (random weights: no voice, only the shapes)",
          file=sys.stderr)
    return 0


def voices(args: argparse.Namespace) -> int:
    from vllm_omni.tts.config import load_config

    cfg = load_config(args.model)
    print(f"{cfg.family}")
    none = "none (clone a voice: qwen3-tts-edge clone)" if cfg.clones else "none (describe the voice with --instruct)"
    print("speakers: " + (", ".join(sorted(cfg.speakers)) or none))
    print("languages: " + ", ".join(cfg.supported_languages))
    return 0


API_KEY_ENV = "QWEN3_TTS_EDGE_API_KEY"
THREADS_HELP = ("CPU threads at most (default: the usable CPUs); fewer while other processes keep cores busy, "
                "unless --fixed-threads")
FIXED_THREADS_HELP = ("run on --threads threads even while other processes keep cores busy (by default the engine "
                      "steps on the cores they leave free: with every core's thread waiting at each barrier for one "
                      "the OS has descheduled, a busy core made it many times slower)")
WEIGHTS_HELP = ("format of the talker and predictor weights: int4 (default), int8 or fp32 for both, or "
                "TALKER+PREDICTOR for each its own, e.g. int4+int8 (an int8 predictor moves fewer codes, at about "
                "twice its int4 time a frame)")


def _weights(text: str) -> str:
    """``--weights``: one format, or a mix (``weight_choice``), checked as the option is read."""
    from vllm_omni.tts.weight_choice import canonical

    try:
        return canonical(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


DECODER_CHOICES = ("auto", "fp32", "bf16", "int8")  # pipeline.DECODER_CHOICES (that module imports torch)
DECODER_HELP = ("the decoder's precision: auto (default) is, with int8/int4 weights, bf16 where the CPU multiplies "
                "bf16 (AVX-512 BF16, AMX), else int8 where it multiplies int8 (AVX-512 VNNI, ARM's dot product), "
                "else fp32; fp32 equals the official decode")


def _check_serving(args: argparse.Namespace, command: str = "serve"):
    """The checkpoint's config and the API key, every serving option checked before any weights are read."""
    import os

    from vllm_omni.tts.config import load_config

    cfg = load_config(args.model)  # a wrong folder fails before the weights are read
    if args.voices is not None and not cfg.clones:
        raise ValueError(f"--voices: {cfg.family} speaks in preset or described voices; saved voices need a Base "
                         "checkpoint")
    if args.voices is not None and args.voices.exists() and not args.voices.is_dir():
        raise ValueError(f"--voices {args.voices}: not a folder")
    if args.allowed_local_media_path is not None and not args.allowed_local_media_path.is_dir():
        raise ValueError(f"--allowed-local-media-path {args.allowed_local_media_path}: not a folder")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"qwen3-tts-edge {command}: note: listening on {args.host} without an API key (--api-key or "
              f"${API_KEY_ENV})", file=sys.stderr)
    return cfg, api_key


def _server_app(args: argparse.Namespace, model_id: str, api_key: str | None):
    """The engine (loading the model in its worker thread) and the app around it: one server's, or one replica's."""
    from vllm_omni.tts.pipeline import Speech
    from vllm_omni.tts.server.app import create_app
    from vllm_omni.tts.server.engine import SpeechEngine

    def load() -> Speech:  # in the engine's worker thread, where it will step (SpeechEngine's doc)
        return Speech.load(args.model, weights=args.weights, threads=args.threads, max_positions=args.max_positions,
                           cache=not args.no_cache, decoder=args.decoder, share_cores=not args.fixed_threads)

    engine = SpeechEngine(load=load, max_streams=args.max_streams, max_queue=args.max_queue, timeout_s=args.timeout,
                          max_frames=args.max_frames)
    app = create_app(engine, model_id=model_id, api_key=api_key, voices=args.voices,
                     allowed_local_media=args.allowed_local_media_path, default_format=args.default_format,
                     openai_names=not args.no_openai_model_names)
    return engine, app


def serve(args: argparse.Namespace) -> int:
    cfg, api_key = _check_serving(args)
    import uvicorn

    model_id = args.served_model_name or cfg.family
    engine, app = _server_app(args, model_id, api_key)
    print(f"serving {model_id} on http://{args.host}:{args.port}/v1/audio/speech", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()
    return 0


def serve_cluster(args: argparse.Namespace) -> int:
    cfg, api_key = _check_serving(args, "serve-cluster")
    from vllm_omni.tts.server import cluster

    model_id = args.served_model_name or cfg.family
    if args.voices is not None:
        raise ValueError("--voices: saved voices live in one server's folder; serve-cluster does not share them "
                         "between replicas yet (use serve)")
    args.threads = cluster.replica_threads(args.threads, args.replicas, args.max_replicas)  # each loads its share

    def make_app():  # on each replica
        return _server_app(args, model_id, api_key)[1]

    return cluster.run(make_app, model_id=model_id, host=args.host, port=args.port, replicas=args.replicas,
                       max_replicas=args.max_replicas, threads=args.threads, max_streams=args.max_streams,
                       max_queue=args.max_queue, address=args.address)


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 (at most 86400), got {text!r}")
    return v


def _serving_arguments(sv: argparse.ArgumentParser) -> None:
    """The options of ``serve`` and ``serve-cluster`` (for a replica, ``--threads`` is its own)."""
    sv.add_argument("--model", required=True, help="an official Qwen3-TTS checkpoint directory")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    sv.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1/ (or set ${API_KEY_ENV})")
    sv.add_argument("--served-model-name", help="the model id clients send (default: the checkpoint's family name)")
    sv.add_argument("--no-openai-model-names", action="store_true",
                    help="refuse OpenAI's model names (tts-1, tts-1-hd, gpt-4o-mini-tts), which are otherwise taken "
                         "as this model's")
    sv.add_argument("--default-format", choices=tuple(FORMATS), default="mp3",
                    help="the audio format of a request without response_format (default mp3, as OpenAI's)")
    sv.add_argument("--weights", type=_weights, default="int4", metavar="FORMAT", help=WEIGHTS_HELP)
    sv.add_argument("--decoder", choices=DECODER_CHOICES, default="auto", help=DECODER_HELP)
    sv.add_argument("--threads", type=_threads, help=THREADS_HELP)
    sv.add_argument("--fixed-threads", action="store_true", help=FIXED_THREADS_HELP)
    sv.add_argument("--no-cache", action="store_true", help="do not read or keep the packed weights (see speak)")
    sv.add_argument("--max-streams", type=_whole(1, 8), default=2,
                    help="requests spoken at once, stepped together (default 2, at most 8)")
    sv.add_argument("--max-queue", type=_count, default=4,
                    help="requests that may wait while those are spoken (default 4); beyond: 429 with Retry-After")
    sv.add_argument("--timeout", type=_seconds, default=120.0,
                    help="seconds a request may take, waiting included (default 120); then 504 or a cut stream")
    sv.add_argument("--max-frames", type=_positive, help="frames per request at most (default: the checkpoint's)")
    sv.add_argument("--max-positions", type=_positive, default=4096,
                    help="talker positions (prompt and frames) a request may use (default 4096)")
    sv.add_argument("--voices", type=Path, help="a Base checkpoint's saved voices: NAME.voice files a request names "
                                                "as its voice; voices added over HTTP are written here")
    sv.add_argument("--allowed-local-media-path", type=Path,
                    help="let requests give ref_audio as a file:// path inside this folder (by default only data: "
                         "URIs; URLs are never fetched)")
    sv.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen3-tts-edge", description="Qwen3-TTS on the CPU: text in, 24 kHz speech out.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speak", help="speak a text into a WAV file (or standard output)")
    s.add_argument("--model", required=True, help="an official Qwen3-TTS checkpoint directory")
    s.add_argument("--text", help="the words to speak")
    s.add_argument("--text-file", help="read the words from this file ('-': standard input)")
    s.add_argument("--speaker", help="a CustomVoice speaker (see `qwen3-tts-edge voices`)")
    s.add_argument("--voice", help="a Base checkpoint's cloned voice: a .voice file from `qwen3-tts-edge clone`")
    s.add_argument("--ref-audio", help="a Base checkpoint: clone the voice of this recording now (WAV, FLAC, OGG, "
                                       "MP3; 1 to 30 s) instead of --voice")
    s.add_argument("--ref-text", help="what is said in --ref-audio (in-context cloning)")
    s.add_argument("--ref-text-file", help="read --ref-text from this file")
    s.add_argument("--x-vector-only", action="store_true",
                   help="clone --ref-audio from its speaker embedding alone (no --ref-text needed)")
    s.add_argument("--language", default="auto", help="a language of the checkpoint, or auto (default)")
    s.add_argument("--instruct", help="a speaking instruction (1.7B CustomVoice) or voice description (VoiceDesign)")
    s.add_argument("--out", required=True, help="the WAV file to write ('-': standard output, as it is made)")
    s.add_argument("--stream", action="store_true",
                   help="write each chunk as it is decoded instead of at the end (the file still appears whole)")
    s.add_argument("--weights", type=_weights, default="int4", metavar="FORMAT", help=WEIGHTS_HELP)
    s.add_argument("--decoder", choices=DECODER_CHOICES, default="auto", help=DECODER_HELP)
    s.add_argument("--threads", type=_threads, help=THREADS_HELP)
    s.add_argument("--fixed-threads", action="store_true", help=FIXED_THREADS_HELP)
    s.add_argument("--no-cache", action="store_true",
                   help="pack the int8/int4 weights anew and do not keep them in the checkpoint's "
                        ".qwen3-tts-edge folder (by default a second start reads them from there)")
    s.add_argument("--greedy", action="store_true", help="argmax instead of sampling (the official greedy rules)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling noise (default 0)")
    s.add_argument("--max-frames", type=_positive, help="stop after this many 80 ms frames")
    s.add_argument("--non-streaming-text", action="store_true",
                   help="put the whole text in the prompt instead of feeding it one token per frame")
    s.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    s.add_argument("--stats-json", help="also write the run's figures (frames, RTF, first audio, the threads each "
                                        "frame ran on) as JSON to this file")
    s.set_defaults(func=speak)
    c = sub.add_parser("clone", help="clone a voice from reference audio with a Base checkpoint into a .voice file")
    c.add_argument("--model", required=True, help="an official Qwen3-TTS Base checkpoint directory")
    c.add_argument("--ref-audio", required=True, help="a recording of the voice (WAV, FLAC, OGG, MP3; any rate and "
                                                      "channels; 1 to 30 s, 3 to 10 s of clear speech works best)")
    c.add_argument("--ref-text", help="what is said in the recording: in-context cloning (the official default)")
    c.add_argument("--ref-text-file", help="read --ref-text from this file")
    c.add_argument("--x-vector-only", action="store_true",
                   help="keep only the speaker embedding (no reference text or codes): quicker prompts, less alike")
    c.add_argument("--out", required=True, help="the voice file to write (NAME.voice)")
    c.add_argument("--threads", type=_threads, help="CPU threads (default: the usable CPUs)")
    c.set_defaults(func=clone)
    r = sub.add_parser("random-checkpoint", help="write a random-weight checkpoint in the official layout")
    r.add_argument("--out", required=True, help="the directory to create")
    r.add_argument("--size", choices=("0.6B", "1.7B"), default="0.6B")
    r.add_argument("--type", choices=("custom-voice", "voice-design", "base"), default="custom-voice",
                   help="CustomVoice (preset speakers, the default), VoiceDesign (a described voice) or Base (voices "
                        "cloned from reference audio: adds the speaker encoder and the 12 Hz encoder)")
    r.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="stored dtype (published: bf16)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--talker-layers", type=_positive, help="fewer talker layers than the published 28 (tests)")
    r.add_argument("--predictor-layers", type=_positive, help="fewer code predictor layers than 5 (tests)")
    r.add_argument("--decoder-layers", type=_positive, help="fewer decoder transformer layers than 8 (tests)")
    r.add_argument("--text-hidden", type=_positive, help="a narrower text embedding than the published 2048 (tests)")
    r.add_argument("--decoder-dim", type=_positive, help="a narrower decoder than the published 1536 (tests)")
    r.add_argument("--encoder-layers", type=_positive, help="fewer 12 Hz encoder transformer layers than 8 (tests)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    r.set_defaults(func=random_checkpoint)
    sv = sub.add_parser("serve", help="serve an OpenAI-compatible /v1/audio/speech over HTTP")
    _serving_arguments(sv)
    sv.set_defaults(func=serve)
    sc = sub.add_parser("serve-cluster", help="the same server as Ray Serve replicas, on a local or existing Ray "
                                              "cluster (vllm_omni.tts.server.cluster)")
    _serving_arguments(sc)
    sc.add_argument("--replicas", type=_whole(1, 256), default=2, help="replicas, each its own engine (default 2)")
    sc.add_argument("--max-replicas", type=_whole(1, 256),
                    help="autoscale between --replicas and this many on the requests each replica holds")
    sc.add_argument("--address", help="join this Ray cluster (ray start's address; default: start one on this machine)")
    sc.set_defaults(func=serve_cluster)
    v = sub.add_parser("voices", help="list a checkpoint's speakers and languages")
    v.add_argument("--model", required=True)
    v.set_defaults(func=voices)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ValueError, FileExistsError) as exc:
        print(f"qwen3-tts-edge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"qwen3-tts-edge {args.command}: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
