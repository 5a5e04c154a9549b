"""The server with a Base checkpoint: cloning per request (vLLM-Omni's fields, through the real OpenAI client's
``extra_body``), the saved-voice registry (multipart upload, list, delete, the folder), and every refusal naming
its field while the server keeps serving.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from vllm_omni.testing.serving import serving
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.random_checkpoint import write_random_checkpoint
from vllm_omni.tts.voice import save_voice
from vllm_omni.tts.wav import parse_wav

SPEECH = Path(__file__).parent / "fixtures" / "speech"
EN = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old tree."
SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=192, encoder_layers=2)
FRAMES = 4


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Speech:
    ck = write_random_checkpoint(tmp_path_factory.mktemp("serve-base") / "base", "0.6B", dtype="fp32",
                                 model_type="base", **SHAPE)
    return Speech.load(ck, weights="fp32", threads=2, max_positions=512)


def data_uri(path: Path) -> str:
    return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()


def test_the_openai_client_clones_per_request(speech, tmp_path):
    import openai

    with serving(speech, max_frames=FRAMES, app_kw={"voices": tmp_path / "voices"}) as (base, engine):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        audio = client.audio.speech.create(
            model="tiny", voice="", input="Hello in your voice.", response_format="wav",
            extra_body={"task_type": "Base", "ref_audio": data_uri(SPEECH / "reference-en.wav"), "ref_text": EN,
                        "language": "english"})
        rate, samples, _ = parse_wav(audio.content)
        assert rate == 24000 and samples.size == FRAMES * 1920
        # the same request through the Python API: the same samples (one voice, one greedy-free seed)
        voice = speech.clone(SPEECH / "reference-en.wav", EN)
        same = speech.synthesize("Hello in your voice.", voice=voice, language="english", max_frames=FRAMES)
        assert np.abs(same - samples).max() < 2 / 32768  # the wire carries 16-bit samples
        xv = client.audio.speech.create(model="tiny", voice="", input="Hi.", response_format="pcm",
                                        extra_body={"ref_audio": data_uri(SPEECH / "reference-en.wav"),
                                                    "x_vector_only_mode": True})
        assert len(xv.content) == FRAMES * 1920 * 2
        with pytest.raises(openai.BadRequestError, match="ref_text: required to clone in context"):
            client.audio.speech.create(model="tiny", voice="", input="Hi.",
                                       extra_body={"ref_audio": data_uri(SPEECH / "reference-en.wav")})
        assert httpx.get(f"{base}/health").json()["served"] == 2


def test_the_registry_saves_lists_speaks_and_deletes(speech, tmp_path):
    folder = tmp_path / "voices"
    with serving(speech, max_frames=FRAMES, app_kw={"voices": folder}) as (base, engine):
        with open(SPEECH / "reference-en.wav", "rb") as f:
            r = httpx.post(f"{base}/v1/audio/voices", timeout=120,
                           data={"name": "fox", "ref_text": EN}, files={"audio_sample": ("fox.wav", f, "audio/wav")})
        assert r.status_code == 200, r.text
        assert r.json()["id"] == "fox" and r.json()["mode"] == "icl"
        assert sorted(p.name for p in folder.iterdir()) == ["fox.voice"]
        with open(SPEECH / "reference-zh.wav", "rb") as f:
            r = httpx.post(f"{base}/v1/audio/voices", timeout=120, data={"name": "zh"},
                           files={"audio_sample": ("zh.wav", f, "audio/wav")})
        assert r.json()["mode"] == "x_vector"
        listed = httpx.get(f"{base}/v1/audio/voices").json()
        assert [v["id"] for v in listed["voices"]] == ["fox", "zh"]
        import openai

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        for voice in ("fox", "zh"):
            got = client.audio.speech.create(model="tiny", voice=voice, input="Saved voices speak.",
                                             response_format="pcm")
            assert len(got.content) == FRAMES * 1920 * 2
        got = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={
            "model": "tiny", "input": "By id.", "voice": {"id": "fox"}, "response_format": "pcm"})
        assert got.status_code == 200
        assert httpx.delete(f"{base}/v1/audio/voices/fox").json()["deleted"] is True
        assert not (folder / "fox.voice").exists()
        assert httpx.delete(f"{base}/v1/audio/voices/fox").status_code == 404
    # a restart reads the folder back
    with serving(speech, max_frames=FRAMES, app_kw={"voices": folder}) as (base, _):
        assert [v["id"] for v in httpx.get(f"{base}/v1/audio/voices").json()["voices"]] == ["zh"]


def test_a_bad_voice_file_in_the_folder_is_named_and_skipped(speech, tmp_path):
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "broken.voice").write_bytes(b"not a voice")
    save_voice(speech.clone(SPEECH / "reference-en.wav", x_vector_only=True), folder / "good.voice")
    with serving(speech, max_frames=FRAMES, app_kw={"voices": folder}) as (base, _):
        assert [v["id"] for v in httpx.get(f"{base}/v1/audio/voices").json()["voices"]] == ["good"]


@pytest.mark.parametrize("body,status,param,message", [
    ({"voice": "nobody"}, 400, "voice", "no saved voice named 'nobody'"),
    ({}, 400, "voice", "speaks in a cloned voice"),
    ({"ref_audio": "https://example.com/a.wav", "ref_text": "x"}, 400, "ref_audio", "URLs are not fetched"),
    ({"ref_audio": "file:///etc/passwd", "ref_text": "x"}, 400, "ref_audio", "local paths are read only from"),
    ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "x"}, 400, "ref_audio", "not audio"),
    ({"ref_audio": "data:audio/wav;base64,!!!", "ref_text": "x"}, 400, "ref_audio", "neither a data: URI nor base64"),
    ({"ref_text": "x"}, 400, "ref_text", "goes with ref_audio"),
    ({"voice": "x", "instructions": "Whisper."}, 400, "instructions", "no speaking instruction"),
    ({"task_type": "CustomVoice", "voice": "x"}, 400, "task_type", "speaks with Qwen3-TTS-12Hz-0.6B-Base"),
])
def test_bad_clone_requests_name_their_field(speech, tmp_path, body, status, param, message):
    with serving(speech, max_frames=FRAMES, app_kw={"voices": tmp_path / "v"}) as (base, engine):
        r = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={"model": "tiny", "input": "Hi.", **body})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["param"] == param and message in err["message"], err
        ok = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={
            "model": "tiny", "input": "Still serving.", "ref_audio": data_uri(SPEECH / "reference-en.wav"),
            "x_vector_only_mode": True, "response_format": "pcm"})
        assert ok.status_code == 200


@pytest.mark.parametrize("name,data,status,param,message", [
    ("../evil", b"", 400, "name", "not a voice name"),
    ("a b", b"", 400, "name", "not a voice name"),
    ("big", b"\0" * (10 * 2**20 + 1), 413, "audio_sample", "more than 10 MiB"),
    ("text", b"hello, not audio", 400, "audio_sample", "not audio"),
])
def test_bad_uploads_are_refused_and_nothing_is_written(speech, tmp_path, name, data, status, param, message):
    folder = tmp_path / "voices"
    with serving(speech, max_frames=FRAMES, app_kw={"voices": folder}) as (base, _):
        r = httpx.post(f"{base}/v1/audio/voices", timeout=60, data={"name": name},
                       files={"audio_sample": ("x.wav", data, "audio/wav")})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["param"] == param and message in err["message"], err
    assert list(folder.iterdir()) == []


def test_an_oversized_request_body_is_refused_before_it_is_read(speech, tmp_path):
    with serving(speech, max_frames=FRAMES) as (base, _):
        huge = "data:audio/wav;base64," + "A" * (16 * 2**20)
        r = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={
            "model": "tiny", "input": "Hi.", "ref_audio": huge, "x_vector_only_mode": True})
        assert r.status_code == 413 and "at most 16 MiB" in r.json()["error"]["message"]


def test_a_local_reference_only_inside_the_allowed_folder(speech, tmp_path):
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "me.wav").write_bytes((SPEECH / "reference-en.wav").read_bytes())
    with serving(speech, max_frames=FRAMES, app_kw={"allowed_local_media": allowed}) as (base, _):
        ok = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={
            "model": "tiny", "input": "Hi.", "ref_audio": f"file://{allowed / 'me.wav'}", "x_vector_only_mode": True,
            "response_format": "pcm"})
        assert ok.status_code == 200, ok.text
        outside = httpx.post(f"{base}/v1/audio/speech", timeout=60, json={
            "model": "tiny", "input": "Hi.", "ref_audio": f"file://{SPEECH / 'reference-en.wav'}",
            "x_vector_only_mode": True})
        assert outside.status_code == 400 and "outside the allowed folder" in outside.json()["error"]["message"]
