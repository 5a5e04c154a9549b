"""How much a reader reads on a page: its prose words, without code, tables, markup or link targets.

A directive counts as one word, the figure it renders. The page-length test holds the study pages
to the length issue #43 set (``tests/test_page_length.py``)."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^(\s*)(```|~~~).*?^\1\2[^\n]*$", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_WORD = re.compile(r"[^\W_][\w'’.,%×-]*")


def prose_words(markdown: str) -> int:
    """The number of words of ``markdown`` a reader reads as text."""
    text = _COMMENT.sub(" N ", _FENCE.sub("", markdown))
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(("|", "<", "--8<--"))]
    return len(_WORD.findall(_LINK_TARGET.sub("]", "\n".join(lines))))
