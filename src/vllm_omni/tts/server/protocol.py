"""The wire format: OpenAI's ``POST /v1/audio/speech`` request, its errors, and the audio bytes.

The request takes OpenAI's fields (``model``, ``input``, ``voice`` -- a name, or ``{"id": NAME}``
--, ``instructions``, ``response_format``, ``speed``, ``stream_format``), four of this server's
own: ``stream`` (send audio as it is decoded), ``language`` (the checkpoint's names, or auto),
``seed`` and ``max_new_tokens`` (vLLM-Omni's name: at most this many 80 ms frames), and
vLLM-Omni's for cloning with a Base checkpoint: ``task_type``, ``ref_audio``, ``ref_text`` and
``x_vector_only_mode``. Fields that popular clients add and OpenAI does not define
(``CLIENT_FIELDS``) are accepted and ignored; any other unknown field is refused.
Validation is strict and every refusal names its field, in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``, so an OpenAI client shows it as it shows
OpenAI's own. Audio is 24 kHz mono in the formats of ``vllm_omni.tts.encode``; without a
``response_format`` the server's default (OpenAI's: ``mp3``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_omni.tts.encode import check_format

MAX_INPUT_CHARS = 4096  # OpenAI's limit for this endpoint
MAX_NEW_TOKENS = 4096  # vLLM-Omni's bound on ``max_new_tokens``
# Fields that clients send beyond OpenAI's, accepted and ignored (the serving page lists them)
CLIENT_FIELDS = {"backend": "LibreChat sends the name of its TTS backend"}
# OpenAI's own model names, which several clients hard-code: accepted as the served model's aliases
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}


class VoiceId(BaseModel):
    """OpenAI's custom-voice form of ``voice``: ``{"id": NAME}``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str = Field(max_length=MAX_INPUT_CHARS)
    voice: str | VoiceId | None = None
    instructions: str | None = None
    response_format: str | None = None  # the server's default when absent
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool = False
    language: str = "auto"
    seed: int = Field(default=0, ge=0, lt=2**63)
    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    # vLLM-Omni's fields for Qwen3-TTS's Base checkpoints: clone from a reference in the request
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
    ref_audio: str | None = None
    ref_text: str | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    x_vector_only_mode: bool = False

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


class RequestError(Exception):
    """A refused request: HTTP ``status``, a message naming ``param``, OpenAI's error ``kind`` and ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def parse_request(data: Any) -> SpeechRequest:
    """A checked ``SpeechRequest`` from decoded JSON; RequestError (400, naming the field) otherwise."""
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object")
    data = {k: v for k, v in data.items() if k not in CLIENT_FIELDS}
    try:
        req = SpeechRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        what = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise RequestError(400, f"{field}: {what}" if field else what, param=field) from None
    if not req.input.strip():
        raise RequestError(400, "input: is empty; give the words to speak", param="input")
    if req.response_format is not None:
        try:
            check_format(req.response_format)
        except ValueError as exc:
            raise RequestError(400, f"response_format: {exc}", param="response_format") from None
    return req


def is_openai_model(name: str) -> bool:
    """OpenAI's TTS model names, dated variants included (``tts-1-1106``, ``gpt-4o-mini-tts-2025-03-20``)."""
    return any(name == m or (name.startswith(m + "-") and name[len(m) + 1:][:1].isdigit()) for m in OPENAI_MODELS)
