"""The talker's prompt, built as the official ``generate`` builds it.

Positions of the prefill, for a text tokenised (with its chat template) as ``ids``:

1. optional instruction: ``proj(instruct ids)``;
2. the role, ``proj(ids[:3])`` (``<|im_start|>assistant\\n``);
3. the codec prefix, each position ``tts_pad`` (``tts_bos`` for the last one) plus the codec
   embedding of ``nothink, think_bos, think_eos`` (no language) or ``think, think_bos, language,
   think_eos``, then the speaker's codec id if one is given, then ``pad``;
4. streaming text (the default): ``proj(ids[3]) + codec(bos)``, and the rest of the text,
   ``proj(ids[4:-5])`` then ``tts_eos``, is added to the talker input one token per frame;
   non-streaming: the whole text ``proj(ids[3:-5])`` and ``tts_eos``, each plus ``codec(pad)``,
   then ``tts_pad + codec(bos)``; every frame then adds ``tts_pad``.

``proj`` is the text projection of the text embedding. After the per-frame text runs out each
frame adds ``tts_pad``. A Chinese or "auto" language with a dialect speaker (Eric, Dylan) takes
the dialect's language id, as the official code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_omni.tts.checkpoint import Checkpoint
from vllm_omni.tts.config import CheckpointConfig
from vllm_omni.tts.text import assistant_text, instruct_text

MAX_TEXT_TOKENS = 4096


class PromptError(ValueError):
    """A request the checkpoint cannot speak: the message names the parameter and the valid values;
    ``param`` is that parameter's name here (text, speaker, language or instruct)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Prompt:
    """The prefill embeddings [T, H], the per-frame text terms [n, H] and the pad term [H] (fp32)."""

    prefill: Any
    trailing: Any
    pad: Any
    text_ids: list[int]
    language_id: int | None
    speaker_id: int | None

    def text_term(self, frame: int):
        """What frame ``frame``'s talker input adds to its summed code embeddings."""
        return self.trailing[frame] if frame < self.trailing.shape[0] else self.pad


def resolve_speaker(cfg: CheckpointConfig, speaker: str | None) -> str | None:
    """The speaker's key in the config (lower case), None for none; PromptError listing the valid ones."""
    if speaker is None or speaker == "":
        if cfg.model_type == "custom_voice":
            raise PromptError(f"speaker is required for {cfg.family}; valid: {', '.join(sorted(cfg.speakers))}",
                              param="speaker")
        return None
    if cfg.model_type != "custom_voice":
        raise PromptError(f"speaker {speaker!r}: {cfg.family} has no named speakers (describe the voice with instruct)",
                          param="speaker")
    key = str(speaker).lower()
    if key not in cfg.speakers:
        raise PromptError(f"unknown speaker {speaker!r}; valid: {', '.join(sorted(cfg.speakers))}", param="speaker")
    return key


def resolve_language(cfg: CheckpointConfig, language: str | None, speaker: str | None) -> int | None:
    """The codec language id (None for auto), a dialect speaker's own for Chinese or auto."""
    key = "auto" if language is None else str(language).lower()
    if key not in cfg.supported_languages:
        raise PromptError(f"unknown language {language!r}; valid: {', '.join(cfg.supported_languages)}",
                          param="language")
    lang = None if key == "auto" else cfg.languages[key]
    if key in ("chinese", "auto") and speaker is not None and cfg.dialects.get(speaker, False) is not False:
        lang = cfg.languages[cfg.dialects[speaker]]
    return lang


@dataclass
class PromptHead:
    """What every prompt starts with, up to the codec prefix's last position (``bos``), which the tail
    places: the text's token ids, the role and codec-prefix positions, and the projected specials."""

    ids: list[int]  # the whole chat-templated text
    body: list[int]  # its words, ids[3:-5]
    parts: list[Any]  # [instruction], role, codec prefix but its last position
    codec_bos: Any  # [H] the codec prefix's last position's codec embedding
    tts_bos: Any
    tts_eos: Any
    tts_pad: Any
    language_id: int | None


def check_text(ckpt: Checkpoint, text: str, max_text_tokens: int = MAX_TEXT_TOKENS) -> list[int]:
    """The chat-templated ids of ``text``; PromptError when it is empty or too long."""
    if not isinstance(text, str) or not text.strip():
        raise PromptError("text is empty: give the words to speak", param="text")
    ids = ckpt.tokenizer.encode(assistant_text(text))
    body = ids[3:-5]
    if not body:
        raise PromptError("text is empty after tokenisation", param="text")
    if len(body) > max_text_tokens:
        raise PromptError(f"text is {len(body)} tokens long; the maximum is {max_text_tokens}", param="text")
    return ids


