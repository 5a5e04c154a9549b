"""The speech server on 127.0.0.1 for tests: the real engine and app under uvicorn, on a free port."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator


@contextlib.contextmanager
def serving(speech: Any, api_key: str | None = None, model_id: str = "tiny", max_frames: int = 6,
            app_kw: dict[str, Any] | None = None, **engine_kw: Any) -> Iterator[tuple[str, Any]]:
    """``speech`` served in a thread; yields (base URL, engine). ``app_kw`` goes to ``create_app`` (voices,
    allowed_local_media), the rest to ``SpeechEngine``."""
    import uvicorn

    from vllm_omni.tts.server.app import create_app
    from vllm_omni.tts.server.engine import SpeechEngine

    engine = SpeechEngine(speech, max_frames=max_frames, **engine_kw)
    app = create_app(engine, model_id=model_id, api_key=api_key, **(app_kw or {}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            engine.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()
