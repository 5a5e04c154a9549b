"""The speech server on loopback: a real OpenAI client, the wire format, and behaviour under faults.

A small random-weight checkpoint (our writer) is served by the real engine and app through
uvicorn on 127.0.0.1. Where a test needs a request to be slow, to fail or to be cut, each
utterance the engine opens (``Speech.open``) is wrapped so that it waits on a gate or raises
after its first chunk; the audio still comes from the model.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import numpy as np
import pytest

from vllm_omni.testing.serving import serving as served
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.random_checkpoint import write_random_checkpoint
from vllm_omni.tts.server.engine import SpeechEngine
from vllm_omni.tts.wav import UNKNOWN_SIZE, parse_wav

SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)
MAX_FRAMES = 6
SAMPLES = 1920


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Speech:
    ck = write_random_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", "0.6B", dtype="fp32", **SHAPE)
    return Speech.load(ck, weights="fp32", threads=2, max_positions=256)


def serving(speech, api_key=None, **engine_kw):
    """The app on 127.0.0.1 (a free port) in a thread; yields (base URL, engine)."""
    return served(speech, api_key=api_key, max_frames=MAX_FRAMES, **engine_kw)


@pytest.fixture(scope="module")
def shared(speech):
    """One server for the tests that neither patch the model nor count on a fresh engine."""
    with serving(speech) as (base, engine):
        yield base, engine


@contextlib.contextmanager
def gated(speech, monkeypatch, fail_on: str | None = None):
    """Utterances (``speech.open``) that wait for ``gate`` before each chunk after the first is
    decoded, and raise after the first chunk of ``fail_on``; the engine's one worker waits with them."""
    gate = threading.Event()
    real = speech.open

    def open_(text, **kw):
        speaking = real(text, **kw)
        take, chunks = speaking.take, [0]

        def gated_take(codes, boundary=False):
            if not take(codes, boundary):
                return False
            i, chunks[0] = chunks[0], chunks[0] + 1
            if text == fail_on and i == 1:
                raise RuntimeError("a fault inside this stream")
            while i and not gate.wait(0.05):
                if speaking.should_stop():
                    break
            return True

        speaking.take = gated_take
        return speaking

    monkeypatch.setattr(speech, "open", open_)
    yield gate
    gate.set()


def speak(base: str, **body) -> httpx.Response:
    payload = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "response_format": "wav", **body}
    return httpx.post(f"{base}/v1/audio/speech", json=payload, timeout=60)


def whole_frames(n: int) -> bool:
    return n % SAMPLES == 0 and 1 <= n // SAMPLES <= MAX_FRAMES


# --- a real OpenAI client ---------------------------------------------------------------------

