"""The HTTP face: an OpenAI-compatible ``/v1/audio/speech``, ``/v1/models`` and ``/health`` (FastAPI),
and for a Base checkpoint the saved voices (``GET``/``POST /v1/audio/voices``,
``DELETE /v1/audio/voices/{name}``, ``server.voices``).

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
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_omni.tts.prompt import PromptError, resolve_language, resolve_speaker
from vllm_omni.tts.reference_audio import ReferenceAudioError, read_reference
from vllm_omni.tts.server.engine import Busy, Job, SpeechEngine, Timeout
from vllm_omni.tts.server.protocol import MEDIA_TYPES, TASK_TYPES, RequestError, SpeechRequest, parse_request
from vllm_omni.tts.server.voices import MAX_UPLOAD_BYTES, VoiceRegistry, check_name, decode_reference
from vllm_omni.tts.voice import VoiceError


MAX_BODY_BYTES = 16 * 2**20  # a 10 MiB reference as base64 (13.4 MiB), the text and the rest


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def create_app(engine: SpeechEngine, *, model_id: str, api_key: str | None = None, voices: Path | None = None,
               allowed_local_media: Path | None = None) -> FastAPI:
    """The FastAPI application serving ``engine``'s checkpoint under the name ``model_id``; a Base checkpoint's
    saved voices live in ``voices`` (``server.voices``), and requests may name reference files only inside
    ``allowed_local_media``."""
    from vllm_omni.tts.wav import UNKNOWN_SIZE, header, pcm16

    speech = engine.speech
    cfg = speech.ckpt.config
    registry = VoiceRegistry(speech, voices) if cfg.clones else None
    for name in registry.names() if registry is not None else []:  # primed in the worker, ahead of the first request
        engine.call(lambda sp, v=registry.get(name): sp.prepare_voice(v))
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
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                raise RequestError(413, f"the request body is {int(declared) // 2**20} MiB; at most "
                                        f"{MAX_BODY_BYTES // 2**20} MiB (a reference of at most "
                                        f"{MAX_UPLOAD_BYTES // 2**20} MiB as base64, and the text)")
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                raise RequestError(413, f"the request body is more than {MAX_BODY_BYTES // 2**20} MiB")
            try:
                data = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
            req = parse_request(data)
            if req.model != model_id:
                raise RequestError(404, f"model: {req.model!r} is not served here; this server serves {model_id!r}",
                                   param="model", code="model_not_found")
            speaker, voice, clone = _who_speaks(cfg, req, registry, allowed_local_media)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            job = Job(req.input, speaker, req.language, req.instructions,
                      events=lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value)),
                      deadline=time.monotonic() + engine.timeout_s, seed=req.seed, voice=voice, clone=clone)
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

    @app.get("/v1/audio/voices", dependencies=keyed)
    async def list_voices() -> dict[str, Any]:
        """The voices a request can name: the saved ones (Base), or the preset speakers."""
        if registry is None:
            data = [{"id": n, "object": "audio.voice", "name": n, "kind": "preset"} for n in sorted(cfg.speakers)]
        else:
            data = [registry.describe(n) for n in registry.names()]
        return {"object": "list", "data": data, "voices": [{"id": v["id"], "name": v["name"]} for v in data]}

    @app.post("/v1/audio/voices", dependencies=keyed)
    async def add_voice(name: str = Form(...), audio_sample: UploadFile = File(...), ref_text: str | None = Form(None),
                        x_vector_only_mode: bool | None = Form(None)):
        """Clone ``audio_sample`` and save it as ``name``: in context with ``ref_text``, else from the speaker
        embedding alone (or as ``x_vector_only_mode`` says)."""
        try:
            if registry is None:
                raise RequestError(400, f"{cfg.family} speaks in preset or described voices; voices are cloned with a "
                                        "Base checkpoint", param="audio_sample")
            check_name(name)
            data = await audio_sample.read(MAX_UPLOAD_BYTES + 1)
            if len(data) > MAX_UPLOAD_BYTES:
                raise RequestError(413, f"audio_sample: more than {MAX_UPLOAD_BYTES // 2**20} MiB; send a shorter "
                                        "recording", param="audio_sample")
            audio = read_reference(data, name=f"audio_sample {audio_sample.filename or ''}".strip(),
                                   param="audio_sample")
            x_vector_only = not (ref_text and ref_text.strip()) if x_vector_only_mode is None else x_vector_only_mode
            if registry.get(name) is not None:
                raise VoiceError(f"name: a voice named {name!r} exists; delete it first", param="name")

            def make(sp):
                voice = sp.clone(audio, ref_text, x_vector_only)
                sp.prepare_voice(voice)  # ready before its first request
                return voice

            voice = await asyncio.wrap_future(engine.call(make))
            return registry.add(name, voice)
        except (VoiceError, ReferenceAudioError) as exc:
            return _error(RequestError(400, str(exc), param=exc.param))
        except RequestError as exc:
            return _error(exc)

    @app.delete("/v1/audio/voices/{name}", dependencies=keyed)
    async def delete_voice(name: str):
        try:
            check_name(name)
        except VoiceError as exc:
            return _error(RequestError(400, str(exc), param="name"))
        if registry is None or not registry.delete(name):
            return _error(RequestError(404, f"no saved voice named {name!r}", param="name", code="voice_not_found"))
        return {"id": name, "object": "audio.voice", "deleted": True}

    return app


def _who_speaks(cfg, req: SpeechRequest, registry: VoiceRegistry | None, allowed_local_media: Path | None):
    """(speaker, voice, clone) of a request, every refusal naming its field (see the module doc)."""
    name = req.voice_name
    if req.task_type is not None and TASK_TYPES[req.task_type] != cfg.model_type:
        raise RequestError(400, f"task_type: {req.task_type!r}, but this server speaks with {cfg.family}",
                           param="task_type")
    if not cfg.clones:
        for field in ("ref_audio", "ref_text", "x_vector_only_mode"):
            if getattr(req, field):
                raise RequestError(400, f"{field}: {cfg.family} speaks in its preset or described voices; cloning "
                                        "needs a Base checkpoint", param=field)
        try:
            speaker = resolve_speaker(cfg, name)
            resolve_language(cfg, req.language, speaker)
        except PromptError as exc:
            raise _prompt_error(exc) from None
        return speaker, None, None
    try:
        resolve_language(cfg, req.language, None)
    except PromptError as exc:
        raise _prompt_error(exc) from None
    if req.instructions:
        raise RequestError(400, f"instructions: {cfg.family} takes no speaking instruction when cloning",
                           param="instructions")
    if req.ref_audio is not None:
        if name:
            raise RequestError(400, "voice: give a saved voice or ref_audio, not both", param="voice")
        if not req.x_vector_only_mode and not (req.ref_text and req.ref_text.strip()):
            raise RequestError(400, "ref_text: required to clone in context (what is said in ref_audio); or set "
                                    "x_vector_only_mode", param="ref_text")
        try:
            audio = decode_reference(req.ref_audio, allowed_local_media)
        except ReferenceAudioError as exc:
            raise RequestError(400, str(exc), param="ref_audio") from None
        return None, None, (audio, req.ref_text, req.x_vector_only_mode)
    if req.ref_text or req.x_vector_only_mode:
        field = "ref_text" if req.ref_text else "x_vector_only_mode"
        raise RequestError(400, f"{field}: goes with ref_audio; a saved voice holds its reference", param=field)
    voice = registry.get(name) if name else None
    if voice is None:
        saved = ", ".join(registry.names()) or "none yet (POST /v1/audio/voices adds one)"
        what = f"voice: no saved voice named {name!r}" if name else f"voice: {cfg.family} speaks in a cloned voice"
        raise RequestError(400, f"{what}; give a saved voice (saved: {saved}) or ref_audio", param="voice")
    return None, voice, None


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
WIRE_FIELDS = {"text": "input", "speaker": "voice", "language": "language", "instruct": "instructions", "voice": "voice",
               "ref_text": "ref_text", "ref_audio": "ref_audio"}


def _prompt_error(exc: PromptError) -> RequestError:
    """A PromptError as a 400 naming the request's field."""
    field = WIRE_FIELDS.get(exc.param)
    return RequestError(400, f"{field}: {exc}" if field else str(exc), param=field)


def _as_request_error(exc: Exception) -> RequestError:
    """What the engine reported before the first audio, as an HTTP error."""
    if isinstance(exc, PromptError):
        return _prompt_error(exc)
    if isinstance(exc, (VoiceError, ReferenceAudioError)):
        return RequestError(400, str(exc), param=WIRE_FIELDS.get(exc.param, exc.param))
    if isinstance(exc, Timeout):
        return RequestError(504, str(exc), kind="timeout_error", code="timeout")
    if isinstance(exc, ValueError):
        return RequestError(400, str(exc))
    return RequestError(500, f"speech failed: {type(exc).__name__}: {exc}", kind="server_error")
