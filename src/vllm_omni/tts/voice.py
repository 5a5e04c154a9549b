"""A cloned voice: what a Base checkpoint needs to speak in someone's voice, made once and kept as a file.

Cloning has two official modes (``qwen_tts`` 0.1.1 ``create_voice_clone_prompt``):

- ``x_vector`` (x-vector only): the speaker embedding of the reference (``speaker_encoder``);
- ``icl`` (in context): the embedding, the reference's codes from the 12 Hz encoder
  (``speech_encoder``) and the token ids of what was said in it, which the prompt puts before
  the text to speak (``voice_prompt``).

``Cloner`` makes a ``Voice`` from 24 kHz reference audio (``reference_audio``); ``save_voice``
writes it as a safetensors file -- tensors ``embedding`` [H] and, for ICL, ``codes`` [frames, 16]
and ``ref_ids`` -- with its mode, reference text, source and the checkpoint it was made with in
the file's JSON metadata (no pickle), to a temporary name renamed into place. ``load_voice``
reads one back and ``check_voice`` refuses one made with another checkpoint: the fingerprint is a
hash of the speaker encoder's last layer, the first encoder codebook and the talker's codec
embeddings, the tensors a voice's numbers depend on or are read against.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.tts.checkpoint import Checkpoint
from vllm_omni.tts.reference_audio import ReferenceAudio

MODES = ("icl", "x_vector")
FORMAT, VERSION = "qwen3-tts-edge voice", 1
SUFFIX = ".voice"
FINGERPRINT_TENSORS = (
    ("model", "speaker_encoder.fc.weight"),
    ("speech", "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum"),
    ("model", "talker.model.codec_embedding.weight"),
)


class VoiceError(ValueError):
    """A voice that cannot be made or used: the message names the file or field; ``param`` is the request
    field it came from."""

    def __init__(self, message: str, param: str = "voice"):
        super().__init__(message)
        self.param = param


@dataclass
class Voice:
    """A speaker embedding and, in ICL mode, the reference's codes and text ids (see the module doc)."""

    embedding: Any  # [H] fp32
    mode: str
    checkpoint: dict[str, Any]  # family, hidden size, fingerprint
    codes: Any = None  # [frames, 16] int64 (icl)
    ref_text: str | None = None
    ref_ids: list[int] | None = None
    reference: dict[str, Any] = field(default_factory=dict)  # source, seconds, rate, channels
    made: dict[str, Any] = field(default_factory=dict)  # date and the milliseconds each encoder took

    @property
    def icl(self) -> bool:
        return self.mode == "icl"


def fingerprint(ckpt: Checkpoint) -> str:
    """The hash ``check_voice`` compares (see the module doc); a VoiceError for a checkpoint that clones nothing."""
    import torch

    if not ckpt.config.clones:
        raise VoiceError(f"{ckpt.path}: {ckpt.config.family} does not speak in cloned voices; use a Base checkpoint")
    h = hashlib.sha256(ckpt.config.family.encode())
    for which, name in FINGERPRINT_TENSORS:
        file = ckpt.model_file if which == "model" else ckpt.speech_file
        t = file.handle.get_tensor(name)
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


class Cloner:
    """Makes voices with one Base checkpoint; the two encoders are read from it on first use."""

    def __init__(self, ckpt: Checkpoint):
        if not ckpt.config.clones:
            raise VoiceError(f"{ckpt.path}: {ckpt.config.family} has no speaker encoder; voices are cloned with a Base "
                             "checkpoint (Qwen3-TTS-12Hz-0.6B-Base or 1.7B-Base)")
        self.ckpt = ckpt
        self._speaker = self._speech = None
        self._fingerprint: str | None = None

    @property
    def speaker_encoder(self):
        if self._speaker is None:
            from vllm_omni.tts.speaker_encoder import SpeakerEncoder

            self._speaker = SpeakerEncoder(self.ckpt.speaker_encoder_weights(), self.ckpt.config.speaker_encoder)
        return self._speaker

    @property
    def speech_encoder(self):
        if self._speech is None:
            from vllm_omni.tts.speech_encoder import SpeechEncoder

            self._speech = SpeechEncoder(self.ckpt.speech_encoder_weights(), self.ckpt.config.speech_encoder)
        return self._speech

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.ckpt)
        return self._fingerprint

    def clone(self, audio: ReferenceAudio, ref_text: str | None = None, x_vector_only: bool = False) -> Voice:
        """A voice from ``audio``: ICL needs what was said in it (``ref_text``); x-vector only ignores it."""
        import torch

        from vllm_omni.tts.text import reference_text

        ref_ids = None
        if not x_vector_only:
            if ref_text is None or not str(ref_text).strip():
                raise VoiceError("ref_text is required to clone in context (ICL): give what is said in the reference "
                                 "audio, or clone from the speaker embedding alone (x-vector only)", param="ref_text")
            ref_text = str(ref_text)
            ref_ids = self.ckpt.tokenizer.encode(reference_text(ref_text))[3:-2]
            if not ref_ids:
                raise VoiceError("ref_text is empty after tokenisation", param="ref_text")
        samples = torch.from_numpy(audio.samples)
        t0 = time.perf_counter()
        embedding = self.speaker_encoder.embed(samples)
        t1 = time.perf_counter()
        codes = None if x_vector_only else self.speech_encoder.encode(samples)
        t2 = time.perf_counter()
        return Voice(embedding=embedding.float().contiguous(), mode="x_vector" if x_vector_only else "icl",
                     checkpoint={"family": self.ckpt.config.family, "hidden": int(embedding.shape[0]),
                                 "fingerprint": self.fingerprint},
                     codes=codes, ref_text=None if x_vector_only else ref_text, ref_ids=ref_ids,
                     reference={"source": Path(audio.source).name if audio.source else None,
                                "seconds": round(audio.seconds, 3), "rate": audio.source_rate,
                                "channels": audio.source_channels},
                     made={"date": _dt.date.today().isoformat(), "speaker_encoder_ms": round((t1 - t0) * 1e3, 1),
                           "speech_encoder_ms": round((t2 - t1) * 1e3, 1)})


