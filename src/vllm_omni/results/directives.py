"""The page directives that pull figures out of artifacts.

Three forms, all HTML comments so that an unprocessed page shows nothing rather than a
wrong number (and the build checks that none survive):

* ``<!-- table: <id> [columns="a,b"] [digits=4] -->`` on a line of its own: the whole table plus a
  caption linking to the artifact's page.
* ``<!-- chart: <id> [kind=bar|hbar|line] x="<col>" y="<col>,<col>" [series="<col>"]
  [rows="<key>,#N"] [title=".."] [ylabel=".."] [logy=yes] [ref=80] [ymax=100] [digits=4] -->`` on a
  line of its own: the same figures drawn as an inline SVG (``vllm_omni.results.charts``),
  with the same caption.
* ``<!-- value: <id> row="<first-column value or #index>" col="<column>" [fmt=".1f" | digits=4] [unit=no] -->``
  anywhere in prose: one figure, linked to the artifact's page; ``run="<key>.<key>"`` instead
  of ``row``/``col`` quotes a number the run recorded in its provenance (``provenance.run``),
  without a unit.

Numbers are rounded as ``vllm_omni.results.render.format_cell`` says: integers never, floats
to three significant figures unless the column states ``format`` or ``digits``; ``digits=N``
in a directive (N significant figures) and ``fmt=`` in a value (a Python format spec) win
over both.

Any other ``<!-- name: ... -->`` comment whose name is not a known directive (ours or
Sybil's) is a typo and raises, like Material's own shortcodes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .schema import MAX_DIGITS

DIRECTIVE_RE = re.compile(r"<!--\s*([a-z][a-z-]*):\s*(.*?)\s*-->")
OURS = ("table", "value", "chart")
OWN_LINE = ("table", "chart")  # block directives: alone on their line
# Sybil's comment directives, and other comment forms the pages may use on purpose.
FOREIGN = ("skip", "clear-namespace", "invisible-code-block", "sybil", "codeblock")
TABLE_OPTIONS = ("columns", "digits")
VALUE_OPTIONS = ("row", "col", "run", "fmt", "digits", "unit")
CHART_OPTIONS = ("kind", "x", "y", "series", "rows", "title", "ylabel", "logy", "ref", "ymax", "digits")
CHART_KINDS = ("bar", "hbar", "line")
_OPTIONS = {"table": TABLE_OPTIONS, "value": VALUE_OPTIONS, "chart": CHART_OPTIONS}
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
    where: str = ""  # page:line, set by find()


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
    allowed = _OPTIONS[name]
    options: dict[str, str] = {}
    for tok in rest:
        key, eq, value = tok.partition("=")
        if not eq or key not in allowed:
            raise DirectiveError(
                f"{where}: option {tok!r} of '<!-- {name}: {body} -->' is not one of "
                f"{', '.join(a + '=' for a in allowed)}"
            )
        options[key] = value
    if name == "value" and "run" in options:
        if "row" in options or "col" in options:
            raise DirectiveError(f"{where}: '<!-- value: {artifact_id} -->' takes run= or row= and col=, not both")
    elif name == "value":
        for key in ("row", "col"):
            if key not in options:
                raise DirectiveError(f"{where}: '<!-- value: {artifact_id} -->' needs {key}= (or run=)")
    if "digits" in options:
        digits = options["digits"]
        if not (re.fullmatch(r"[0-9]{1,2}", digits) and 1 <= int(digits) <= MAX_DIGITS):
            raise DirectiveError(f"{where}: digits={digits!r} of '<!-- {name}: {body} -->' is not a whole number "
                                 f"of significant figures from 1 to {MAX_DIGITS}")
        if "fmt" in options:
            raise DirectiveError(f"{where}: '<!-- {name}: {body} -->' takes fmt= or digits=, not both")
    if "fmt" in options and not _is_number_spec(options["fmt"]):
        raise DirectiveError(f"{where}: fmt={options['fmt']!r} of '<!-- {name}: {body} -->' is not a "
                             "Python format spec for numbers")
    if name == "chart":
        _check_chart(options, f"{where}: '<!-- {name}: {body} -->'")
    return Directive(name, artifact_id, options)


def _is_number_spec(spec: str) -> bool:
    """Whether ``spec`` formats an integer or a float (``"d"`` takes integers only)."""
    for sample in (1, 1.5):
        try:
            format(sample, spec)
            return True
        except ValueError:
            pass
    return False


def split_list(value: str) -> list[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]``: the comma lists of ``columns=``, ``y=`` and ``rows=``."""
    return [item.strip() for item in value.split(",") if item.strip()]


def _check_chart(options: dict[str, str], where: str) -> None:
    """What a chart directive can be checked for without its artifact."""
    for key in ("x", "y"):
        if not options.get(key, "").strip():
            raise DirectiveError(f"{where}: a chart needs {key}=\"<column>\"")
    kind = options.setdefault("kind", "bar")
    if kind not in CHART_KINDS:
        raise DirectiveError(f"{where}: kind={kind!r} is not one of {', '.join(CHART_KINDS)}")
    if options.get("logy", "no") not in ("yes", "no"):
        raise DirectiveError(f"{where}: logy={options['logy']!r} must be yes or no")
    for key in ("ref", "ymax"):
        if key in options:
            try:
                float(options[key])
            except ValueError:
                raise DirectiveError(f"{where}: {key}={options[key]!r} is not a number") from None
    if "series" in options and len(split_list(options["y"])) != 1:
        raise DirectiveError(f"{where}: series= groups the rows of one y= column; y= names "
                             f"{len(split_list(options['y']))}")


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
            d.text, d.where = m.group(0), f"{where}:{i + 1}"
            found.append(d)
    return found


def substitute(markdown: str, where: str, render: Callable[[Directive, bool, str], str]) -> str:
    """Replace every directive outside code by ``render(directive, own_line, location)``.

    A table or chart directive must stand on its own line.
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
            d.text = m.group(0)
            own_line = line.strip() == m.group(0)
            if d.name in OWN_LINE and not own_line:
                raise DirectiveError(f"{location}: '<!-- {d.name}: -->' must be on a line of its own")
            return render(d, own_line, location)

        lines[i] = DIRECTIVE_RE.sub(repl, line)
    return "\n".join(lines)
