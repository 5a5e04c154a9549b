"""The page directives that pull figures out of artifacts.

Two forms, both HTML comments so that an unprocessed page shows nothing rather than a
wrong number (and the build checks that none survive):

* ``<!-- table: <id> [columns="a,b"] -->`` on a line of its own: the whole table plus a
  caption linking to the artifact's page.
* ``<!-- value: <id> row="<first-column value or index>" col="<column>" [fmt=".1f"] [unit=no] -->``
  anywhere in prose: one figure, linked to the artifact's page.

Any other ``<!-- name: ... -->`` comment whose name is not a known directive (ours or
Sybil's) is a typo and raises, like Material's own shortcodes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Iterator

DIRECTIVE_RE = re.compile(r"<!--\s*([a-z][a-z-]*):\s*(.*?)\s*-->")
OURS = ("table", "value")
# Sybil's comment directives, and other comment forms the pages may use on purpose.
FOREIGN = ("skip", "clear-namespace", "invisible-code-block", "sybil", "codeblock")
TABLE_OPTIONS = ("columns",)
VALUE_OPTIONS = ("row", "col", "fmt", "unit")
_FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})")
_CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")


def _in_code_span(line: str, pos: int) -> bool:
    return any(m.start() <= pos < m.end() for m in _CODE_SPAN_RE.finditer(line))


class DirectiveError(ValueError):
    pass


@dataclass
class Directive:
    name: str
    artifact_id: str
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""


def parse(name: str, body: str, where: str) -> Directive:
    """Parse the body of one directive; unknown names and options raise with ``where``."""
    if name not in OURS:
        raise DirectiveError(f"{where}: unknown directive '<!-- {name}: -->'; known: {', '.join(OURS + FOREIGN)}")
    try:
        tokens = shlex.split(body)
    except ValueError as exc:
        raise DirectiveError(f"{where}: cannot parse '<!-- {name}: {body} -->': {exc}") from None
    if not tokens:
        raise DirectiveError(f"{where}: '<!-- {name}: -->' needs an artifact id")
    artifact_id, rest = tokens[0], tokens[1:]
    allowed = TABLE_OPTIONS if name == "table" else VALUE_OPTIONS
    options: dict[str, str] = {}
    for tok in rest:
        key, eq, value = tok.partition("=")
        if not eq or key not in allowed:
            raise DirectiveError(
                f"{where}: option {tok!r} of '<!-- {name}: -->' is not one of {', '.join(a + '=' for a in allowed)}"
            )
        options[key] = value
    if name == "value":
        for key in ("row", "col"):
            if key not in options:
                raise DirectiveError(f"{where}: '<!-- value: {artifact_id} -->' needs {key}=")
    return Directive(name, artifact_id, options)


def outside_code(lines: list[str]) -> Iterator[tuple[int, str]]:
    """(index, line) for lines that are not inside a fenced code block."""
    fence: str | None = None
    for i, line in enumerate(lines):
        m = _FENCE_RE.match(line)
        if m:
            marker = m.group(1)
            if fence is None:
                fence = marker
                continue
            if marker[0] == fence[0] and len(marker) >= len(fence) and line.strip() == marker:
                fence = None
                continue
        if fence is None:
            yield i, line


def find(markdown: str, where: str) -> list[Directive]:
    """All our directives on a page (outside code blocks), parsed; typos raise."""
    found: list[Directive] = []
    lines = markdown.split("\n")
    for i, line in outside_code(lines):
        for m in DIRECTIVE_RE.finditer(line):
            if m.group(1) in FOREIGN or _in_code_span(line, m.start()):
                continue
            d = parse(m.group(1), m.group(2), f"{where}:{i + 1}")
            d.text = m.group(0)
            found.append(d)
    return found


def substitute(markdown: str, where: str, render: Callable[[Directive, bool, str], str]) -> str:
    """Replace every directive outside code by ``render(directive, own_line, location)``.

    A table directive must stand on its own line.
    """
    lines = markdown.split("\n")
    for i, line in outside_code(lines):
        if not DIRECTIVE_RE.search(line):
            continue
        location = f"{where}:{i + 1}"

        def repl(m: re.Match) -> str:
            if m.group(1) in FOREIGN or _in_code_span(line, m.start()):
                return m.group(0)
            d = parse(m.group(1), m.group(2), location)
            own_line = line.strip() == m.group(0)
            if d.name == "table" and not own_line:
                raise DirectiveError(f"{location}: '<!-- table: -->' must be on a line of its own")
            return render(d, own_line, location)

        lines[i] = DIRECTIVE_RE.sub(repl, line)
    return "\n".join(lines)