def test_the_openai_client_speaks_lists_models_and_needs_the_key(speech):
    import openai

    with serving(speech, api_key="secret") as (base, engine):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="secret", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        audio = client.audio.speech.create(model="tiny", voice="ryan", input="Hello from the server.",
                                           response_format="wav")
        rate, samples, size = parse_wav(audio.content)
        assert rate == 24000 and size == samples.size * 2 == len(audio.content) - 44 and whole_frames(samples.size)
        with client.audio.speech.with_streaming_response.create(
                model="tiny", voice="vivian", input="今天天气很好。", response_format="pcm",
                extra_body={"stream": True, "language": "chinese"}) as r:
            pcm = b"".join(r.iter_bytes())
        assert whole_frames(len(pcm) // 2)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        with pytest.raises(openai.BadRequestError, match="unknown speaker 'nobody'"):
            client.audio.speech.create(model="tiny", voice="nobody", input="Hi.")
        assert httpx.get(f"{base}/health").json()["served"] == 2


def test_a_streamed_wav_says_until_the_end_and_holds_whole_frames(shared):
    base, _ = shared
    with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=60,
                      json={"model": "tiny", "input": "Streaming now.", "voice": "ryan", "stream": True,
                            "response_format": "wav"}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        raw = b"".join(r.iter_bytes())
    rate, samples, size = parse_wav(raw)
    assert size == UNKNOWN_SIZE and rate == 24000 and whole_frames(samples.size)
    same = speak(base, input="Streaming now.", seed=0)  # the same request, whole: the same samples
    assert np.array_equal(parse_wav(same.content)[1], samples)


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, param, match", [
    ({"input": ""}, 400, "input", "is empty"),
    ({"input": "x" * 4097}, 400, "input", "at most 4096 characters"),
    ({"voice": "nobody"}, 400, "voice", "valid: "),
    ({"response_format": "aac"}, 400, "response_format", "no AAC encoder ships"),
    ({"response_format": "ogg"}, 400, "response_format", "formats: mp3, opus, flac, wav, pcm"),
    ({"speed": 4.5}, 400, "speed", "less than or equal to 4"),
    ({"speed": 0.1}, 400, "speed", "greater than or equal to 0.25"),
    ({"max_new_tokens": 0}, 400, "max_new_tokens", "greater than or equal to 1"),
    ({"max_new_tokens": 2000}, 400, "max_new_tokens", "at most 6 frames on this server"),
    ({"language": "klingon"}, 400, "language", "unknown language"),
    ({"stream_format": "chunks"}, 400, "stream_format", "'audio' or 'sse'"),
    ({"colour": "blue"}, 400, "colour", "unknown field"),
    ({"stream": "yes"}, 400, "stream", "boolean"),
    ({"model": "whisper-1"}, 404, "model", "serves 'tiny' (or OpenAI's names: tts-1"),
    ({"model": "tts-2"}, 404, "model", "serves 'tiny'"),
    ({"ref_audio": "data:audio/wav;base64,AAAA"}, 400, "ref_audio", "cloning needs a Base checkpoint"),
    ({"x_vector_only_mode": True}, 400, "x_vector_only_mode", "cloning needs a Base checkpoint"),
    ({"task_type": "Base"}, 400, "task_type", "speaks with Qwen3-TTS-12Hz-0.6B-CustomVoice"),
    ({"voice": {"id": "nobody"}}, 400, "voice", "valid: "),
])
def test_bad_requests_get_a_json_error_naming_the_field(shared, body, status, param, match):
    base, engine = shared
    before = engine.status()
    r = speak(base, **body)
    err = r.json()["error"]
    assert r.status_code == status and err["param"] == param and match in err["message"]
    assert engine.status()["served"] == before["served"] and engine.status()["failed"] == before["failed"]


def test_the_voices_of_a_customvoice_checkpoint_are_its_speakers_and_none_can_be_added(shared):
    base, _ = shared
    listed = httpx.get(f"{base}/v1/audio/voices").json()
    assert "ryan" in [v["id"] for v in listed["voices"]] and all(v["kind"] == "preset" for v in listed["data"])
    r = httpx.post(f"{base}/v1/audio/voices", data={"name": "me"}, files={"audio_sample": ("a.wav", b"x", "audio/wav")})
    assert r.status_code == 400 and "cloned with a Base checkpoint" in r.json()["error"]["message"]
    assert httpx.delete(f"{base}/v1/audio/voices/ryan").status_code == 404