def check_voice(voice: Voice, ckpt: Checkpoint, fingerprint_of_ckpt: str | None = None, where: str = "voice") -> None:
    """VoiceError unless ``voice`` was made with ``ckpt`` (same family and size, same weights)."""
    cfg = ckpt.config
    made = voice.checkpoint
    if not cfg.clones:
        raise VoiceError(f"{where}: {cfg.family} does not speak in cloned voices; use the Base checkpoint the voice "
                         f"was made with ({made.get('family')})")
    if made.get("hidden") != cfg.spec.talker.hidden or made.get("family") != cfg.family:
        raise VoiceError(f"{where}: made with {made.get('family')} (speaker embedding of {made.get('hidden')}), "
                         f"not with this {cfg.family} (talker width {cfg.spec.talker.hidden}): another model size; "
                         "clone the voice again with this checkpoint")
    if voice.icl and (voice.codes.shape[1] != cfg.spec.num_code_groups
                      or int(voice.codes.max()) >= cfg.spec.codebook_size):
        raise VoiceError(f"{where}: its reference codes are not {cfg.spec.num_code_groups} codebooks of "
                         f"{cfg.spec.codebook_size} entries")
    mine = fingerprint_of_ckpt or fingerprint(ckpt)
    if made.get("fingerprint") != mine:
        raise VoiceError(f"{where}: made with another {cfg.family} checkpoint (fingerprint {made.get('fingerprint')}, "
                         f"this one {mine}); clone the voice again with this checkpoint")


def save_voice(voice: Voice, path: str | Path) -> Path:
    """Write ``voice`` to ``path`` (a temporary file in the same folder, renamed into place)."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {"embedding": voice.embedding.float().contiguous()}
    if voice.icl:
        tensors["codes"] = voice.codes.to(torch.int64).contiguous()
        tensors["ref_ids"] = torch.tensor(voice.ref_ids, dtype=torch.int64)
    meta = {"format": FORMAT, "version": str(VERSION), "mode": voice.mode,
            "checkpoint": json.dumps(voice.checkpoint), "reference": json.dumps(voice.reference),
            "made": json.dumps(voice.made), "ref_text": json.dumps(voice.ref_text)}
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _json(meta: dict[str, str], key: str, where: str):
    try:
        return json.loads(meta[key])
    except (KeyError, json.JSONDecodeError):
        raise VoiceError(f"{where}: not a voice file (its metadata has no readable {key!r})") from None


def load_voice(path: str | Path, where: str | None = None) -> Voice:
    """Read a voice file; VoiceError naming it when it is missing, corrupt or not a voice."""
    from safetensors import safe_open

    path = Path(path)
    where = where or str(path)
    if not path.is_file():
        raise VoiceError(f"{where}: no such voice file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - the library's parse error, with the file named
        raise VoiceError(f"{where}: not a readable voice file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise VoiceError(f"{where}: not a voice file (format {meta.get('format')!r}, expected {FORMAT!r})")
    if meta.get("version") != str(VERSION):
        raise VoiceError(f"{where}: voice file version {meta.get('version')!r}; this build reads version {VERSION}")
    mode = meta.get("mode")
    if mode not in MODES:
        raise VoiceError(f"{where}: mode {mode!r}; expected one of {', '.join(MODES)}")
    checkpoint = _json(meta, "checkpoint", where)
    emb = tensors.get("embedding")
    if emb is None or emb.ndim != 1 or not isinstance(checkpoint, dict) or emb.shape[0] != checkpoint.get("hidden"):
        raise VoiceError(f"{where}: corrupt (its speaker embedding is missing or not of the size it records)")
    voice = Voice(embedding=emb.float(), mode=mode, checkpoint=checkpoint, reference=_json(meta, "reference", where),
                  made=_json(meta, "made", where), ref_text=_json(meta, "ref_text", where))
    if voice.icl:
        codes, ids = tensors.get("codes"), tensors.get("ref_ids")
        if codes is None or ids is None or codes.ndim != 2 or codes.shape[0] < 1 or ids.ndim != 1 or not len(ids):
            raise VoiceError(f"{where}: corrupt (an in-context voice needs its reference codes and text ids)")
        if int(codes.min()) < 0 or not isinstance(voice.ref_text, str):
            raise VoiceError(f"{where}: corrupt (codes out of range or no reference text)")
        voice.codes, voice.ref_ids = codes.long(), [int(i) for i in ids]
    return voice
