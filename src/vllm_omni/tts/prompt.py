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


def build_prompt(ckpt: Checkpoint, text: str, *, speaker: str | None = None, language: str | None = "auto",
                 instruct: str | None = None, streaming_text: bool = True,
                 max_text_tokens: int = MAX_TEXT_TOKENS) -> Prompt:
    """The prompt for ``text`` (see the module doc); PromptError for bad input, before any model work."""
    import torch

    cfg = ckpt.config
    if not isinstance(text, str) or not text.strip():
        raise PromptError("text is empty: give the words to speak", param="text")
    spk = resolve_speaker(cfg, speaker)
    lang = resolve_language(cfg, language, spk)
    if cfg.model_type == "voice_design" and not (instruct and instruct.strip()):
        raise PromptError(f"instruct is required for {cfg.family}: describe the voice to design", param="instruct")
    ids = ckpt.tokenizer.encode(assistant_text(text))
    body = ids[3:-5]
    if not body:
        raise PromptError("text is empty after tokenisation", param="text")
    if len(body) > max_text_tokens:
        raise PromptError(f"text is {len(body)} tokens long; the maximum is {max_text_tokens}", param="text")
    c, t = cfg.codec, cfg.text
    emb = ckpt.talker.codec_embedding

    def codec(*codes: int):
        return emb[list(codes)]

    specials = ckpt.text.project([t.tts_bos, t.tts_eos, t.tts_pad])
    tts_bos, tts_eos, tts_pad = specials[0], specials[1], specials[2]
    prefix = [c.nothink, c.think_bos, c.think_eos] if lang is None else [c.think, c.think_bos, lang, c.think_eos]
    spk_id = None if spk is None else cfg.speakers[spk]
    if spk_id is not None:
        prefix.append(spk_id)
    prefix += [c.pad, c.bos]
    codec_prefix = codec(*prefix)
    n = len(prefix)
    text_side = torch.cat([tts_pad.expand(n - 2, -1), tts_bos[None]])
    parts = []
    if instruct and instruct.strip() and cfg.takes_instruct:
        parts.append(ckpt.text.project(ckpt.tokenizer.encode(instruct_text(instruct))))
    parts += [ckpt.text.project(ids[:3]), text_side + codec_prefix[:-1]]
    if streaming_text:
        parts.append(ckpt.text.project(body[:1]) + codec_prefix[-1:])
        trailing = torch.cat([ckpt.text.project(body[1:]), tts_eos[None]])
    else:
        words = torch.cat([ckpt.text.project(body), tts_eos[None]])
        parts += [words + codec(c.pad)[0], (tts_pad + codec(c.bos)[0])[None]]
        trailing = tts_pad[None]
    return Prompt(torch.cat(parts).contiguous(), trailing.contiguous(), tts_pad.contiguous(), body, lang, spk_id)
