"""Lists that Python-Markdown would render wrongly, caught before they reach the site.

MkDocs renders with Python-Markdown, which nests lists by four spaces, not by the width of
the parent's marker as CommonMark does. Two mistakes therefore pass unnoticed in an editor's
preview and only show on the site:

* a nested list indented by one to three spaces comes out flat, as items of its parent list;
* a list item's second paragraph indented by fewer than four spaces ends the list, and the
  items after it are run into that paragraph as plain text ("... (0.71). - **int8 ...").

``shallow_nested_items`` finds the first in a page's Markdown source, ``swallowed_items``
the second in its rendered HTML. The MkDocs hook fails the build on either.
"""

from __future__ import annotations

import re

_MARKER = re.compile(r"^( {1,3})(?:[-*+]|\d+\.) \S")
_FENCE = re.compile(r"^ *(```|~~~)")
_PARAGRAPH = re.compile(r"<p>(.*?)</p>", re.S)
_RUN_IN = re.compile(r"\n[ \t]*(?:[-*+]|\d+\.) +(\S[^\n]{0,50})")
_TAG = re.compile(r"<[^>]+>")


def shallow_nested_items(markdown: str) -> list[int]:
    """1-based numbers of the lines outside fenced code that start a list item indented by
    one to three spaces."""
    found, fence = [], None
    for n, line in enumerate(markdown.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None and _MARKER.match(line):
            found.append(n)
    return found


def swallowed_items(html: str) -> list[str]:
    """The opening words of each list item that a rendered paragraph holds as plain text."""
    return [_TAG.sub("", m.group(1)).strip() for p in _PARAGRAPH.findall(html) for m in _RUN_IN.finditer(p)]
