"""The ``qwen3-tts-edge`` command: speak a text with a checkpoint, or write a random-weight one.

    qwen3-tts-edge speak --model DIR --text "Hello." --speaker ryan --language english --out hello.wav
    qwen3-tts-edge random-checkpoint --out DIR [--size 0.6B]
    qwen3-tts-edge voices --model DIR

Every argument is checked before a weight is read: a bad path, an unknown speaker or language,
empty text or a thread count out of range ends with one line on standard error and exit
status 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_omni.tts.config import CheckpointError

EXIT_BAD_INPUT = 2


def _threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 1024, got {text!r}")
    return n


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return n


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


def speak(args: argparse.Namespace) -> int:
    from vllm_omni.tts.config import load_config
    from vllm_omni.tts.wav import WavWriter, check_output

    text = _text(args)
    check_output(args.out)
    cfg = load_config(args.model)  # configs first: a wrong folder fails in milliseconds
    from vllm_omni.tts.pipeline import Speech
    from vllm_omni.tts.prompt import resolve_language, resolve_speaker

    resolve_language(cfg, args.language, resolve_speaker(cfg, args.speaker))  # before any weight is read
    speech = Speech.load(args.model, weights=args.weights, threads=args.threads)
    chunks = speech.stream(text, speaker=args.speaker, language=args.language, instruct=args.instruct,
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
    if not args.quiet:
        first = f"{st.first_audio_s * 1e3:.0f} ms" if st.first_audio_s is not None else "none"
        rtf = f"{st.rtf:.2f}" if st.rtf is not None else "n/a"
        where = "standard output" if not to_file else args.out
        print(f"{st.frames} frames, {st.audio_s:.2f} s of audio in {st.total_s:.2f} s (RTF {rtf}, first audio "
              f"after {first}) -> {where}", file=sys.stderr)
    return 0


def random_checkpoint(args: argparse.Namespace) -> int:
    from vllm_omni.tts.random_checkpoint import write_random_checkpoint

    shape = {k: getattr(args, k) for k in ("talker_layers", "predictor_layers", "decoder_layers") if getattr(args, k)}
    out = write_random_checkpoint(args.out, args.size, seed=args.seed, dtype=args.dtype, overwrite=args.overwrite,
                                  **shape)
    print(f"wrote a random-weight {args.size} checkpoint to {out} (random weights: no voice, only the shapes)",
          file=sys.stderr)
    return 0


def voices(args: argparse.Namespace) -> int:
    from vllm_omni.tts.config import load_config

    cfg = load_config(args.model)
    print(f"{cfg.family}")
    print("speakers: " + (", ".join(sorted(cfg.speakers)) or "none (describe the voice with --instruct)"))
    print("languages: " + ", ".join(cfg.supported_languages))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen3-tts-edge", description="Qwen3-TTS on the CPU: text in, 24 kHz speech out.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speak", help="speak a text into a WAV file (or standard output)")
    s.add_argument("--model", required=True, help="an official Qwen3-TTS checkpoint directory")
    s.add_argument("--text", help="the words to speak")
    s.add_argument("--text-file", help="read the words from this file ('-': standard input)")
    s.add_argument("--speaker", help="a CustomVoice speaker (see `qwen3-tts-edge voices`)")
    s.add_argument("--language", default="auto", help="a language of the checkpoint, or auto (default)")
    s.add_argument("--instruct", help="a speaking instruction (1.7B CustomVoice) or voice description (VoiceDesign)")
    s.add_argument("--out", required=True, help="the WAV file to write ('-': standard output, as it is made)")
    s.add_argument("--stream", action="store_true",
                   help="write each chunk as it is decoded instead of at the end (the file still appears whole)")
    s.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4",
                   help="format of the talker and predictor weights (default int4)")
    s.add_argument("--threads", type=_threads, help="CPU threads (default: the usable CPUs)")
    s.add_argument("--greedy", action="store_true", help="argmax instead of sampling (the official greedy rules)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling noise (default 0)")
    s.add_argument("--max-frames", type=_positive, help="stop after this many 80 ms frames")
    s.add_argument("--non-streaming-text", action="store_true",
                   help="put the whole text in the prompt instead of feeding it one token per frame")
    s.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    s.set_defaults(func=speak)
    r = sub.add_parser("random-checkpoint", help="write a random-weight checkpoint in the official layout")
    r.add_argument("--out", required=True, help="the directory to create")
    r.add_argument("--size", choices=("0.6B", "1.7B"), default="0.6B")
    r.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="stored dtype (published: bf16)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--talker-layers", type=_positive, help="fewer talker layers than the published 28 (tests)")
    r.add_argument("--predictor-layers", type=_positive, help="fewer code predictor layers than 5 (tests)")
    r.add_argument("--decoder-layers", type=_positive, help="fewer decoder transformer layers than 8 (tests)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    r.set_defaults(func=random_checkpoint)
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
