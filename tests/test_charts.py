"""Chart directives: the SVG shows the artifact's numbers, comes out byte-stable, and every
typo stops the build with the page, the line and the directive."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.results import charts, load_file, validate
from vllm_omni.results.charts import ChartSpec, chart_data, chart_svg
from vllm_omni.results.directives import DirectiveError, find, substitute

ROOT = Path(__file__).resolve().parents[1]
GOOD_PATH = ROOT / "tests" / "fixtures" / "good" / "good.json"
GOOD = load_file(GOOD_PATH)  # component: predictor 97.1 ms, talker 25.4 ms


def artifact(columns, rows, art_id="fixture/sweep"):
    data = copy.deepcopy(GOOD.raw)
    data.update(id=art_id, columns=columns, rows=rows)
    return validate(data, f"results/{art_id}.json")


SWEEP = artifact(
    [{"name": "impl", "unit": None, "type": "text"}, {"name": "threads", "unit": None, "type": "number"},
     {"name": "ms", "unit": "ms", "type": "number"}, {"name": "note", "unit": None, "type": "text"}],
    [["reference", 1, 40.0, None], ["fused", 1, 20.0, None], ["reference", 2, 30.0, None],
     ["fused", 2, 10.0, "fast"], ["fused", 4, None, "not run"]],
)
ARTS = {GOOD.id: GOOD, SWEEP.id: SWEEP}


def svg_of(art, **options):
    options.setdefault("kind", "bar")
    return chart_svg(art, ChartSpec.from_options(options), repr(sorted(options.items())))


def groups(svg: str, kind: str) -> dict[str, str]:
    """Content of each ``<g id="vo<salt>-<kind>-...">`` group, by its id tail."""
    return {m.group(1): m.group(2) for m in re.finditer(rf'<g id="vo[0-9a-f]+-({kind}-[0-9-]+)">(.*?)</g>', svg, re.S)}


def path_points(group: str) -> list[tuple[float, float]]:
    d = re.search(r'<path d="([^"]+)"', group).group(1)
    nums = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return list(zip(nums[::2], nums[1::2]))


def extent(points, axis: int) -> float:
    values = [p[axis] for p in points]
    return max(values) - min(values)


def texts(svg: str) -> list[str]:
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


# --- the numbers are the artifact's -------------------------------------------------------------

def test_bar_heights_follow_the_column_values():
    svg = svg_of(GOOD, x="component", y="ms")
    bars = groups(svg, "bar")
    assert sorted(bars) == ["bar-0-0", "bar-0-1"]
    heights = [extent(path_points(bars[f"bar-0-{i}"]), 1) for i in range(2)]
    assert heights[0] / heights[1] == pytest.approx(97.1 / 25.4, rel=1e-3)
    shown = texts(svg)
    assert {"predictor", "talker", "97.1", "25.4", "component", "ms"} <= set(shown)  # ticks, bar labels, axes


def test_hbar_lengths_follow_the_column_values_and_keep_row_order():
    svg = svg_of(GOOD, kind="hbar", x="component", y="ms")
    bars = groups(svg, "bar")
    widths = [extent(path_points(bars[f"bar-0-{i}"]), 0) for i in range(2)]
    assert widths[0] / widths[1] == pytest.approx(97.1 / 25.4, rel=1e-3)
    tops = [min(y for _, y in path_points(bars[f"bar-0-{i}"])) for i in range(2)]
    assert tops[0] < tops[1]  # the first row is drawn on top, as in the table


def test_rows_select_and_order_bars():
    svg = svg_of(GOOD, x="component", y="ms", rows="talker")
    assert list(groups(svg, "bar")) == ["bar-0-0"]
    assert "talker" in texts(svg) and "predictor" not in texts(svg)
    data = chart_data(GOOD, ChartSpec.from_options({"x": "component", "y": "ms", "rows": "#1,#0"}))
    assert data.categories == ["talker", "predictor"] and data.series[0].values == [25.4, 97.1]


def test_series_pivots_rows_into_lines_and_skips_nulls():
    spec = ChartSpec.from_options({"kind": "line", "x": "threads", "y": "ms", "series": "impl"})
    data = chart_data(SWEEP, spec)
    assert data.categories == [1, 2, 4]
    assert [(s.label, s.values) for s in data.series] == [
        ("reference", [40.0, 30.0, None]), ("fused", [20.0, 10.0, None])]
    svg = chart_svg(SWEEP, spec, "series")
    lines = groups(svg, "line")
    assert sorted(lines) == ["line-0", "line-1"]
    assert [len(path_points(lines[k])) for k in ("line-0", "line-1")] == [2, 2]  # the null point is left out
    assert {"reference", "fused", "40", "10"} <= set(texts(svg))


def test_multiple_y_columns_make_grouped_bars():
    art = artifact(
        [{"name": "setting", "unit": None, "type": "text"}, {"name": "a", "unit": "ms", "type": "number"},
         {"name": "b", "unit": "ms", "type": "number"}],
        [["x", 1.0, 2.0], ["y", 3.0, None]], "fixture/two",
    )
    svg = svg_of(art, x="setting", y="a,b")
    assert sorted(groups(svg, "bar")) == ["bar-0-0", "bar-0-1", "bar-1-0"]  # null cell: no bar
    assert {"a", "b"} <= set(texts(svg))  # legend


def test_reference_line_is_drawn_and_labelled():
    svg = svg_of(GOOD, kind="hbar", x="component", y="ms", ref="80")
    assert re.search(r'id="vo[0-9a-f]+-ref"', svg) and "80 ms" in texts(svg)


# --- stable, self-contained SVG -----------------------------------------------------------------

def test_output_is_deterministic_and_free_of_stamps():
    charts._cache.clear()
    first = svg_of(GOOD, x="component", y="ms")
    charts._cache.clear()
    assert svg_of(GOOD, x="component", y="ms") == first
    assert first.startswith("<svg ") and first.rstrip().endswith("</svg>")
    for stamp in ("<?xml", "<metadata", "Date", "Matplotlib v", "<style", "\n\n"):
        assert stamp not in first
    assert "<text" in first  # svg.fonttype none: text, not glyph outlines


def test_two_charts_on_a_page_share_no_id():
    a = svg_of(GOOD, x="component", y="ms")
    b = svg_of(GOOD, kind="hbar", x="component", y="ms")
    ids_a, ids_b = set(re.findall(r'id="([^"]+)"', a)), set(re.findall(r'id="([^"]+)"', b))
    assert ids_a and ids_b and not ids_a & ids_b
    refs = set(re.findall(r'url\(#([^)]+)\)', a)) | set(re.findall(r'href="#([^"]+)"', a))
    assert refs and refs <= ids_a  # every internal reference points inside the same chart


def test_importing_charts_does_not_import_matplotlib():
    code = "import sys, vllm_omni.results.charts; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- the directive on a page --------------------------------------------------------------------

def render(markdown: str, page: str = "edge/cpu-path.md") -> str:
    def one(d, _own, where):
        assert d.name == "chart"
        return charts.render_directive(ARTS, d, page, where)

    return substitute(markdown, page, one)


def test_directive_renders_figure_with_caption_link():
    out = render('Text\n\n<!-- chart: fixture/good kind=bar x=component y=ms title="Frame" -->\n')
    assert '<figure class="vo-chart" markdown="1">' in out
    assert '<div class="vo-chart-svg" markdown="0"><svg ' in out
    assert "[`fixture/good`](../artifacts/fixture/good.md)" in out.split("<figcaption")[1]
    assert "Frame" in out and out.count("<svg") == 1


def test_chart_directives_are_found_for_citations():
    found = find('<!-- chart: fixture/good x=component y=ms -->', "p.md")
    assert [(d.name, d.artifact_id, d.options["kind"]) for d in found] == [("chart", "fixture/good", "bar")]


@pytest.mark.parametrize(
    "body,message",
    [
        ("fixture/good x=component y=ms colour=red", "option 'colour=red'"),
        ("fixture/good kind=pie x=component y=ms", "kind='pie' is not one of bar, hbar, line"),
        ("fixture/good x=component", "a chart needs y="),
        ("fixture/good x=component y=ms logy=maybe", "logy='maybe' must be yes or no"),
        ("fixture/good x=component y=ms ref=eighty", "ref='eighty' is not a number"),
        ("fixture/sweep x=threads y=ms,ms series=impl", "series= groups the rows of one y= column"),
        ("fixture/good x=component y=us", "no column 'us'"),
        ("fixture/good x=part y=ms", "no column 'part'"),
        ("fixture/good x=component y=component", "y= needs numeric columns"),
        ('fixture/good x=component y=ms rows="sampler"', "no row whose"),
        ("fixture/sweep x=impl y=ms rows=#4", "hold no values"),
        ("nope/missing x=a y=b", "no artifact 'nope/missing'"),
    ],
)
def test_typos_raise_with_page_line_and_directive(body, message):
    text = f"<!-- chart: {body} -->"
    with pytest.raises(DirectiveError, match=re.escape(message)) as info:
        render("line one\n" + text)
    assert str(info.value).startswith("edge/cpu-path.md:2: ")
    assert body in str(info.value)


def test_chart_must_stand_on_its_own_line():
    with pytest.raises(DirectiveError, match="'<!-- chart: -->' must be on a line of its own"):
        render("see <!-- chart: fixture/good x=component y=ms --> here")


# --- inside a real build ------------------------------------------------------------------------

HOOK = ROOT / "src" / "vllm_omni" / "results" / "mkdocs_hook.py"


def build(tmp_path: Path, page: str) -> tuple[subprocess.CompletedProcess, Path]:
    pytest.importorskip("mkdocs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page)
    (tmp_path / "results" / "fixture").mkdir(parents=True)
    (tmp_path / "results" / "fixture" / "good.json").write_text(json.dumps(GOOD.raw))
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\nstrict: true\nhooks:\n  - {HOOK}\nmarkdown_extensions:\n  - md_in_html\n"
        "nav:\n  - index.md\n  - artifacts/index.md\n"
    )
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=120)
    return proc, tmp_path / "site"


def test_build_inlines_the_chart_and_links_its_artifact(tmp_path):
    proc, site = build(tmp_path, "# Home\n\n<!-- chart: fixture/good kind=hbar x=component y=ms -->\n")
    assert proc.returncode == 0, proc.stderr
    html = (site / "index.html").read_text()
    assert html.count("<svg role=\"img\"") == 1 and ">predictor</text>" in html
    assert 'href="artifacts/fixture/good/"' in html  # the caption link, rewritten by MkDocs
    assert "Home" in (site / "artifacts" / "fixture" / "good" / "index.html").read_text()  # cited by


def test_build_fails_on_a_chart_typo_naming_the_page(tmp_path):
    proc, _ = build(tmp_path, "# Home\n\n<!-- chart: fixture/good kind=bar x=component y=msec -->\n")
    assert proc.returncode != 0
    assert "docs/index.md:3" in proc.stderr and "no column 'msec'" in proc.stderr and "y=msec" in proc.stderr


def test_a_long_numeric_line_drops_its_point_labels_and_per_point_ticks():
    n = charts.LABELLED_POINTS + 1
    art = artifact([{"name": "seconds", "unit": "s", "type": "number"}, {"name": "ns", "unit": "ns", "type": "number"}],
                   [[0.5 * i, 60.0 + 7.0 * i] for i in range(n)], "fixture/timeline")
    svg = svg_of(art, kind="line", x="seconds", y="ns")
    (line,) = groups(svg, "line").values()
    assert len(path_points(line)) == n  # every point is still drawn
    shown = set(texts(svg))
    assert not {"60", "144"} & shown  # no value written at its point
    assert "0.5" not in shown and "5.5" not in shown  # the axis picks its own ticks
    short = artifact(art.raw["columns"], art.raw["rows"][:charts.LABELLED_POINTS], "fixture/short")
    assert {"60", "137"} <= set(texts(svg_of(short, kind="line", x="seconds", y="ns")))


def test_value_labels_round_to_three_figures_unless_digits_says_more():
    art = artifact([{"name": "component", "unit": None, "type": "text"}, {"name": "ms", "unit": "ms", "type": "number"}],
                   [["predictor", 17.564], ["talker", 86.272]], "fixture/precise")
    assert {"17.6", "86.3"} <= set(texts(svg_of(art, x="component", y="ms")))
    assert {"17.56", "86.27"} <= set(texts(svg_of(art, x="component", y="ms", digits="4")))
    with pytest.raises(charts.ChartError, match="digits='0'"):
        ChartSpec.from_options({"x": "component", "y": "ms", "digits": "0"})
