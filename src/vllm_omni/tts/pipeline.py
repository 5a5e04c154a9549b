"""One pipeline, two faces: text in, 24 kHz audio chunks out as soon as they are made.

``Speech.load(DIR)`` reads and checks a checkpoint, packs the talker and the predictor once for
the fused kernels (fp32, int8 or int4; int8 and int4 are cached in the checkpoint's folder, so a
second start reads them, ``vllm_omni.tts.weight_cache``), and builds the streaming decoder (its
long convolutions in bf16 with int8/int4 weights where the CPU multiplies bf16, ``decoder_precision``).
``Speech.stream(...)`` then yields ``AudioChunk``s: the first after one frame (80 ms of audio), then chunks that grow
to ``chunk_frames`` frames (``chunk_schedule``), each decoded from the state the decoder kept,
so the concatenation is the whole utterance's decode. The command (``qwen3-tts-edge speak``) and the benchmarks call
this same path. A Base checkpoint speaks in a cloned voice (``clone``, ``load_voice``; ``vllm_omni.tts.voice``):
its prompt comes from ``voice_prompt``, and an in-context voice's utterances start from the decoder state its
reference codes leave, made once per voice.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.frame import StepStats
from vllm_omni.tts.checkpoint import Checkpoint, load_checkpoint
from vllm_omni.tts.generate import CodeGenerator, GenerationStats, Sampling
from vllm_omni.tts.prompt import build_prompt
from vllm_omni.tts.weight_choice import canonical, quantized


@dataclass
class AudioChunk:
    """Samples (float32 in -1..1, 24 kHz) of frames ``first_frame .. first_frame + frames - 1``."""

    samples: np.ndarray
    first_frame: int
    frames: int
    ready_s: float  # seconds since the request started, when the chunk was ready


@dataclass
class SpeechStats:
    """Where one utterance's time went (milliseconds), and when its first audio was ready."""

    generation: GenerationStats = field(default_factory=GenerationStats)
    decoder_ms: list[float] = field(default_factory=list)  # per frame (a chunk's time shared by its frames)
    prompt_ms: float = 0.0
    first_audio_s: float | None = None
    total_s: float = 0.0
    frames: int = 0
    stopped: bool = False  # ended early by the caller's ``stop``

    @property
    def audio_s(self) -> float:
        return self.frames * 0.08

    @property
    def rtf(self) -> float | None:
        """Wall time over audio time (below 1 is faster than real time)."""
        return self.total_s / self.audio_s if self.frames else None

    def median_split(self) -> dict[str, float]:
        """Median ms per frame of each part (talker, predictor, sampler, decoder, bookkeeping)."""
        if not self.generation.frames:
            return {}
        m = StepStats.median(self.generation.frames)
        return {"talker": m.talker_ms, "predictor": m.predictor_ms, "sampler": m.sampler_ms,
                "bookkeeping": m.bookkeeping_ms,
                "decoder": statistics.median(self.decoder_ms) if self.decoder_ms else 0.0}

DECODER_CHOICES = ("auto", "fp32", "bf16", "int8")


def decoder_precision(choice: str, weights: str) -> str:
    """The decoder's precision for ``choice``. "auto", where int8 or int4 weights are in use
    (``weight_choice.quantized``): bf16 on a CPU that multiplies bf16 natively (``decoder.bf16_helps``),
    else int8 on one that multiplies int8 in SIMD (``decoder.int8_helps``: AVX-512 VNNI, ARM's dot
    product), else fp32. fp32 weights keep the fp32 decoder, whose output equals the official decode."""
    from vllm_omni.tts.decoder import INT8_REFUSED, bf16_helps, int8_helps

    if choice not in DECODER_CHOICES:
        raise ValueError(f"decoder must be one of {', '.join(DECODER_CHOICES)}, got {choice!r}")
    if choice == "int8" and not int8_helps():  # said before any weights are read
        raise ValueError(INT8_REFUSED)
    if choice != "auto":
        return choice
    if not quantized(weights):
        return "fp32"
    return "bf16" if bf16_helps() else "int8" if int8_helps() else "fp32"


RAMP = (1, 1, 2, 2)


