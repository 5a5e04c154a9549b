"""Speech in the formats OpenAI's clients ask for: ``mp3``, ``opus`` (Ogg), ``flac``, ``wav``, ``pcm``.

Why ``soundfile``: its wheels bundle libsndfile 1.2 with LAME (MP3), libopus and libFLAC, so
every format but AAC comes without ffmpeg, on x86-64 and aarch64 alike. AAC has no encoder in
it; the server refuses it and names the formats it serves.

A stream (``Encoder``) hands over the bytes as the encoder makes them: MP3 a few frames behind
the samples, FLAC a block behind, Ogg Opus a page (about one second) behind. Two fields that
libsndfile writes only when the file is closed, by seeking back, cannot reach a client that has
the start already, so a streamed file leaves them as the format allows: FLAC's total length is
"unknown" (read it block by block), and MP3 keeps LAME's empty placeholder tag, so a decoder
keeps the encoder's delay (70 ms of silence in front at 24 kHz) and can only estimate the
length until it has read to the end. ``encode`` makes a whole file, with both.
"""

from __future__ import annotations

import io
from typing import Any

# format -> (content type, libsndfile format, subtype); None: written here (wav, pcm)
FORMATS: dict[str, tuple[str, str | None, str | None]] = {
    "mp3": ("audio/mpeg", "MP3", "MPEG_LAYER_III"),
    "opus": ("audio/ogg", "OGG", "OPUS"),
    "flac": ("audio/flac", "FLAC", "PCM_16"),
    "wav": ("audio/wav", None, None),
    "pcm": ("audio/pcm", None, None),
}
UNSUPPORTED = {"aac": "no AAC encoder ships with the libraries this server uses (libsndfile has none)"}


def check_format(fmt: str) -> str:
    """``fmt`` if it is served; a ValueError naming the served formats otherwise."""
    if fmt in FORMATS:
        return fmt
    why = f" ({UNSUPPORTED[fmt]})" if fmt in UNSUPPORTED else ""
    raise ValueError(f"{fmt!r} is not served{why}; formats: {', '.join(FORMATS)}")


def media_type(fmt: str) -> str:
    return FORMATS[check_format(fmt)][0]


class _Sink:
    """A file libsndfile writes into, from which the new bytes are taken as they come. A write
    before what was taken already (a header completed at close) changes only the whole-file copy."""

    def __init__(self):
        self.buf = bytearray()
        self.pos = 0
        self.taken = 0

    def write(self, data) -> int:
        data = bytes(data)
        end = self.pos + len(data)
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[self.pos:end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else len(self.buf) + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        data = bytes(self.buf[self.pos:] if size < 0 else self.buf[self.pos:self.pos + size])
        self.pos += len(data)
        return data

    def take(self) -> bytes:
        data = bytes(self.buf[self.taken:])
        self.taken = len(self.buf)
        return data


def _float(samples: Any) -> Any:
    import numpy as np

    return np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)


class Encoder:
    """One stream's encoder: ``add(samples)`` and ``finish()`` return the bytes made so far (maybe none)."""

    def __init__(self, fmt: str, sample_rate: int):
        from vllm_omni.tts.wav import UNKNOWN_SIZE, header

        self.fmt, self.sample_rate = check_format(fmt), sample_rate
        self._file = self._sink = None
        self._head = header(sample_rate, UNKNOWN_SIZE) if fmt == "wav" else b""
        if FORMATS[fmt][1] is not None:
            import soundfile

            self._sink = _Sink()
            self._file = soundfile.SoundFile(self._sink, "w", samplerate=sample_rate, channels=1,
                                             format=FORMATS[fmt][1], subtype=FORMATS[fmt][2])

    def add(self, samples: Any) -> bytes:
        from vllm_omni.tts.wav import pcm16

        head, self._head = self._head, b""
        if self._file is None:
            return head + pcm16(samples)
        self._file.write(_float(samples))
        return self._sink.take()

    def finish(self) -> bytes:
        head, self._head = self._head, b""
        if self._file is None:
            return head
        self._file.close()
        return self._sink.take()


def encode(samples: Any, fmt: str, sample_rate: int) -> bytes:
    """A whole file of ``samples`` in ``fmt``, its lengths filled in."""
    from vllm_omni.tts.wav import header, pcm16

    check_format(fmt)
    if fmt in ("wav", "pcm"):
        data = pcm16(samples)
        return (header(sample_rate, len(data)) if fmt == "wav" else b"") + data
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, _float(samples), sample_rate, format=FORMATS[fmt][1], subtype=FORMATS[fmt][2])
    return out.getvalue()
