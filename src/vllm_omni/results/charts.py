"""Charts of artifacts, drawn at build time as inline SVG.

Why: a reader would rather look at a sweep or a split than read it, and a chart drawn from
the artifact when the site is built cannot drift from the table beside it. matplotlib is
imported only when a chart is drawn; the SVG keeps text as text, carries no date or
generator stamp and derives its element ids from the directive, so the same artifact and
directive always give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Mapping

from .directives import CHART_KINDS, Directive, DirectiveError, split_list
from .render import caption, format_cell
from .schema import Artifact, Column

FIGSIZE = (5.0, 2.8)  # inches: readable at full width and in half of a grid; the SVG scales down
LABEL_WIDTH = 28  # characters per line of a category label before it wraps
LABELLED_POINTS = 12  # a line with more numeric x values than this is drawn without value labels
PALETTE = ("#3f6fb5", "#e08a2c", "#4a9a5b", "#b54a4a", "#7a5fb0", "#8c6d3f")
RC = {
    "svg.fonttype": "none",  # text stays text: searchable, selectable, sized by the page
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial", "sans-serif"],
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    "legend.fontsize": 9,
}


class ChartError(ValueError):
    """A chart that cannot be drawn from its artifact (unknown column or row, nothing to plot)."""


@dataclass(frozen=True)
class ChartSpec:
    """What one chart directive asks for, checked against nothing yet."""

    kind: str
    x: str
    y: tuple[str, ...]
    series: str | None = None
    rows: tuple[str, ...] | None = None
    title: str | None = None
    ylabel: str | None = None
    logy: bool = False
    ref: float | None = None
    ymax: float | None = None
    digits: int | None = None  # significant figures of the value labels (default: the columns')

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ChartSpec":
        kind = options.get("kind", "bar")
        if kind not in CHART_KINDS:
            raise ChartError(f"kind={kind!r} is not one of {', '.join(CHART_KINDS)}")
        digits = options.get("digits")
        if digits is not None and not (digits.isascii() and digits.isdigit() and 1 <= int(digits) <= 15):
            raise ChartError(f"digits={digits!r} is not a whole number of significant figures from 1 to 15")
        return cls(
            kind=kind,
            x=options["x"].strip(),
            y=tuple(split_list(options["y"])),
            series=options["series"].strip() if options.get("series") else None,
            rows=tuple(split_list(options["rows"])) if options.get("rows") else None,
            title=options.get("title") or None,
            ylabel=options.get("ylabel") or None,
            logy=options.get("logy", "no") == "yes",
            ref=float(options["ref"]) if "ref" in options else None,
            ymax=float(options["ymax"]) if "ymax" in options else None,
            digits=int(digits) if digits is not None else None,
        )


@dataclass
class Series:
    label: str
    column: Column
    values: list[float | None]  # one per category (None: no point, no bar)


@dataclass
class ChartData:
    """The numbers a chart shows, pulled out of the artifact and nothing else."""

    categories: list[Any]  # x values, in row order
    x_column: Column
    series: list[Series]

    def labels(self) -> list[str]:
        return [format_cell(v, self.x_column) for v in self.categories]


# --- from artifact to numbers -------------------------------------------------------------------

def _column(art: Artifact, name: str) -> Column:
    try:
        return art.columns[art.column_index(name)]
    except KeyError as exc:
        raise ChartError(exc.args[0]) from None


def _select_rows(art: Artifact, keys: tuple[str, ...] | None) -> list[list[Any]]:
    if keys is None:
        return list(art.rows)
    out = []
    for key in keys:
        index: str | int = int(key[1:]) if key.startswith("#") and key[1:].isdigit() else key
        try:
            out.append(art.row(index))
        except KeyError as exc:
            raise ChartError(exc.args[0]) from None
    return out


def chart_data(art: Artifact, spec: ChartSpec) -> ChartData:
    """Categories and series of ``spec`` from ``art``; unknown names raise :class:`ChartError`."""
    x_col = _column(art, spec.x)
    y_cols = [_column(art, name) for name in spec.y]
    for col in y_cols:
        if col.type != "number":
            raise ChartError(f"{art.path}: column {col.name!r} is {col.type}, and y= needs numeric columns")
    if spec.kind == "line" and x_col.type == "bool":
        raise ChartError(f"{art.path}: column {x_col.name!r} is bool; a line needs numbers or labels on x")
    rows = _select_rows(art, spec.rows)
    xi, yis = art.column_index(x_col.name), [art.column_index(c.name) for c in y_cols]

    if spec.series is None:
        categories = [row[xi] for row in rows]
        series = [Series(col.name, col, [row[i] for row in rows]) for col, i in zip(y_cols, yis)]
    else:
        s_col = _column(art, spec.series)
        si, yi = art.column_index(s_col.name), yis[0]
        categories, groups = [], {}
        for row in rows:
            if row[xi] not in categories:
                categories.append(row[xi])
            groups.setdefault(format_cell(row[si], s_col), {})[row[xi]] = row[yi]
        series = [Series(label, y_cols[0], [by_x.get(x) for x in categories]) for label, by_x in groups.items()]
    if any(x is None for x in categories):
        raise ChartError(f"{art.path}: column {x_col.name!r} has a null in the selected rows; x needs a value per row")
    if all(v is None for s in series for v in s.values):
        raise ChartError(f"{art.path}: the selected rows hold no values in {', '.join(spec.y)}")
    if spec.logy and any(v is not None and v <= 0 for s in series for v in s.values):
        raise ChartError(f"{art.path}: logy=yes needs positive values in {', '.join(spec.y)}")
    return ChartData(categories, x_col, series)


def _value_label(spec: ChartSpec, data: ChartData) -> str | None:
    """The value axis: ``ylabel=``, else the one column with its unit, else the shared unit."""
    if spec.ylabel:
        return spec.ylabel
    if len(data.series) == 1 and spec.series is None:
        col = data.series[0].column  # "median (ms)", but "frame ms" rather than "frame ms (ms)"
        return col.name if col.unit is None or col.unit in col.name.split() else col.label
    units = {s.column.unit for s in data.series}
    return units.pop() if len(units) == 1 else None


# --- from numbers to SVG ------------------------------------------------------------------------

def salt(art: Artifact, text: str) -> str:
    """A stable id prefix per (artifact, directive): two charts on one page never share ids."""
    return hashlib.sha256(f"{art.id}\0{text}".encode()).hexdigest()[:10]


def _draw(spec: ChartSpec, data: ChartData, prefix: str, title: str) -> str:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    gid = f"vo{prefix}"
    with matplotlib.rc_context({**RC, "svg.hashsalt": prefix}):
        fig = Figure(figsize=FIGSIZE)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        labels = ["\n".join(textwrap.wrap(lab, LABEL_WIDTH)) or lab for lab in data.labels()]
        (_draw_lines if spec.kind == "line" else _draw_bars)(ax, spec, data, labels, gid)
        _value_limits(ax, spec, data)
        if spec.ref is not None:
            _draw_ref(ax, spec, data, gid)
        label = _value_label(spec, data)
        if label:
            (ax.xaxis if spec.kind == "hbar" else ax.yaxis).set_label_text(label)
        if len(data.series) > 1:
            ax.legend()
        if spec.title:
            ax.set_title(spec.title, fontsize=9)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    return _clean_svg(buf.getvalue(), title, gid)


def _draw_bars(ax: Any, spec: ChartSpec, data: ChartData, labels: list[str], gid: str) -> None:
    """Grouped bars, one group per category, labelled with their values; ids ``<gid>-bar-<series>-<n>``."""
    n, width = len(data.categories), 0.8 / len(data.series)
    draw = ax.bar if spec.kind == "bar" else ax.barh
    for si, s in enumerate(data.series):
        kept = [(i - 0.4 + width * (si + 0.5), v) for i, v in enumerate(s.values) if v is not None]
        bars = draw([p for p, _ in kept], [v for _, v in kept], width * 0.92, label=s.label,
                    color=PALETTE[si % len(PALETTE)])
        for bi, patch in enumerate(bars.patches):
            patch.set_gid(f"{gid}-bar-{si}-{bi}")
        ax.bar_label(bars, labels=[format_cell(v, s.column, spec.digits) for _, v in kept], padding=2, fontsize=8)
    if spec.kind == "bar":
        ax.set_xticks(range(n), labels)
        ax.set_xlabel(data.x_column.label)
        ax.grid(False, axis="x")
    else:
        ax.set_yticks(range(n), labels)
        ax.invert_yaxis()  # first row on top, as in the table
        ax.grid(False, axis="y")


def _draw_lines(ax: Any, spec: ChartSpec, data: ChartData, labels: list[str], gid: str) -> None:
    """One line per series; ids ``<gid>-line-<series>``. Up to LABELLED_POINTS points, each value
    is written at its point and each x value is a tick; a longer numeric series (a timeline) gets
    plain points and the axis's own ticks, as labels that many would only overlap."""
    numeric = data.x_column.type == "number"
    xs = list(data.categories) if numeric else list(range(len(data.categories)))
    labelled = len(xs) <= LABELLED_POINTS or not numeric
    for si, s in enumerate(data.series):
        pts = [(x, v) for x, v in zip(xs, s.values) if v is not None]
        (line,) = ax.plot([x for x, _ in pts], [v for _, v in pts], marker="o", markersize=4 if labelled else 2,
                          label=s.label, color=PALETTE[si % len(PALETTE)])
        line.set_gid(f"{gid}-line-{si}")
        if labelled:
            for x, v in pts:
                ax.annotate(format_cell(v, s.column, spec.digits), (x, v), textcoords="offset points", xytext=(0, 5),
                            ha="center", fontsize=8)
    if labelled:
        ax.set_xticks(xs, labels)
    ax.set_xlabel(data.x_column.label)


