"""The HTTP face: an OpenAI-compatible ``/v1/audio/speech``, ``/v1/models``, ``/v1/audio/models``,
``/health`` and a page to try it at ``/`` (FastAPI), and for a Base checkpoint the saved voices
(``GET``/``POST /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}``, ``server.voices``).

A response is encoded as it is made (``tts.encode``), after the speed change (``tts.time_stretch``):
whole, streamed, or as OpenAI's server-sent events; each request's frames are capped
(``server.limits``) and the response says where the cap came from and why the speech ended.

Why the first audio event is awaited before the response starts: until then a failure (a
prompt the checkpoint refuses, a timeout in the queue) can still be an HTTP status with a JSON
error; after it, a streamed response can only be cut short, which a client sees as an
incomplete body. A client that goes away cancels its request, which the engine drops at its
next frame.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np
from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from vllm_omni.tts.encode import Encoder, check_format, encode, media_type
from vllm_omni.tts.prompt import PromptError, resolve_language, resolve_speaker
from vllm_omni.tts.reference_audio import ReferenceAudioError, read_reference
from vllm_omni.tts.server.engine import Busy, Job, SpeechEngine, Timeout
from vllm_omni.tts.server.limits import request_frames
from vllm_omni.tts.server.protocol import (OPENAI_MODELS, TASK_TYPES, RequestError, SpeechRequest, is_openai_model,
                                          parse_request)
from vllm_omni.tts.server.voices import MAX_UPLOAD_BYTES, VoiceRegistry, check_name, decode_reference
from vllm_omni.tts.time_stretch import TimeStretch
from vllm_omni.tts.voice import VoiceError


MAX_BODY_BYTES = 16 * 2**20  # a 10 MiB reference as base64 (13.4 MiB), the text and the rest


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def create_app(engine: SpeechEngine, *, model_id: str, api_key: str | None = None, voices: Path | None = None,
               allowed_local_media: Path | None = None, default_format: str = "mp3",
               openai_names: bool = True) -> FastAPI:
    """The FastAPI application serving ``engine``'s checkpoint under the name ``model_id`` (and, with
    ``openai_names``, OpenAI's TTS model names); a Base checkpoint's saved voices live in ``voices``
    (``server.voices``), and requests may name reference files only inside ``allowed_local_media``.
    A request without ``response_format`` gets ``default_format``."""
    check_format(default_format)
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
        return {"status": "ok", "model": model_id, "pid": os.getpid(), **engine.status()}

    @app.get("/v1/models", dependencies=keyed)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "qwen3-tts-edge"}]}

    @app.get("/v1/audio/models", dependencies=keyed)
    async def audio_models() -> dict[str, Any]:
        """The served model in Open WebUI's shape (``models``) and OpenAI's list shape (``data``)."""
        return {"object": "list", "data": [{"id": model_id, "object": "model"}], "models": [{"id": model_id}]}

    @app.get("/", include_in_schema=False)
    async def try_page() -> HTMLResponse:
        from vllm_omni.tts.server.page import render

        return HTMLResponse(render(model_id, default_format))

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
            if req.model != model_id and not (openai_names and is_openai_model(req.model)):
                also = f" (or OpenAI's names: {', '.join(OPENAI_MODELS)})" if openai_names else ""
                raise RequestError(404, f"model: {req.model!r} is not served here; this server serves {model_id!r}"
                                        f"{also}", param="model", code="model_not_found")
            limit = engine.frame_limit
            if req.max_new_tokens is not None and req.max_new_tokens > limit:
                raise RequestError(400, f"max_new_tokens: at most {limit} frames on this server (--max-frames), got "
                                        f"{req.max_new_tokens}", param="max_new_tokens")
            frames, cap_from = request_frames(req.input, req.max_new_tokens, limit)
            speaker, voice, clone = _who_speaks(cfg, req, registry, allowed_local_media)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            job = Job(req.input, speaker, req.language, req.instructions,
                      events=lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value)),
                      deadline=time.monotonic() + engine.timeout_s, seed=req.seed, max_frames=frames, voice=voice,
                      clone=clone)
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

        fmt = req.response_format or default_format
        stretch = TimeStretch(req.speed, rate) if req.speed != 1.0 else None
        headers = {"X-Sample-Rate": str(rate), "X-Frame-Limit": f"{frames}; from={cap_from}"}
        if req.stream_format == "sse":
            return StreamingResponse(_sse(first, events, request, job, fmt, rate, stretch),
                                     media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        if not req.stream:  # the whole utterance, then one response with exact sizes (or a JSON error)
            parts, event = [], first
            while event is not None and event[0] == "audio":
                parts.append(stretch.add(event[1].samples) if stretch else event[1].samples)
                event = await _next_event(events, request, job)
            if event is None:
                return Response(status_code=499)
            if event[0] == "error":
                return _error(_as_request_error(event[1]))
            if stretch:
                parts.append(stretch.finish())
            audio = await asyncio.to_thread(encode, np.concatenate(parts), fmt, rate)
            return Response(audio, media_type=media_type(fmt),
                            headers={**headers, "X-Stop-Reason": _stop_reason(event[1])})

        async def body() -> AsyncIterator[bytes]:
            """Every chunk's bytes as they are encoded; the job is cancelled if the client stops reading."""
            try:
                async for kind, value in _encoded(first, events, request, job, fmt, rate, stretch):
                    if kind == "error":  # mid-stream: all that is left is to cut the body short
                        raise RuntimeError(f"speech failed after the first audio: {value}")
                    if kind == "audio" and value:
                        yield value
            finally:
                job.cancel()  # no-op once the job has ended

        return StreamingResponse(body(), media_type=media_type(fmt), headers=headers)

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


