"""The HTTP face: an OpenAI-compatible ``/v1/audio/speech``, ``/v1/models`` and ``/health`` (FastAPI).

Why the first audio event is awaited before the response starts: until then a failure (a
prompt the checkpoint refuses, a timeout in the queue) can still be an HTTP status with a JSON
error; after it, a streamed response can only be cut short, which a client sees as an
incomplete body. A client that goes away cancels its request, which the engine drops at its
next frame.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_omni.tts.prompt import PromptError, resolve_language, resolve_speaker
from vllm_omni.tts.server.engine import Busy, Job, SpeechEngine, Timeout
from vllm_omni.tts.server.protocol import MEDIA_TYPES, RequestError, parse_request


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def create_app(engine: SpeechEngine, *, model_id: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI application serving ``engine``'s checkpoint under the name ``model_id``."""
    from vllm_omni.tts.wav import UNKNOWN_SIZE, header, pcm16

    speech = engine.speech
    cfg = speech.ckpt.config
    rate = speech.sample_rate
    created = int(time.time())
    app = FastAPI(title="qwen3-tts-edge", version="1", docs_url=None, redoc_url=None)

    # A dependency, not an HTTP middleware: Starlette's BaseHTTPMiddleware ends a streamed body
    # cleanly even when the stream failed, which would hide a cut response from the client.
    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise RequestError(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                               kind="authentication_error", code="invalid_api_key")

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return _error(exc)

    keyed = [Depends(check_key)]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, **engine.status()}

    @app.get("/v1/models", dependencies=keyed)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "qwen3-tts-edge"}]}

    @app.post("/v1/audio/speech", dependencies=keyed)
    async def audio_speech(request: Request):
        try:
            raw = await request.body()
            try:
                data = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
            req = parse_request(data)
            if req.model != model_id:
                raise RequestError(404, f"model: {req.model!r} is not served here; this server serves {model_id!r}",
                                   param="model", code="model_not_found")
            try:
                speaker = resolve_speaker(cfg, req.voice)
                resolve_language(cfg, req.language, speaker)
            except PromptError as exc:
                raise _prompt_error(exc) from None
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            job = Job(req.input, speaker, req.language, req.instructions,
                      events=lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value)),
                      deadline=time.monotonic() + engine.timeout_s, seed=req.seed)
            try:
                engine.submit(job)
            except Busy as exc:
                raise RequestError(429, f"{exc}; retry after about {exc.retry_after_s} s", kind="rate_limit_error",
                                   code="server_busy", headers={"Retry-After": str(exc.retry_after_s)}) from None
            first = await _next_event(events, request, job)
            if first is None:  # the client left while the request waited
                return Response(status_code=499)
            if first[0] == "error":
                raise _as_request_error(first[1])
        except RequestError as exc:
            return _error(exc)

        fmt = req.response_format
        headers = {"X-Sample-Rate": str(rate)}
        if not req.stream:  # the whole utterance, then one response with exact sizes (or a JSON error)
            parts, event = [], first
            while event is not None and event[0] == "audio":
                parts.append(pcm16(event[1].samples))
                event = await _next_event(events, request, job)
            if event is None:
                return Response(status_code=499)
            if event[0] == "error":
                return _error(_as_request_error(event[1]))
            data = b"".join(parts)
            return Response((header(rate, len(data)) if fmt == "wav" else b"") + data, media_type=MEDIA_TYPES[fmt],
                            headers=headers)

        async def body() -> AsyncIterator[bytes]:
            """The header, then every chunk's bytes as they come; the job is cancelled if the client stops reading."""
            kind, value = first
            try:
                if fmt == "wav":
                    yield header(rate, UNKNOWN_SIZE)
                while kind == "audio":
                    yield pcm16(value.samples)
                    event = await _next_event(events, request, job)
                    if event is None:  # the client left
                        return
                    kind, value = event
                if kind == "error":  # mid-stream: all that is left is to cut the body short
                    raise RuntimeError(f"speech failed after the first audio: {value}")
            finally:
                job.cancel()  # no-op once the job has ended

        return StreamingResponse(body(), media_type=MEDIA_TYPES[fmt], headers=headers)

    return app


async def _next_event(events: asyncio.Queue, request: Request, job: Job, poll_s: float = 0.5):
    """The job's next event, or None (and the job cancelled) once the client has disconnected."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), poll_s)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                return None
        except asyncio.CancelledError:
            job.cancel()
            raise


# The prompt's parameter names (PromptError.param) as the request's fields.
WIRE_FIELDS = {"text": "input", "speaker": "voice", "language": "language", "instruct": "instructions"}


def _prompt_error(exc: PromptError) -> RequestError:
    """A PromptError as a 400 naming the request's field."""
    field = WIRE_FIELDS.get(exc.param)
    return RequestError(400, f"{field}: {exc}" if field else str(exc), param=field)


def _as_request_error(exc: Exception) -> RequestError:
    """What the engine reported before the first audio, as an HTTP error."""
    if isinstance(exc, PromptError):
        return _prompt_error(exc)
    if isinstance(exc, Timeout):
        return RequestError(504, str(exc), kind="timeout_error", code="timeout")
    if isinstance(exc, ValueError):
        return RequestError(400, str(exc))
    return RequestError(500, f"speech failed: {type(exc).__name__}: {exc}", kind="server_error")
