"""Speech out: the file formats (vllm_omni.tts.encode) and the pitch-keeping speed change
(vllm_omni.tts.time_stretch), on the spoken reference fixture and on tones."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from vllm_omni.tts.encode import FORMATS, Encoder, check_format, encode, media_type
from vllm_omni.tts.time_stretch import TimeStretch, stretch

RATE = 24000
FIXTURES = Path(__file__).parent / "fixtures" / "speech"


@pytest.fixture(scope="module")
def voice() -> np.ndarray:
    x, sr = sf.read(FIXTURES / "reference-en.wav", dtype="float32")
    return soxr.resample(x, sr, RATE).astype(np.float32)


def tone(hz: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def streamed(fmt: str, x: np.ndarray, chunk: int = 7680) -> bytes:
    enc = Encoder(fmt, RATE)
    return b"".join([enc.add(x[i:i + chunk]) for i in range(0, len(x), chunk)] + [enc.finish()])


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Samples back from a response's bytes, read to the end (a streamed file may not know its length)."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0
    with sf.SoundFile(io.BytesIO(data)) as f:
        assert f.samplerate == RATE and f.channels == 1
        parts = []
        while len(block := f.read(4096, dtype="float32")):
            parts.append(block)
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def with_flac_length(data: bytes, n: int) -> bytes:
    """A streamed FLAC with its total length (which it leaves "unknown", 0) filled in, so that libsndfile,
    which seeks by it, can read it; the 36-bit field ends STREAMINFO's 8 bytes at offset 18."""
    assert data[:4] == b"fLaC"
    (packed,) = struct.unpack(">Q", data[18:26])
    assert packed & (2**36 - 1) == 0  # unknown, as a stream leaves it
    return data[:18] + struct.pack(">Q", packed | n) + data[26:]


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - out) ** 2)))


# --- formats ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_whole_file_decodes_to_the_same_length_and_close_to_the_samples(voice, fmt):
    data = encode(voice, fmt, RATE)
    back = decode(data, fmt)
    assert len(back) == len(voice)
    # lossless formats to 16 bits; MP3 (LAME's VBR) and Opus are perceptual codecs
    floor = {"mp3": 15, "opus": 8}.get(fmt, 60)
    assert snr_db(voice, back) > floor


@pytest.mark.parametrize("fmt", ["wav", "pcm", "opus"])
def test_a_stream_holds_the_same_audio_as_the_whole_file(voice, fmt):
    data = streamed(fmt, voice)
    back = decode(data, fmt)
    assert np.array_equal(back, decode(encode(voice, fmt, RATE), fmt))


def test_a_streamed_flac_leaves_its_length_unknown_and_holds_every_sample(voice):
    data = streamed("flac", voice)
    whole = decode(encode(voice, "flac", RATE), "flac")
    assert np.array_equal(decode(with_flac_length(data, len(voice)), "flac"), whole)


def test_a_streamed_mp3_plays_the_whole_file_after_the_encoders_delay(voice):
    data = streamed("mp3", voice)
    back, whole = decode(data, "mp3"), decode(encode(voice, "mp3", RATE), "mp3")
    extra = len(back) - len(voice)
    assert 0 < extra < 0.2 * RATE  # without LAME's tag the decoder keeps the delay and the padding
    lag = int(np.argmax(np.correlate(back[:RATE], voice[:RATE // 2], "valid")))
    assert 0 < lag < 0.1 * RATE
    assert snr_db(whole, back[lag:lag + len(voice)]) > 40  # the same frames, decoded a hair apart in a few places


def test_streamed_mp3s_joined_as_librechat_joins_them_play_one_after_the_other(voice):
    joined = streamed("mp3", voice) + streamed("mp3", voice[:RATE])
    n = len(decode(joined, "mp3"))
    assert len(voice) + RATE < n < len(voice) + RATE + 0.4 * RATE


def test_the_encoder_hands_over_bytes_while_the_speech_goes_on(voice):
    enc = Encoder("mp3", RATE)
    early = sum(len(enc.add(voice[i:i + 7680])) for i in range(0, 4 * 7680, 7680))
    assert early > 1000  # MP3 frames leave within the first 1.3 s, not at the end


def test_formats_are_checked_by_name_and_aac_says_why():
    assert media_type("mp3") == "audio/mpeg" and media_type("opus") == "audio/ogg"
    with pytest.raises(ValueError, match="no AAC encoder ships.*formats: mp3, opus, flac, wav, pcm"):
        check_format("aac")
    with pytest.raises(ValueError, match="'m4a' is not served; formats"):
        Encoder("m4a", RATE)


# --- speed ----------------------------------------------------------------------------------------

SPEEDS = [0.25, 0.5, 0.8, 1.25, 2.0, 4.0]


def peak_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x)), 8 * len(x)))
    return float(np.argmax(spectrum) * RATE / (8 * len(x)))


@pytest.mark.parametrize("speed", SPEEDS)
def test_speed_changes_the_length_exactly_and_keeps_the_pitch(speed):
    x = tone(220.0, 2.0)
    y = stretch(x, speed)
    assert len(y) == round(len(x) / speed)
    assert abs(peak_hz(y) - 220.0) < 0.01 * 220.0
    # the tone stays whole: no dips where the windows meet (20 ms RMS inside the first and last 50 ms)
    edge = RATE // 20
    rms = np.sqrt(np.mean(y[edge:len(y) - edge][: (len(y) - 2 * edge) // 480 * 480].reshape(-1, 480) ** 2, axis=1))
    assert rms.min() > 0.9 * 0.3 / np.sqrt(2) and rms.max() < 1.1 * 0.3 / np.sqrt(2)


@pytest.mark.parametrize("speed", SPEEDS)
def test_speech_at_another_speed_follows_the_original_in_time(voice, speed):
    y = stretch(voice, speed)

    def envelope(x, hop):
        return np.sqrt(np.mean(x[: len(x) // hop * hop].reshape(-1, hop) ** 2, axis=1))

    hop = 1920  # 80 ms of the original
    original = envelope(voice, hop)
    scaled = envelope(y, round(hop / speed))[: len(original)]
    n = min(len(original), len(scaled))
    assert np.corrcoef(original[:n], scaled[:n])[0, 1] > 0.8


@pytest.mark.parametrize("chunk", [1, 333, 1920, 7680])
def test_speed_in_chunks_equals_the_whole_at_once(voice, chunk):
    x = voice[: RATE * 2] if chunk == 1 else voice
    ts = TimeStretch(1.5)
    parts = [ts.add(x[i:i + chunk]) for i in range(0, len(x), chunk)] + [ts.finish()]
    assert np.array_equal(np.concatenate(parts), stretch(x, 1.5))


def test_speed_out_of_range_is_refused_and_one_is_the_audio_itself(voice):
    with pytest.raises(ValueError, match=r"speed must be in 0.25..4.0, got 5"):
        TimeStretch(5)
    assert np.array_equal(stretch(voice, 1.0), voice)
