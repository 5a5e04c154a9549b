"""The server's saved voices: a folder of ``NAME.voice`` files (``serve --voices DIR``), and per-request references.

A saved voice is a voice file (``vllm_omni.tts.voice``) named by its file: ``voice`` in a speech
request names it, as it names a preset speaker on a CustomVoice checkpoint. At start every file
in the folder is read and checked against the checkpoint; one that fails (corrupt, made with
another checkpoint) is reported in the log, named, and not served. Voices added over HTTP are
written to a temporary name and renamed into place, so a failed upload leaves nothing behind;
deleting one removes its file.

A request can also clone for itself (vLLM-Omni's fields: ``ref_audio``, ``ref_text``,
``x_vector_only_mode``). ``ref_audio`` is a ``data:`` URI (or bare base64) of an audio file, or,
only where the operator allowed a folder (``--allowed-local-media-path``), a ``file://`` path in
it. A URL is never fetched: a server that downloads whatever address a request names can be made
to reach hosts its clients cannot (server-side request forgery).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from vllm_omni.tts.reference_audio import ReferenceAudio, ReferenceAudioError, read_reference
from vllm_omni.tts.voice import SUFFIX, Voice, VoiceError, check_voice, load_voice, save_voice

logger = logging.getLogger("vllm_omni.tts.server.voices")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_UPLOAD_BYTES = 10 * 2**20  # OpenAI's limit for a custom voice's sample


def check_name(name: Any, param: str = "name") -> str:
    """A voice name: 1 to 64 letters, digits, '_' or '-', starting with a letter or digit (never a path)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise VoiceError(f"{param}: {name!r} is not a voice name; use 1 to 64 letters, digits, '_' or '-', starting "
                         "with a letter or digit (no paths, dots or spaces)", param=param)
    return name


def decode_reference(value: str, allowed_folder: Path | None, max_bytes: int = MAX_UPLOAD_BYTES) -> ReferenceAudio:
    """The reference audio of a request's ``ref_audio`` (see the module doc); ReferenceAudioError naming the field."""
    value = value.strip()
    scheme = urlparse(value).scheme.lower() if ":" in value[:16] else ""
    if scheme in ("http", "https", "ftp", "s3", "gs"):
        raise ReferenceAudioError(f"ref_audio: {scheme} URLs are not fetched by this server (it would reach whatever "
                                  "address a request names); send the audio itself as a data: URI "
                                  "(data:audio/wav;base64,...)")
    if scheme == "file" or value.startswith("/"):
        return _local(value, allowed_folder, max_bytes)
    if scheme == "data":
        head, _, payload = value.partition(",")
        if ";base64" not in head:
            raise ReferenceAudioError("ref_audio: a data: URI must be base64 (data:audio/wav;base64,...)")
        value = payload
    if len(value) > max_bytes * 4 // 3 + 4:
        raise ReferenceAudioError(f"ref_audio: more than {max_bytes // 2**20} MiB of audio; send a shorter recording")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ReferenceAudioError("ref_audio: neither a data: URI nor base64 of an audio file") from None
    return read_reference(data, name="ref_audio")


def _local(value: str, allowed_folder: Path | None, max_bytes: int) -> ReferenceAudio:
    if allowed_folder is None:
        raise ReferenceAudioError("ref_audio: local paths are read only from a folder the operator allows "
                                  "(qwen3-tts-edge serve --allowed-local-media-path DIR); send a data: URI instead")
    path = Path(unquote(urlparse(value).path) if value.startswith("file:") else value).resolve()
    root = allowed_folder.resolve()
    if root not in path.parents:
        raise ReferenceAudioError(f"ref_audio: {path} is outside the allowed folder {root}")
    if path.is_file() and path.stat().st_size > max_bytes:
        raise ReferenceAudioError(f"ref_audio: {path.name} is more than {max_bytes // 2**20} MiB")
    return read_reference(path, name=f"ref_audio {path.name}")


class VoiceRegistry:
    """Saved voices of one Base checkpoint, in ``folder`` (see the module doc). Thread-safe."""

    def __init__(self, speech: Any, folder: Path | None):
        self.speech, self.folder = speech, folder
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] = {}
        self._created: dict[str, int] = {}
        self.skipped: dict[str, str] = {}  # file name -> why it is not served
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        fingerprint = speech.cloner.fingerprint
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            name = path.name[: -len(SUFFIX)]
            try:
                check_name(name)
                voice = load_voice(path)
                check_voice(voice, speech.ckpt, fingerprint, where=str(path))
            except VoiceError as exc:
                self.skipped[path.name] = str(exc)
                logger.warning("voice %s is not served: %s", path, exc)
                continue
            self._voices[name] = voice
            self._created[name] = int(path.stat().st_mtime)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._voices)

    def get(self, name: str) -> Voice | None:
        with self._lock:
            return self._voices.get(name)

    def describe(self, name: str) -> dict[str, Any]:
        with self._lock:
            voice = self._voices[name]
            return {"id": name, "object": "audio.voice", "name": name, "created_at": self._created[name],
                    "mode": voice.mode, "reference_seconds": voice.reference.get("seconds")}

    def add(self, name: str, voice: Voice, replace: bool = False) -> dict[str, Any]:
        """Save ``voice`` as ``name`` (its file written whole, then renamed); VoiceError when the name is taken."""
        if self.folder is None:
            raise VoiceError("voices cannot be saved: start the server with --voices DIR", param="name")
        with self._lock:
            if name in self._voices and not replace:
                raise VoiceError(f"name: a voice named {name!r} exists; delete it first", param="name")
            save_voice(voice, self.folder / f"{name}{SUFFIX}")
            self._voices[name] = voice
            self._created[name] = int(time.time())
        return self.describe(name)

    def delete(self, name: str) -> bool:
        with self._lock:
            if name not in self._voices:
                return False
            (self.folder / f"{name}{SUFFIX}").unlink(missing_ok=True)
            del self._voices[name]
            del self._created[name]
            return True
