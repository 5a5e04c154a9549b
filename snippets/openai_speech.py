"""Speech from `qwen3-tts-edge serve` with the official OpenAI client, streamed as it is decoded.

A shallow, narrow random-weight checkpoint keeps it to seconds (random weights make noise, not a
voice); the server runs as its own process on 127.0.0.1 and is stopped at the end.
"""

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from vllm_omni.tts.random_checkpoint import write_random_checkpoint

with tempfile.TemporaryDirectory() as tmp:
    ck = write_random_checkpoint(Path(tmp) / "ck", "0.6B", talker_layers=2, predictor_layers=1, decoder_layers=1,
                                 text_hidden=256, decoder_dim=384)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([Path(sys.executable).parent / "qwen3-tts-edge", "serve", "--model", ck,
                               "--port", str(port), "--max-frames", "8", "--log-level", "warning"])
    try:
        for _ in range(600):  # at most a minute for the weights to load
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="no key set", max_retries=0)
        model = client.models.list().data[0].id
        with client.audio.speech.with_streaming_response.create(
                model=model, voice="ryan", input="Hello from two CPU cores.", response_format="pcm",
                extra_body={"stream": True, "language": "english"}) as response:
            pcm = b"".join(response.iter_bytes())  # 16-bit mono samples at 24 kHz, as they were decoded
    finally:
        server.terminate()
        server.wait(30)

frames = len(pcm) // 2 // 1920
print(f"{model}: {frames} frames of 80 ms")
assert 1 <= frames <= 8 and len(pcm) == frames * 1920 * 2
