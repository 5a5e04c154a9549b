"""The server as the usual clients use it: the real ``openai`` client in every format, streamed and
whole, SSE and speed; the request bodies of Open WebUI, Home Assistant, SillyTavern and LibreChat
(``shared/reference/serving-api.md``) replayed and their audio decoded back; the frame cap on a
model that never stops (random weights never emit the end code); and the page at ``/`` in a
headless Chromium."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from test_audio_out import decode, with_flac_length
from test_tts_server import sse_events
from vllm_omni.testing.serving import serving
from vllm_omni.tts.encode import FORMATS
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.random_checkpoint import write_random_checkpoint
from vllm_omni.tts.server.limits import frame_cap
from vllm_omni.tts.wav import parse_wav

SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)
MAX_FRAMES = 6
SAMPLES = 1920
TEXT = "Hello from the server."


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Speech:
    ck = write_random_checkpoint(tmp_path_factory.mktemp("clients") / "tiny", "0.6B", dtype="fp32", **SHAPE)
    return Speech.load(ck, weights="fp32", threads=2, max_positions=256)


@pytest.fixture(scope="module")
def server(speech):
    with serving(speech, max_frames=MAX_FRAMES) as (base, engine):
        yield base, engine


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(server) -> np.ndarray:
    """The samples of TEXT as WAV: every other format must decode back to as many."""
    r = httpx.post(f"{server[0]}/v1/audio/speech", timeout=60,
                   json={"model": "tiny", "input": TEXT, "voice": "ryan", "response_format": "wav"})
    samples = parse_wav(r.content)[1]
    assert samples.size == MAX_FRAMES * SAMPLES  # random weights never stop: the cap holds
    return samples


def decoded_length(data: bytes, fmt: str, n: int, streamed: bool) -> int:
    if fmt == "flac" and streamed:
        data = with_flac_length(data, n)
    if fmt == "wav" and streamed:
        return parse_wav(data)[1].size
    return len(decode(data, fmt))


def assert_length(fmt: str, got: int, n: int, streamed: bool) -> None:
    if fmt == "mp3" and streamed:  # the encoder's delay stays in front (vllm_omni.tts.encode)
        assert n < got < n + 0.2 * 24000
    else:
        assert got == n


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_openai_client_gets_every_format_whole(client, reference, fmt):
    audio = client.audio.speech.create(model="tiny", voice="ryan", input=TEXT, response_format=fmt)
    assert audio.response.headers["content-type"] == FORMATS[fmt][0]
    assert audio.response.headers["x-stop-reason"] == "frame_limit"
    assert_length(fmt, decoded_length(audio.content, fmt, reference.size, False), reference.size, False)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_openai_client_streams_every_format(client, reference, fmt):
    with client.audio.speech.with_streaming_response.create(model="tiny", voice="ryan", input=TEXT,
                                                            response_format=fmt, extra_body={"stream": True}) as r:
        assert r.headers["content-type"] == FORMATS[fmt][0] and r.headers["x-frame-limit"] == "6; from=server"
        data = b"".join(r.iter_bytes())
    assert_length(fmt, decoded_length(data, fmt, reference.size, True), reference.size, True)


@pytest.mark.parametrize("speed", [0.5, 1.25, 2.0])
def test_speed_changes_the_length_whole_and_streamed(client, reference, speed):
    whole = client.audio.speech.create(model="tiny", voice="ryan", input=TEXT, response_format="pcm", speed=speed)
    with client.audio.speech.with_streaming_response.create(model="tiny", voice="ryan", input=TEXT, speed=speed,
                                                            response_format="pcm", extra_body={"stream": True}) as r:
        chunked = b"".join(r.iter_bytes())
    assert len(whole.content) // 2 == round(reference.size / speed)
    assert chunked == whole.content  # stretched chunk by chunk as the audio comes: the same samples


def test_sse_streams_deltas_then_done_with_usage(client, reference):
    with client.audio.speech.with_streaming_response.create(model="tiny", voice="ryan", input=TEXT,
                                                            response_format="pcm", stream_format="sse") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" and e["response_format"] == "pcm" for e in deltas)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert np.array_equal(np.frombuffer(pcm, "<i2"), np.round(reference * 32767).astype("<i2"))
    assert done["type"] == "speech.audio.done" and done["stop_reason"] == "frame_limit"
    usage = done["usage"]
    assert usage["output_tokens"] == MAX_FRAMES and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_sse_carries_mp3_that_decodes(client, reference):
    with client.audio.speech.with_streaming_response.create(model="tiny", voice="ryan", input=TEXT,
                                                            response_format="mp3", stream_format="sse") as r:
        events = sse_events(r.iter_lines())
    data = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert_length("mp3", len(decode(data, "mp3")), reference.size, True)


# --- what the clients send ------------------------------------------------------------------------

CLIENT_BODIES = {
    # Open WebUI: no response_format (gets OpenAI's default, mp3)
    "open-webui": ({"model": "tts-1", "input": TEXT, "voice": "ryan"}, "mp3"),
    # Home Assistant core: instructions, speed, and mp3, opus ("ogg") or pcm ("raw")
    "home-assistant-mp3": ({"model": "gpt-4o-mini-tts", "voice": "ryan", "input": TEXT, "instructions": "Calm.",
                            "speed": 1.0, "response_format": "mp3"}, "mp3"),
    "home-assistant-ogg": ({"model": "gpt-4o-mini-tts", "voice": "ryan", "input": TEXT, "instructions": "Calm.",
                            "speed": 1.5, "response_format": "opus"}, "opus"),
    "home-assistant-raw": ({"model": "gpt-4o-mini-tts", "voice": "ryan", "input": TEXT, "instructions": "",
                            "speed": 1.0, "response_format": "pcm"}, "pcm"),
    # HACS openai_tts and SillyTavern: always mp3, SillyTavern with speed
    "hacs-openai-tts": ({"model": "tts-1-hd", "voice": "ryan", "input": TEXT, "response_format": "mp3"}, "mp3"),
    "sillytavern": ({"model": "tts-1", "input": TEXT, "voice": "ryan", "speed": 0.8, "response_format": "mp3"}, "mp3"),
    # LibreChat: no response_format, and its backend's name
    "librechat": ({"input": TEXT, "model": "tts-1", "voice": "ryan", "backend": "openai"}, "mp3"),
}


@pytest.mark.parametrize("name", list(CLIENT_BODIES))
def test_each_clients_own_request_gets_playable_audio_of_its_type(server, reference, name):
    body, fmt = CLIENT_BODIES[name]
    r = httpx.post(f"{server[0]}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == FORMATS[fmt][0]
    n = round(reference.size / body.get("speed", 1.0))
    assert len(decode(r.content, fmt)) == n


def test_openai_model_names_and_their_dated_variants_are_aliases():
    from vllm_omni.tts.server.protocol import is_openai_model

    assert all(map(is_openai_model, ["tts-1", "tts-1-hd", "tts-1-1106", "tts-1-hd-1106", "gpt-4o-mini-tts",
                                     "gpt-4o-mini-tts-2025-03-20"]))
    assert not any(map(is_openai_model, ["tts-2", "tts-1-fast", "whisper-1", "gpt-4o"]))


def test_open_webui_reads_the_voices_and_models_it_expects(server):
    base = server[0]
    voices = httpx.get(f"{base}/v1/audio/voices").json()["voices"]
    assert {"id": "ryan", "name": "ryan"} in voices
    assert httpx.get(f"{base}/v1/audio/models").json()["models"] == [{"id": "tiny"}]


def test_openai_names_can_be_refused_and_the_default_format_set(speech):
    with serving(speech, max_frames=2, app_kw={"openai_names": False, "default_format": "flac"}) as (base, _):
        r = httpx.post(f"{base}/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "ryan"}, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["message"] == (
            "model: 'tts-1' is not served here; this server serves 'tiny'")
        r = httpx.post(f"{base}/v1/audio/speech", json={"model": "tiny", "input": TEXT, "voice": "ryan"}, timeout=60)
        assert r.headers["content-type"] == "audio/flac" and len(decode(r.content, "flac")) == 2 * SAMPLES


# --- limits -------------------------------------------------------------------------------------

def test_the_frame_cap_follows_the_text_and_a_request_may_lower_it(speech):
    """With the checkpoint's own limit (2,047 frames), a model that never stops is cut by the text's cap."""
    with serving(speech, max_frames=None) as (base, engine):
        short = "Hi there."
        cap = frame_cap(short)
        assert cap == 38  # 12.5 frames/s x (1 s + 8 characters x 0.25 s), rounded up
        r = httpx.post(f"{base}/v1/audio/speech", timeout=120,
                       json={"model": "tiny", "input": short, "voice": "ryan", "response_format": "pcm"})
        assert r.headers["x-stop-reason"] == "frame_limit" and r.headers["x-frame-limit"] == f"{cap}; from=text"
        assert len(r.content) // 2 == cap * SAMPLES
        r = httpx.post(f"{base}/v1/audio/speech", timeout=120,
                       json={"model": "tiny", "input": short, "voice": "ryan", "response_format": "pcm",
                             "max_new_tokens": 3})
        assert r.headers["x-frame-limit"] == "3; from=request" and len(r.content) // 2 == 3 * SAMPLES
        assert engine.status()["failed"] == 0


def test_the_cap_lets_the_spoken_references_through_with_room():
    """The fixtures' espeak-ng readings (tests/fixtures/speech/README.md) fit well inside their caps."""
    en = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old tree."
    zh = "今天天气很好，我们去公园散步吧。"
    assert frame_cap(en) / 12.5 > 3.5 * 5.02 and frame_cap(zh) / 12.5 > 2.6 * 5.82
    assert frame_cap("今天") == 38  # 1 s + 2 x 1 s, at 12.5 frames a second


