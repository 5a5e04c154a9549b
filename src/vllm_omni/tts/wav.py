"""WAV output that is never half-written under the requested name.

A file is written to a temporary name in the same folder and renamed when complete, so an
interrupted run leaves nothing (or a hidden ``.part`` file it then removes) where the user
asked for a WAV. 16-bit PCM, mono. Standard output takes the same bytes as they are made, with
the size fields set to their maximum, which players read as "until the end".
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

UNKNOWN_SIZE = 0xFFFFFFFF


def header(sample_rate: int, data_bytes: int, channels: int = 1, bits: int = 16) -> bytes:
    """The 44-byte RIFF/WAVE header of PCM data of ``data_bytes`` (UNKNOWN_SIZE for a stream)."""
    block = channels * bits // 8
    riff = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate,
                                                                         sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", data_bytes))


def pcm16(samples: np.ndarray) -> bytes:
    """float samples in -1..1 -> little-endian int16 bytes (rounded, clipped)."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(x * 32767.0).astype("<i2").tobytes()


def check_output(path: str | Path) -> Path | None:
    """The output path, checked before any work: None for standard output ("-")."""
    if str(path) == "-":
        return None
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--out {p}: is a directory; give a file name such as {p / 'speech.wav'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"--out {p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--out {p}: folder {parent} is not writable")
    return p


class WavWriter:
    """Appends PCM chunks; ``close`` completes the header and renames, ``abort`` removes the part file."""

    def __init__(self, path: str | Path, sample_rate: int):
        self.sample_rate, self.data_bytes = sample_rate, 0
        target = check_output(path)
        self.path = target
        if target is None:
            self._f: BinaryIO = sys.stdout.buffer
            self._tmp = None
            self._f.write(header(sample_rate, UNKNOWN_SIZE))
        else:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent or ".")
            self._tmp = Path(tmp)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # the permissions a plain open() would give, not mkstemp's 0600
            self._f = os.fdopen(fd, "wb")
            self._f.write(header(sample_rate, 0))
        self._f.flush()

    def write(self, samples: np.ndarray) -> None:
        data = pcm16(samples)
        self._f.write(data)
        self.data_bytes += len(data)
        self._f.flush()

    def close(self) -> None:
        """Finish the file: sizes in the header, data on disk, then the rename."""
        if self._tmp is None:
            self._f.flush()
            return
        self._f.seek(0)
        self._f.write(header(self.sample_rate, self.data_bytes))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)
        self._tmp = None

    def abort(self) -> None:
        if self._tmp is not None:
            self._f.close()
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def __enter__(self) -> "WavWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def parse_wav(raw: bytes, name: str = "the WAV") -> tuple[int, np.ndarray, int]:
    """(sample rate, float32 samples, the header's data size) of 16-bit PCM mono bytes written here
    (a file, or a server's response); a size of UNKNOWN_SIZE (a stream) takes every byte after the header."""
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise ValueError(f"{name}: not a RIFF/WAVE file")
    channels, rate, bits = struct.unpack("<H", raw[22:24])[0], struct.unpack("<I", raw[24:28])[0], struct.unpack("<H", raw[34:36])[0]
    if channels != 1 or bits != 16:
        raise ValueError(f"{name}: expected 16-bit mono, got {bits}-bit with {channels} channels")
    size = struct.unpack("<I", raw[40:44])[0]
    data = raw[44:] if size == UNKNOWN_SIZE else raw[44:44 + size]
    return rate, np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0, size


def read_wav(path: str | Path) -> tuple[int, np.ndarray]:
    """(sample rate, float32 samples) of a 16-bit PCM mono file written here (for tests and checks)."""
    rate, samples, _ = parse_wav(Path(path).read_bytes(), str(path))
    return rate, samples