async def _encoded(first, events: asyncio.Queue, request: Request, job: Job, fmt: str, rate: int,
                   stretch: TimeStretch | None):
    """("audio", bytes) as each chunk is stretched and encoded, then ("end", SpeechStats) or ("error", exc);
    nothing more once the client has left."""
    encoder = Encoder(fmt, rate)
    event = first
    while event is not None and event[0] == "audio":
        samples = event[1].samples
        yield "audio", await asyncio.to_thread(encoder.add, stretch.add(samples) if stretch else samples)
        event = await _next_event(events, request, job)
    if event is None:  # the client left
        return
    if event[0] == "error":
        yield event
        return
    tail = encoder.add(stretch.finish()) if stretch else b""
    yield "audio", tail + await asyncio.to_thread(encoder.finish)
    yield event


def _sse_event(data: dict[str, Any]) -> bytes:
    """One server-sent event: its type as the ``event`` (as vLLM-Omni sends it) and the JSON (as OpenAI does)."""
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _sse(first, events: asyncio.Queue, request: Request, job: Job, fmt: str, rate: int,
               stretch: TimeStretch | None) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` (base64 audio in ``fmt``), then ``speech.audio.done``
    with usage and why it stopped; a failure after the first event is a ``speech.audio.error`` event."""
    try:
        async for kind, value in _encoded(first, events, request, job, fmt, rate, stretch):
            if kind == "audio" and value:
                yield _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(value).decode(),
                                  "response_format": fmt})
            elif kind == "end":
                gen = value.generation
                usage = {"input_tokens": gen.prefill_positions, "output_tokens": value.frames,
                         "total_tokens": gen.prefill_positions + value.frames}
                yield _sse_event({"type": "speech.audio.done", "usage": usage, "stop_reason": _stop_reason(value)})
            elif kind == "error":
                yield _sse_event({"type": "speech.audio.error",
                                  "error": _as_request_error(value).body()["error"]})
    finally:
        job.cancel()


def _stop_reason(stats) -> str:
    """Why an utterance ended: its end code (``eos``), or its frame cap (``frame_limit``, see ``server.limits``)."""
    return "eos" if stats.generation.stopped_at_eos else "frame_limit"


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