def _draw_ref(ax: Any, spec: ChartSpec, data: ChartData, gid: str) -> None:
    """A dashed line at ``ref`` with its value and unit beside it."""
    unit = data.series[0].column.unit
    text = f"{spec.ref:g} {unit}" if unit else f"{spec.ref:g}"
    style = {"color": "#888888", "linestyle": "--", "linewidth": 1, "gid": f"{gid}-ref"}
    note = {"textcoords": "offset points", "fontsize": 7, "color": "#555555"}
    if spec.kind == "hbar":
        ax.axvline(spec.ref, **style)
        ax.annotate(text, (spec.ref, 1), xycoords=("data", "axes fraction"), xytext=(3, -2), va="top", **note)
    else:
        ax.axhline(spec.ref, **style)
        ax.annotate(text, (1, spec.ref), xycoords=("axes fraction", "data"), xytext=(-3, 3), ha="right", **note)


def _value_limits(ax: Any, spec: ChartSpec, data: ChartData) -> None:
    """Values start at zero (a scale that starts elsewhere exaggerates); ``ymax`` and a
    reference line can raise the top; ``logy`` keeps the scale logarithmic instead."""
    if spec.logy:
        (ax.set_xscale if spec.kind == "hbar" else ax.set_yscale)("log")
        return
    values = [v for s in data.series for v in s.values if v is not None]
    if min(values) < 0:
        return
    top = spec.ymax
    if top is None:
        top = max(values + ([spec.ref] if spec.ref is not None else [])) * 1.15
    if top > 0:
        (ax.set_xlim if spec.kind == "hbar" else ax.set_ylim)(0, top)


