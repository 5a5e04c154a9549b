"""The talker's prompt in a cloned voice, laid out as the official ``generate`` lays it for a Base checkpoint.

Both modes start like every prompt (``prompt.prompt_head``), with the voice's speaker embedding in
the codec prefix's speaker slot. Then:

- x-vector only: the text exactly as for a preset speaker (``prompt.text_prompt``);
- in context (ICL, ``generate_icl_prompt``): the reference text then the target text are one
  text side, ``proj(ref ids ++ text ids)`` and ``tts_eos``; the codec side is ``codec(bos)`` then,
  per reference frame, the sum of its 16 code embeddings (codebook 0 from the talker's table,
  1..15 from the code predictor's). Non-streaming text: every text position plus ``codec(pad)``,
  then every codec position plus ``tts_pad``, and each frame adds ``tts_pad``. Streaming text
  (the official default for cloning): the two sides added position by position; a longer text
  side trails into the frames one position each, a shorter one is padded with ``tts_pad``.

A Base checkpoint's speaker encoder makes the embedding of the talker's width, so the slot takes
it as it is. No language is implied by a voice: ``auto`` unless the request names one.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.tts.checkpoint import Checkpoint
from vllm_omni.tts.prompt import MAX_TEXT_TOKENS, Prompt, PromptError, check_text, prompt_head, resolve_language, text_prompt
from vllm_omni.tts.voice import Voice


def reference_frames(ckpt: Checkpoint, codes: Any) -> Any:
    """The talker input of each reference frame [frames, H]: the sum of its 16 code embeddings."""
    import torch

    first = ckpt.talker.codec_embedding[codes[:, 0]]
    rest = [ckpt.predictor.codec_embedding[g - 1][codes[:, g]] for g in range(1, codes.shape[1])]
    return torch.stack([first] + rest, dim=1).sum(1)


def build_voice_prompt(ckpt: Checkpoint, text: str, voice: Voice, *, language: str | None = "auto",
                       streaming_text: bool = True, max_text_tokens: int = MAX_TEXT_TOKENS) -> Prompt:
    """The prompt for ``text`` in ``voice`` (see the module doc); PromptError for bad input. ``voice`` must
    have been checked against ``ckpt`` (``voice.check_voice``)."""
    import torch

    cfg = ckpt.config
    if not cfg.clones:
        raise PromptError(f"{cfg.family} speaks in preset or described voices, not cloned ones; clone with a Base "
                          "checkpoint", param="voice")
    if not isinstance(text, str) or not text.strip():
        raise PromptError("text is empty: give the words to speak", param="text")
    lang = resolve_language(cfg, language, None)
    ids = check_text(ckpt, text, max_text_tokens)
    head = prompt_head(ckpt, ids, lang, voice.embedding)
    if not voice.icl:
        return text_prompt(ckpt, head, streaming_text)
    c = cfg.codec
    text_side = torch.cat([ckpt.text.project(list(voice.ref_ids) + head.body), head.tts_eos[None]])
    codec_side = torch.cat([head.codec_bos[None], reference_frames(ckpt, voice.codes)])
    if not streaming_text:
        icl = torch.cat([text_side + ckpt.talker.codec_embedding[c.pad], codec_side + head.tts_pad])
        trailing = head.tts_pad[None]
    elif text_side.shape[0] > codec_side.shape[0]:
        icl, trailing = text_side[:codec_side.shape[0]] + codec_side, text_side[codec_side.shape[0]:]
    else:
        pads = head.tts_pad.expand(codec_side.shape[0] - text_side.shape[0], -1)
        icl, trailing = torch.cat([text_side, pads]) + codec_side, head.tts_pad[None]
    prefill = torch.cat(head.parts + [icl])
    return Prompt(prefill.contiguous(), trailing.contiguous(), head.tts_pad.contiguous(), head.body, lang, None)
