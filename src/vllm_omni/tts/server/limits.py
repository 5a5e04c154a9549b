"""How long a request may speak: a cap on its frames in proportion to its text.

Why: a model that never emits its end code (random weights always; real checkpoints now and
then, a known failure in the peers) would otherwise speak to the checkpoint's limit, 2,048
frames (164 s), holding a stream's place for minutes and ending in a timeout. The cap lets any
real reading through and stops a runaway early, and the response says it was cut.

The rule (``frame_cap``): 1 s, plus 1 s per CJK character (Han, kana, Hangul: each a syllable),
plus 0.25 s per other character that is not a space, at 12.5 frames a second. Against the
spoken references in ``tests/fixtures/speech`` (espeak-ng's English at 14 characters a second,
spaces not counted, its Mandarin at 2.7 characters a second, pauses included) this allows 3.5
and 2.7 times their durations. A request may ask for another cap (``max_new_tokens``), up to the server's
``--max-frames`` (else the checkpoint's limit).
"""

from __future__ import annotations

import math

FRAMES_PER_S = 12.5
BASE_S, CJK_S, OTHER_S = 1.0, 1.0, 0.25


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF or 0xAC00 <= cp <= 0xD7AF
            or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FA1F)


def frame_cap(text: str) -> int:
    """The frames ``text`` may take by default (see the module doc)."""
    cjk = sum(1 for ch in text if _is_cjk(ch))
    other = sum(1 for ch in text if not ch.isspace()) - cjk
    return math.ceil(FRAMES_PER_S * (BASE_S + CJK_S * cjk + OTHER_S * other))


def request_frames(text: str, asked: int | None, server_limit: int) -> tuple[int, str]:
    """(frames this request may take, where the figure comes from: "text", "request" or "server"); ``asked``
    (``max_new_tokens``) is already checked against ``server_limit``."""
    if asked is not None:
        return asked, "request"
    cap = frame_cap(text)
    return (cap, "text") if cap <= server_limit else (server_limit, "server")