_METADATA_RE = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
_STYLE_RE = re.compile(r"\s*<defs>\s*<style[^>]*>.*?</style>\s*</defs>", re.S)


_ID_RE = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')


def _clean_svg(svg: str, title: str, prefix: str) -> str:
    """Inline-ready SVG: no XML prolog, no metadata, no page-wide style, no blank lines, and
    every element id under ``prefix`` (matplotlib names each figure's groups ``figure_1``,
    ``axes_1``, ... and two charts on one page must not share an id)."""
    svg = svg[svg.index("<svg"):]
    svg = _METADATA_RE.sub("", svg)
    svg = _STYLE_RE.sub("", svg)  # a `*{...}` rule would leak onto the whole page

    def own(m: re.Match) -> str:
        name = m.group(2)
        return m.group(1) + (name if name.startswith(prefix) else f"{prefix}-{name}")

    svg = _ID_RE.sub(own, svg)
    svg = svg.replace(
        "<svg ",
        f'<svg role="img" aria-label="{_attr(title)}" style="max-width:100%;height:auto" '
        'stroke-linejoin="round" stroke-linecap="butt" ',
        1,
    )
    return "\n".join(line for line in svg.splitlines() if line.strip())


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


_cache: dict[tuple[str, str], str] = {}


def chart_svg(art: Artifact, spec: ChartSpec, text: str = "") -> str:
    """The chart as SVG text. ``text`` (the directive) seeds the element ids."""
    key = (json.dumps(art.raw, sort_keys=True) + repr(spec), text)
    if key not in _cache:
        prefix = salt(art, text or repr(spec))
        _cache[key] = _draw(spec, chart_data(art, spec), prefix, spec.title or art.title)
    return _cache[key]


def figure_html(svg: str, caption_md: str) -> str:
    """A ``<figure>``: the SVG kept raw, the Markdown caption parsed (so its link is checked)."""
    return (
        '\n<figure class="vo-chart" markdown="1">\n'
        f'<div class="vo-chart-svg" markdown="0">{svg}</div>\n'
        f'<figcaption markdown="span">{caption_md}</figcaption>\n'
        "</figure>\n"
    )


def render_directive(artifacts: Mapping[str, Artifact], d: Directive, page: str, where: str) -> str:
    """The HTML for one ``<!-- chart: -->`` directive on ``page``; every mistake names the page."""
    from . import site

    shown = d.text or f"<!-- chart: {d.artifact_id} -->"
    art = artifacts.get(d.artifact_id)
    if art is None:
        raise DirectiveError(
            f"{where}: no artifact {d.artifact_id!r} (expected results/{d.artifact_id}.json) in {shown}")
    try:
        svg = chart_svg(art, ChartSpec.from_options(d.options), shown)
    except ChartError as exc:
        raise DirectiveError(f"{where}: {exc} in {shown}") from None
    return figure_html(svg, caption(art, site.rel(site.page_uri(art.id), page)))