def chunk_schedule(steady: int) -> Iterator[int]:
    """Frames per decoder call: one, one, two, two, then ``steady`` from there on.

    The first audio needs one frame; after it, playback must not catch up with decoding. A
    decoder call on one frame costs more per frame than one on four (its weights are read per
    call), so the chunks grow while the audio already made covers the next call's time: at an
    RTF of about 0.6, a jump from one frame straight to four stalled playback for a tenth of a
    second, this ramp did not (end-to-end/timeline-0.6b).
    """
    for n in RAMP:
        yield min(n, steady)
    while True:
        yield steady


class Speech:
    """A checkpoint ready to speak (see the module doc)."""

    def __init__(self, ckpt: Checkpoint, weights: str = "int4", threads: int | None = None, max_positions: int = 2048,
                 cache: bool = True, decoder: str = "auto", share_cores: bool = True):
        import torch

        from vllm_omni.cpu.predictor import default_threads
        from vllm_omni.tts.decoder import StreamingDecoder

        weights = canonical(weights)
        precision = decoder_precision(decoder, weights)
        self.threads = default_threads() if threads is None else whole_number("threads", threads, 1, 1024)
        torch.set_num_threads(self.threads)
        self.ckpt, self.weights = ckpt, weights
        self.generator = CodeGenerator(ckpt, weights, self.threads, max_positions=max_positions, cache=cache,
                                       share_cores=share_cores)
        self.decoder = StreamingDecoder(ckpt.decoder, ckpt.config.decoder, precision)
        self.sample_rate = ckpt.config.decoder.spec.sample_rate
        self.samples_per_frame = ckpt.config.decoder.spec.samples_per_frame
        self.last_stats = SpeechStats()
        self._cloner = None
        self._voices: dict[int, tuple[Any, Any]] = {}  # id(voice) -> (voice, the decoder state its reference leaves)

    @classmethod
    def load(cls, model_dir: str | Path, weights: str = "int4", threads: int | None = None,
             max_positions: int = 2048, cache: bool = True, decoder: str = "auto",
             share_cores: bool = True) -> "Speech":
        """Load ``model_dir``; ``weights``: the talker's and the predictor's formats (``weight_choice``: "int4",
        or "int4+int8" for an int4 talker and an int8 predictor); ``cache``: read and keep the packed
        int8/int4 weights in it (``weight_cache``);
        ``decoder``: its precision (``decoder_precision``); ``threads``: at most this many, fewer while other
        work keeps cores busy unless ``share_cores`` is False (``vllm_omni.cpu.free_cores``)."""
        decoder_precision(decoder, canonical(weights))  # before reading gigabytes
        if threads is not None:
            whole_number("threads", threads, 1, 1024)
        return cls(load_checkpoint(model_dir), weights, threads, max_positions, cache, decoder, share_cores)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.ckpt.config.speakers)

    @property
    def languages(self) -> list[str]:
        return self.ckpt.config.supported_languages

    @property
    def frame_limit(self) -> int:
        """The most frames an utterance may take unless asked for fewer (the checkpoint's ``max_new_tokens``,
        less one)."""
        return self.ckpt.config.generation.max_new_tokens - 1

    @property
    def cloner(self):
        """The ``voice.Cloner`` of this checkpoint (a Base one), made on first use."""
        if self._cloner is None:
            from vllm_omni.tts.voice import Cloner

            self._cloner = Cloner(self.ckpt)
        return self._cloner

    def clone(self, audio, ref_text: str | None = None, x_vector_only: bool = False):
        """A ``Voice`` from reference audio (a path, a file's bytes or a ``ReferenceAudio``; ``voice.Cloner``)."""
        from vllm_omni.tts.reference_audio import ReferenceAudio, read_reference

        if not isinstance(audio, ReferenceAudio):
            audio = read_reference(audio)
        return self.cloner.clone(audio, ref_text, x_vector_only)

    def load_voice(self, path: str | Path):
        """A voice file made with this checkpoint (``voice.load_voice`` then ``voice.check_voice``)."""
        from vllm_omni.tts.voice import check_voice, load_voice

        voice = load_voice(path)
        check_voice(voice, self.ckpt, self.cloner.fingerprint, where=str(path))
        return voice

    def prepare_voice(self, voice) -> Any:
        """The decoder state an utterance in ``voice`` starts from: for an in-context voice, the state its
        reference codes leave (decoded once per voice, their audio never emitted; ``open`` calls this, a server
        may call it ahead), else a fresh one."""
        known = self._voices.get(id(voice))
        if known is not None and known[0] is voice:
            return known[1]
        dec = self.decoder
        if not voice.icl:
            return dec.fresh_state()
        current = dec.save_state()
        dec.reset()
        dec.prime(voice.codes)
        state = dec.save_state()
        dec.load_state(current)
        if len(self._voices) >= 16:
            self._voices.pop(next(iter(self._voices)))
        self._voices[id(voice)] = (voice, state)
        return state

    def open(self, text: str, *, speaker: str | None = None, voice=None, language: str | None = "auto",
             instruct: str | None = None, streaming_text: bool = True, greedy: bool | None = None, seed: int = 0,
             max_frames: int | None = None, chunk_frames: int = 4,
             stop: Callable[[], bool] | None = None) -> "Speaking":
        """One utterance ready to be stepped: its prompt (a ``PromptError`` names a bad parameter),
        sampling, decoder state and chunk schedule (``stream`` steps one; a server steps several).
        ``voice``: a cloned ``Voice`` (a Base checkpoint; ``clone`` or ``load_voice``) instead of a speaker."""
        start = time.perf_counter()
        chunk_frames = whole_number("chunk_frames", chunk_frames, 1, 1000)
        self.generator.fit_threads()  # the prompt's own PyTorch work runs on the free cores too
        state = None
        if voice is not None or self.ckpt.config.clones:
            prompt, state = self._voice_prompt(text, speaker, voice, language, instruct, streaming_text)
        else:
            prompt = build_prompt(self.ckpt, text, speaker=speaker, language=language, instruct=instruct,
                                  streaming_text=streaming_text)
        max_frames = self.frame_limit if max_frames is None else whole_number("max_frames", max_frames, 1)
        sampling = Sampling.from_checkpoint(self.ckpt, greedy=greedy, seed=seed)
        return Speaking(self, prompt, sampling, max_frames, chunk_frames, start, stop, state)

    def _voice_prompt(self, text, speaker, voice, language, instruct, streaming_text):
        from vllm_omni.tts.prompt import PromptError
        from vllm_omni.tts.voice_prompt import build_voice_prompt

        cfg = self.ckpt.config
        if not cfg.clones:
            raise PromptError(f"voice: {cfg.family} speaks in its preset or described voices; cloned voices need a "
                              "Base checkpoint", param="voice")
        if speaker:
            raise PromptError(f"speaker {speaker!r}: {cfg.family} has no preset speakers; it speaks in a cloned voice",
                              param="speaker")
        if instruct and instruct.strip():
            raise PromptError(f"instruct: {cfg.family} takes no speaking instruction (the official code ignores it "
                              "when cloning)", param="instruct")
        if voice is None:
            raise PromptError(f"{cfg.family} speaks in a voice cloned from reference audio: give a voice (a .voice "
                              "file from `qwen3-tts-edge clone`) or the reference audio", param="voice")
        prompt = build_voice_prompt(self.ckpt, text, voice, language=language, streaming_text=streaming_text)
        return prompt, self.prepare_voice(voice)

    def stream(self, text: str, **kw) -> Iterator[AudioChunk]:
        """Yield the utterance's audio chunk by chunk; ``last_stats`` holds its timings afterwards.

        Keywords as ``open``'s. ``stop`` is asked as each frame's codes arrive; when it says True the
        utterance ends there, its frames not yet decoded dropped and ``last_stats.stopped`` set (a
        server's cancelled or timed-out request).
        """
        speaking = self.open(text, **kw)
        self.last_stats = speaking.stats
        for codes in self.generator.generate(speaking.prompt, speaking.sampling, max_frames=speaking.max_frames,
                                             stats=speaking.stats.generation):
            if speaking.should_stop():
                speaking.stats.stopped = True
                break
            chunk = speaking.add(codes)
            if chunk is not None:
                yield chunk
        chunk = speaking.finish()
        if chunk is not None:
            yield chunk

    def synthesize(self, text: str, **kw) -> np.ndarray:
        """The whole utterance as one float32 array."""
        parts = [c.samples for c in self.stream(text, **kw)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class Speaking:
    """One utterance between its codes and its audio: the frames waiting for the decoder, its
    decoder state, its chunk schedule (``chunk_schedule``) and its ``SpeechStats``. Whoever steps
    the generator hands each frame's codes to ``add``, which decodes a chunk when it is full;
    ``finish`` decodes what is left. Several can share one ``Speech``: each keeps its own decoder
    state, swapped in around its own decoder calls."""

    def __init__(self, speech: Speech, prompt, sampling: Sampling, max_frames: int, chunk_frames: int,
                 start: float, stop: Callable[[], bool] | None = None, decoder_state=None):
        self.speech, self.prompt, self.sampling, self.max_frames = speech, prompt, sampling, max_frames
        self.start, self.stop = start, stop
        self.stats = SpeechStats()
        self.stats.prompt_ms = (time.perf_counter() - start) * 1e3
        self.decoder_state = decoder_state if decoder_state is not None else speech.decoder.fresh_state()
        self._pending: list = []
        self._first = 0
        self.steady = chunk_frames  # frames a chunk once the first ones (RAMP) are out
        self._sizes = chunk_schedule(chunk_frames)
        self._want = next(self._sizes)
        self._chunks = 0  # chunks made so far

    def should_stop(self) -> bool:
        return self.stop is not None and bool(self.stop())

    def add(self, codes) -> AudioChunk | None:
        """Take one frame's codes [16]; the next chunk when this frame fills it, else None."""
        return self._flush() if self.take(codes) else None

    def take(self, codes, boundary: bool = False) -> bool:
        """Take one frame's codes [16]; whether they fill the next chunk (to decode it now: ``add`` does,
        ``decode_together`` does for several utterances at once).

        ``boundary``: the caller's step is a chunk boundary it shares with other utterances (a server
        steps every ``steady`` frames). Past its first chunks (``RAMP``), an utterance then ends its
        chunk there, short if need be, so that streams which started at different times fill their
        chunks at the same steps and are decoded in one pass; one short chunk aligns it for good."""
        self._pending.append(codes)
        self.stats.frames += 1
        if len(self._pending) < self._want and not (boundary and self._chunks >= len(RAMP)):
            return False
        self._want = next(self._sizes)
        self._chunks += 1
        return True

    @property
    def opening(self) -> bool:
        """Whether the chunk ``take`` last filled is one of the first ones (``RAMP``), whose audio a
        listener is waiting for: a server decodes those before the chunks of streams already playing."""
        return self._chunks <= len(RAMP)

    def finish(self) -> AudioChunk | None:
        """The frames still waiting (none when the utterance was stopped), and the total time."""
        chunk = self._flush() if self._pending and not self.stats.stopped else None
        self.stats.total_s = time.perf_counter() - self.start
        return chunk

    def _flush(self) -> AudioChunk:
        return decode_together([self])[0]

    def _chunk(self, wav: np.ndarray, state, per_frame_ms: float) -> AudioChunk:
        """The chunk of the frames that were waiting, decoded into ``wav`` leaving ``state``."""
        stats, n = self.stats, len(self._pending)
        self.decoder_state = state
        stats.decoder_ms += [per_frame_ms] * n
        chunk = AudioChunk(wav, self._first, n, time.perf_counter() - self.start)
        if stats.first_audio_s is None:
            stats.first_audio_s = chunk.ready_s
        self._first += n
        self._pending.clear()
        return chunk


def decode_together(speakings: list[Speaking]) -> list[AudioChunk]:
    """The waiting frames of several utterances of one ``Speech``, decoded in one decoder pass
    (``StreamingDecoder.push_streams``: each stage one call for all, its weights read once, where the
    decoder is native), each from its own state; each one's chunk, its decoder time the pass's shared
    by every frame in it."""
    import torch

    if not speakings:
        return []
    dec = speakings[0].speech.decoder
    if any(sp.speech.decoder is not dec for sp in speakings):
        raise ValueError("utterances decoded together must share one Speech")
    t0 = time.perf_counter()
    wavs, states = dec.push_streams([torch.stack(sp._pending) for sp in speakings],
                                    [sp.decoder_state for sp in speakings])
    per = (time.perf_counter() - t0) * 1e3 / sum(len(sp._pending) for sp in speakings)
    return [sp._chunk(w.numpy(), st, per) for sp, w, st in zip(speakings, wavs, states)]
