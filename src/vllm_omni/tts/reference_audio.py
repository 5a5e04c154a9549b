"""Reference audio in: a file or its bytes, any rate and channel count, out as 24 kHz mono samples.

The official wrapper (``qwen_tts`` 0.1.1 ``Qwen3TTSModel._load_audio_to_np``) reads a path with
``librosa.load(path, sr=None, mono=True)`` -- libsndfile through ``soundfile``, float32, the
mean of the channels -- and base64 or bytes with ``soundfile.read(..., dtype="float32")`` and the
same mean; the tokenizer and the speaker encoder then resample with ``librosa.resample`` at its
default, soxr's "HQ" quality, cut or zero-padded to ``ceil(n * 24000 / rate)`` samples. Here the
same two libraries do the same steps without librosa (``resample``), so the 24 kHz samples are
the official ones.

What the official code accepts and this refuses, each with the file named: what libsndfile
cannot read (an MP3 it can, an MP4 it cannot), a reference shorter than ``MIN_SECONDS`` or
longer than ``MAX_SECONDS``, one whose samples are not finite, and one that is silent (peak
below ``SILENCE_PEAK``). The official code takes any length and silence; a one-second floor keeps
a few frames for the speaker encoder's statistics, and the ceiling bounds the prefill (an ICL
voice puts every reference frame in the prompt: 30 s is 375 positions) and the encoder's
attention, which spans the whole reference.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 24000
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
SILENCE_PEAK = 1e-3  # about -60 dBFS
SOXR_QUALITY = "soxr_hq"  # librosa.resample's default res_type


class ReferenceAudioError(ValueError):
    """Reference audio that cannot be used: the message names the file (or upload) and why;
    ``param`` is the request field it came from."""

    def __init__(self, message: str, param: str = "ref_audio"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ReferenceAudio:
    """24 kHz mono float32 samples of a reference, and where they came from."""

    samples: np.ndarray
    source: str
    source_rate: int
    source_channels: int

    @property
    def seconds(self) -> float:
        return self.samples.shape[0] / RATE


def resample(samples: np.ndarray, rate: int, target: int = RATE) -> np.ndarray:
    """``samples`` (float32, 1-D) from ``rate`` to ``target`` as ``librosa.resample`` does by default: soxr
    at its high quality, then cut or zero-padded to ``ceil(n * target / rate)`` samples."""
    if rate == target:
        return samples
    import soxr

    out = soxr.resample(samples, rate, target, quality=SOXR_QUALITY)
    n = int(np.ceil(samples.shape[-1] * float(target) / rate))
    if out.shape[-1] >= n:
        return np.ascontiguousarray(out[..., :n])
    return np.pad(out, (0, n - out.shape[-1]))


def _mono(data: np.ndarray) -> np.ndarray:
    """The mean over channels of [frames, channels] (as librosa's to_mono, channels first), float32."""
    if data.ndim == 1:
        return data.astype(np.float32, copy=False)
    return np.mean(data.T, axis=0).astype(np.float32, copy=False)


def read_reference(source: str | Path | bytes, *, name: str | None = None, min_seconds: float = MIN_SECONDS,
                   max_seconds: float = MAX_SECONDS, param: str = "ref_audio") -> ReferenceAudio:
    """Read a reference from a file path or the bytes of a file (``name`` says what to call it in errors)
    and bring it to 24 kHz mono; ReferenceAudioError naming it for anything unusable (see the module doc)."""
    import soundfile as sf

    if isinstance(source, (bytes, bytearray, memoryview)):
        label, handle = name or "the uploaded audio", io.BytesIO(bytes(source))
        if not len(source):
            raise ReferenceAudioError(f"{label}: empty (no bytes)", param)
    else:
        path = Path(source)
        label, handle = name or str(path), str(path)
        if not path.is_file():
            raise ReferenceAudioError(f"{label}: no such file", param)
    try:
        data, rate = sf.read(handle, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise ReferenceAudioError(f"{label}: not audio that libsndfile reads (WAV, FLAC, OGG/Vorbis or Opus, MP3 and "
                                  f"more): {exc}", param) from None
    frames, channels = data.shape
    seconds = frames / rate if rate else 0.0
    if seconds < min_seconds:
        raise ReferenceAudioError(f"{label}: {seconds:.2f} s of audio; a reference needs at least {min_seconds:g} s "
                                  "(3 to 10 s of clear speech works best)", param)
    if seconds > max_seconds:
        raise ReferenceAudioError(f"{label}: {seconds:.1f} s of audio; a reference may be at most {max_seconds:g} s "
                                  "(cut it to a few sentences)", param)
    mono = _mono(data)
    if not np.isfinite(mono).all():
        raise ReferenceAudioError(f"{label}: holds samples that are not finite numbers", param)
    peak = float(np.abs(mono).max())
    if peak < SILENCE_PEAK:
        raise ReferenceAudioError(f"{label}: silent (peak {peak:.1e}); give a recording of the voice to clone", param)
    return ReferenceAudio(resample(mono, int(rate)), label, int(rate), int(channels))