def prompt_head(ckpt: Checkpoint, ids: list[int], lang: int | None, speaker_row: Any = None,
                instruct: str | None = None) -> PromptHead:
    """The head for chat-templated ``ids``: codec prefix ``nothink, think_bos, think_eos`` (or ``think,
    think_bos, lang, think_eos``), then ``speaker_row`` (a speaker's codec embedding, or a cloned voice's
    speaker embedding) when given, then ``pad, bos``; each plus ``tts_pad`` (``tts_bos`` at ``pad``)."""
    import torch

    cfg = ckpt.config
    c, t = cfg.codec, cfg.text
    emb = ckpt.talker.codec_embedding
    specials = ckpt.text.project([t.tts_bos, t.tts_eos, t.tts_pad])
    tts_bos, tts_eos, tts_pad = specials[0], specials[1], specials[2]
    tags = [c.nothink, c.think_bos, c.think_eos] if lang is None else [c.think, c.think_bos, lang, c.think_eos]
    rows = [emb[tags]] + ([] if speaker_row is None else [speaker_row.reshape(1, -1).float()]) + [emb[[c.pad, c.bos]]]
    codec_prefix = torch.cat(rows)
    n = codec_prefix.shape[0]
    text_side = torch.cat([tts_pad.expand(n - 2, -1), tts_bos[None]])
    parts = []
    if instruct and instruct.strip() and cfg.takes_instruct:
        parts.append(ckpt.text.project(ckpt.tokenizer.encode(instruct_text(instruct))))
    parts += [ckpt.text.project(ids[:3]), text_side + codec_prefix[:-1]]
    return PromptHead(ids, ids[3:-5], parts, codec_prefix[-1], tts_bos, tts_eos, tts_pad, lang)


def text_prompt(ckpt: Checkpoint, head: PromptHead, streaming_text: bool, speaker_id: int | None = None) -> Prompt:
    """The prompt that speaks ``head``'s text after its codec prefix (a preset speaker's, a described voice's or
    an x-vector voice's): streaming, its first token with ``codec(bos)`` and the rest one a frame; else all of it
    with ``codec(pad)``, then ``tts_pad + codec(bos)``."""
    import torch

    c = ckpt.config.codec
    body, parts = head.body, list(head.parts)
    if streaming_text:
        parts.append(ckpt.text.project(body[:1]) + head.codec_bos)
        trailing = torch.cat([ckpt.text.project(body[1:]), head.tts_eos[None]])
    else:
        words = torch.cat([ckpt.text.project(body), head.tts_eos[None]])
        parts += [words + ckpt.talker.codec_embedding[c.pad], (head.tts_pad + head.codec_bos)[None]]
        trailing = head.tts_pad[None]
    return Prompt(torch.cat(parts).contiguous(), trailing.contiguous(), head.tts_pad.contiguous(), body,
                  head.language_id, speaker_id)


def build_prompt(ckpt: Checkpoint, text: str, *, speaker: str | None = None, language: str | None = "auto",
                 instruct: str | None = None, streaming_text: bool = True,
                 max_text_tokens: int = MAX_TEXT_TOKENS) -> Prompt:
    """The prompt for ``text`` in a preset or described voice (see the module doc); PromptError for bad input,
    before any model work. A Base checkpoint speaks in a cloned voice (``vllm_omni.tts.voice_prompt``)."""
    cfg = ckpt.config
    if cfg.clones:
        raise PromptError(f"{cfg.family} speaks in a voice cloned from reference audio: give a voice (a .voice file "
                          "from `qwen3-tts-edge clone`) or the reference audio", param="voice")
    if not isinstance(text, str) or not text.strip():
        raise PromptError("text is empty: give the words to speak", param="text")
    spk = resolve_speaker(cfg, speaker)
    lang = resolve_language(cfg, language, spk)
    if cfg.model_type == "voice_design" and not (instruct and instruct.strip()):
        raise PromptError(f"instruct is required for {cfg.family}: describe the voice to design", param="instruct")
    ids = check_text(ckpt, text, max_text_tokens)
    spk_id = None if spk is None else cfg.speakers[spk]
    row = None if spk_id is None else ckpt.talker.codec_embedding[spk_id]
    return text_prompt(ckpt, prompt_head(ckpt, ids, lang, row, instruct), streaming_text, spk_id)