# --- the page -----------------------------------------------------------------------------------

def test_the_page_names_the_model_and_asks_for_nothing_off_the_host(server):
    page = httpx.get(f"{server[0]}/").text
    assert "<code>tiny</code>" in page and "http://" not in page and "https://" not in page
    assert '<option value="mp3" selected>' in page


def test_the_page_plays_a_streamed_request_and_a_file_and_shows_an_error(server):
    from test_browser import BROWSERS, CHROME_FLAGS, _which, browser_missing

    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = _which(BROWSERS, "/usr/bin/chromium")
    for flag in CHROME_FLAGS + ("--autoplay-policy=no-user-gesture-required",):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(_which(("chromedriver",), "/usr/bin/chromedriver")))
    try:
        driver.get(f"{server[0]}/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "voice")).options) > 0)
        assert "ryan" in [o.text for o in Select(driver.find_element(By.ID, "voice")).options]

        def run(fmt: str, speed: str = "1") -> str:
            driver.execute_script("document.body.dataset.state = ''")
            Select(driver.find_element(By.ID, "format")).select_by_value(fmt)
            field = driver.find_element(By.ID, "speed")
            field.clear()
            field.send_keys(speed)
            driver.find_element(By.ID, "speak").click()
            wait.until(lambda d: d.execute_script("return document.body.dataset.state") in ("played", "error"))
            return driver.execute_script("return document.body.dataset.state")

        assert run("stream") == "played"
        assert "first audio after" in driver.find_element(By.ID, "status").text
        assert float(driver.execute_script("return document.body.dataset.seconds")) == MAX_FRAMES * 0.08
        assert run("mp3") == "played"
        assert run("stream", "9") == "error"
        assert "speed: Input should be less than or equal to 4" in driver.find_element(By.ID, "status").text
    finally:
        driver.quit()
