"""``qwen3-tts-edge serve-cluster``: the server's engine and app as Ray Serve replicas, on a local
Ray cluster started by the command itself (two replicas of a small random-weight checkpoint),
driven with the real ``openai`` client as the single server is."""

from __future__ import annotations

import concurrent.futures
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from vllm_omni.tts.random_checkpoint import write_random_checkpoint
from vllm_omni.tts.server.cluster import deployment_options

ray = pytest.importorskip("ray", reason="Ray Serve is the cluster extra (pip install 'qwen3-tts-edge[cluster]')")

SHAPE = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)
FRAMES, SAMPLES = 4, 1920


def test_replicas_or_autoscaling_on_the_requests_each_replica_holds():
    fixed = deployment_options(2, None, 1, max_streams=2, max_queue=4)
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 6 and fixed["ray_actor_options"] == {"num_cpus": 1}
    scaled = deployment_options(1, 4, 2, max_streams=2, max_queue=1)
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2}
    assert "num_replicas" not in scaled
    with pytest.raises(ValueError, match="--max-replicas must be at least --replicas"):
        deployment_options(3, 2, 1, 2, 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``serve-cluster`` with two replicas on a free loopback port; yields its base URL."""
    ck = write_random_checkpoint(tmp_path_factory.mktemp("cluster") / "tiny", "0.6B", dtype="fp32", **SHAPE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("cluster-log") / "serve-cluster.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "qwen3-tts-edge"), "serve-cluster", "--model",
                                 str(ck), "--port", str(port), "--replicas", "2", "--threads", "1", "--weights", "fp32",
                                 "--max-frames", str(FRAMES), "--max-positions", "256", "--log-level", "warning"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while b"serving " not in log.read_bytes():
            assert proc.poll() is None, f"serve-cluster exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve-cluster did not start:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            rc = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0 and b"shut down" in log.read_bytes(), log.read_text()[-3000:]


def test_two_replicas_each_speak_and_every_response_is_whole(cluster):
    import openai

    client = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0)

    def one(i: int) -> tuple[int, bytes]:
        fmt = ("pcm", "mp3", "wav")[i % 3]
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="ryan", input=f"Sentence number {i}.", response_format=fmt,
                extra_body={"stream": True, "seed": i}) as r:
            return i, b"".join(r.iter_bytes())

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    for i, data in results:
        if i % 3 == 0:
            assert len(data) == FRAMES * SAMPLES * 2
        elif i % 3 == 2:
            assert len(data) == 44 + FRAMES * SAMPLES * 2
        else:
            assert data[:1] == b"\xff" and len(data) > 1000
    # both replicas answer and between them served every request
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while (len(seen) < 2 or sum(seen.values()) < 6) and time.monotonic() < deadline:
        health = httpx.get(f"{cluster}/health", timeout=10).json()
        seen[health["pid"]] = health["served"]
    assert len(seen) == 2 and sum(seen.values()) == 6, seen


def test_the_replicas_keep_the_single_servers_rules(cluster):
    r = httpx.post(f"{cluster}/v1/audio/speech", timeout=60, json={"model": "tiny", "input": "Hi.", "voice": "ryan"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{cluster}/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "input": "Hi.", "voice": "ryan", "colour": "blue"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "colour: unknown field"
    r = httpx.post(f"{cluster}/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "input": "Hi.", "voice": "ryan", "speed": 2.0, "response_format": "pcm"})
    assert r.status_code == 200 and len(r.content) // 2 == round(FRAMES * SAMPLES / 2.0)
    assert np.frombuffer(r.content, "<i2").any()
    assert "<code>Qwen3-TTS-12Hz-0.6B-CustomVoice</code>" in httpx.get(f"{cluster}/", timeout=10).text