def test_malformed_json_and_a_missing_field(shared):
    base, _ = shared
    r = httpx.post(f"{base}/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/audio/speech", json={"model": "tiny", "voice": "ryan"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


# --- load and faults ----------------------------------------------------------------------------

def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    t.start()
    return t, out


def _wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_full_queue_says_429_with_a_retry_hint_and_bad_input_disturbs_nothing(speech, monkeypatch):
    with gated(speech, monkeypatch) as gate, serving(speech, max_streams=1, max_queue=1) as (base, engine):
        first, first_out = _in_thread(lambda: speak(base, input="The first one."))
        _wait_for(lambda: engine.status()["speaking"] == 1, "the first request to start")
        second, second_out = _in_thread(lambda: speak(base, input="The second one."))
        _wait_for(lambda: engine.status()["queued"] == 1, "the second request to queue")
        r = speak(base, input="One too many.")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "server_busy"
        assert speak(base, voice="nobody").status_code == 400  # refused before it reaches the queue
        gate.set()
        first.join(60), second.join(60)
        for out in (first_out, second_out):
            assert out["result"].status_code == 200 and whole_frames(parse_wav(out["result"].content)[1].size)
        assert engine.status()["rejected"] == 1 and engine.status()["served"] == 2


def test_two_requests_speak_together_and_each_gets_its_own_audio(speech, monkeypatch):
    texts = ["The first of two.", "今天天气很好。"]
    with serving(speech, max_streams=2, max_queue=0) as (base, engine):
        alone = [parse_wav(speak(base, input=t, seed=5).content)[1] for t in texts]
        with gated(speech, monkeypatch) as gate:
            runs = [_in_thread(lambda t=t: speak(base, input=t, seed=5)) for t in texts]
            _wait_for(lambda: engine.status()["speaking"] == 2, "both requests to speak at once")
            assert speak(base, input="A third.").status_code == 429  # two streams, no queue
            gate.set()
            for t, _ in runs:
                t.join(60)
        for (_, out), want in zip(runs, alone):
            assert out["result"].status_code == 200 and np.array_equal(parse_wav(out["result"].content)[1], want)
        assert engine.status()["served"] == 4 and engine.status()["rejected"] == 1


def test_a_fault_in_one_stream_ends_only_that_stream(speech, monkeypatch):
    with gated(speech, monkeypatch, fail_on="This one breaks.") as gate, serving(speech) as (base, engine):
        gate.set()
        with pytest.raises(httpx.HTTPError):  # the body is cut short: the client sees an incomplete response
            with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=60,
                              json={"model": "tiny", "input": "This one breaks.", "voice": "ryan", "stream": True,
                                    "response_format": "pcm"}) as r:
                assert r.status_code == 200
                b"".join(r.iter_bytes())
        whole = speak(base, input="This one breaks.")  # not streamed: a JSON error, nothing half-sent
        assert whole.status_code == 500 and "a fault inside this stream" in whole.json()["error"]["message"]
        ok = speak(base, input="And this one works.")
        assert ok.status_code == 200 and whole_frames(parse_wav(ok.content)[1].size)
        assert engine.status()["failed"] == 2 and engine.status()["served"] == 1


def test_a_fault_after_the_first_sse_event_arrives_as_an_error_event(speech, monkeypatch):
    with gated(speech, monkeypatch, fail_on="This one breaks.") as gate, serving(speech) as (base, engine):
        gate.set()
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=60,
                          json={"model": "tiny", "input": "This one breaks.", "voice": "ryan", "stream_format": "sse",
                                "response_format": "pcm"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
        kinds = [e["type"] for e in events]
        assert kinds[0] == "speech.audio.delta" and kinds[-1] == "speech.audio.error"
        assert "speech.audio.done" not in kinds
        error = events[-1]["error"]
        assert error["type"] == "server_error" and "a fault inside this stream" in error["message"]


def sse_events(lines) -> list[dict]:
    """The JSON of each ``data:`` line of a server-sent event stream, checking that each event's
    ``event:`` line names its type."""
    import json

    out, named = [], None
    for line in lines:
        if line.startswith("event: "):
            named = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == named
            out.append(data)
    return out


def test_a_client_that_leaves_frees_its_stream(speech, monkeypatch):
    with gated(speech, monkeypatch) as gate, serving(speech) as (base, engine):
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=60,
                          json={"model": "tiny", "input": "Nobody will hear this.", "voice": "ryan",
                                "stream": True}) as r:
            assert r.status_code == 200
            next(r.iter_raw())  # the header and the first chunk, then hang up
        _wait_for(lambda: engine.status()["cancelled"] == 1 and engine.status()["speaking"] == 0,
                  "the stream to be dropped")
        gate.set()
        ok = speak(base, input="The next one.")
        assert ok.status_code == 200 and engine.status()["served"] == 1


def test_a_request_past_its_timeout_gets_504_or_a_cut_stream(speech, monkeypatch):
    with gated(speech, monkeypatch) as gate, serving(speech, timeout_s=3.0) as (base, engine):
        r = speak(base, input="Too slow.")
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        gate.set()
        assert speak(base, input="Fast enough.").status_code == 200


def test_the_engine_loads_its_model_in_its_worker_and_says_why_it_could_not(speech, tmp_path):
    seen = []

    def load():
        seen.append(threading.current_thread().name)
        return speech

    engine = SpeechEngine(load=load, max_frames=MAX_FRAMES)
    try:
        assert seen == ["speech-engine"] and engine.speech is speech and engine.status()["max_streams"] == 2
    finally:
        engine.close()
    with pytest.raises(FileNotFoundError, match="no checkpoint here"):
        SpeechEngine(load=lambda: (_ for _ in ()).throw(FileNotFoundError("no checkpoint here")))
    with pytest.raises(ValueError, match="max_streams must be in 1..8"):
        SpeechEngine(speech, max_streams=9)
    with pytest.raises(ValueError, match="give speech or load"):
        SpeechEngine()
