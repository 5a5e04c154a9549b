"""The page directives: substitution, fail-loud typos, code blocks left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni.results import load_all, load_file, site
from vllm_omni.results.directives import DirectiveError, find, substitute

GOOD = load_file(Path(__file__).parent / "fixtures" / "good" / "good.json")
ARTS = {GOOD.id: GOOD}


def render(markdown: str, page: str = "edge/cpu-path.md") -> str:
    return substitute(markdown, page, lambda d, _own, where: site.render_directive(ARTS, d, page, where))


def test_table_directive_renders_table_and_caption():
    out = render("Intro\n\n<!-- table: fixture/good -->\n")
    assert "| component | ms (ms) |" in out
    assert "[`fixture/good`](../artifacts/fixture/good.md)" in out


def test_caption_names_the_cpu_and_its_x86_identity(tmp_path):
    """Two hosts a VM names alike ("AMD EPYC") are told apart under every table."""
    from vllm_omni.results.render import caption

    data = json.loads((Path(__file__).parent / "fixtures" / "good" / "good.json").read_text())
    data["provenance"]["host"].update(cpu="AMD EPYC", cpu_id="family 23, model 1, stepping 2")
    (tmp_path / "a.json").write_text(json.dumps(data))
    assert "; AMD EPYC, family 23, model 1, stepping 2)" in caption(load_file(tmp_path / "a.json"))
    data["provenance"]["host"].pop("cpu_id")
    (tmp_path / "b.json").write_text(json.dumps(data))
    assert "; AMD EPYC)" in caption(load_file(tmp_path / "b.json"))


def test_column_selection():
    out = render('<!-- table: fixture/good columns="ms" -->')
    assert "| ms (ms) |" in out and "component" not in out.split("*")[0]


def test_value_directive_quotes_one_figure_with_link():
    out = render('The loop takes <!-- value: fixture/good row="predictor" col=ms --> per frame.')
    assert out == 'The loop takes [97.1 ms](../artifacts/fixture/good.md "fixture/good") per frame.'


def test_value_format_and_unit_options():
    out = render('<!-- value: fixture/good row="#1" col=ms fmt=".0f" unit=no -->')
    assert out.startswith("[25](")


def test_value_directive_quotes_a_number_the_run_recorded(tmp_path):
    data = json.loads((Path(__file__).parent / "fixtures" / "good" / "good.json").read_text())
    data["provenance"]["run"] = {"load_s": {"int4-t2": 0.97}, "engine": "one at a time"}
    (tmp_path / "r.json").write_text(json.dumps(data))
    arts = {GOOD.id: load_file(tmp_path / "r.json")}

    def show(text: str) -> str:
        return substitute(text, "p.md", lambda d, _own, where: site.render_directive(arts, d, "p.md", where))

    assert show('<!-- value: fixture/good run="load_s.int4-t2" fmt=".1f" -->').startswith("[1.0](")
    with pytest.raises(DirectiveError, match="no 'load_s.int8-t2'"):
        show('<!-- value: fixture/good run="load_s.int8-t2" -->')
    with pytest.raises(DirectiveError, match="not a number"):
        show('<!-- value: fixture/good run="engine" -->')
    with pytest.raises(DirectiveError, match="not both"):
        show('<!-- value: fixture/good run="load_s.int4-t2" row="#0" -->')


@pytest.mark.parametrize(
    "text,message",
    [
        ("<!-- tabel: fixture/good -->", "unknown directive"),
        ("<!-- table: nope/missing -->", "no artifact 'nope/missing'"),
        ("<!-- table: fixture/good cols=ms -->", "option 'cols=ms'"),
        ("<!-- value: fixture/good row=predictor -->", "needs col="),
        ('<!-- value: fixture/good row="sampler" col=ms -->', "no row whose"),
        ('<!-- value: fixture/good row="predictor" col=us -->', "no column 'us'"),
        ("text <!-- table: fixture/good --> inline", "must be on a line of its own"),
    ],
)
def test_bad_directives_raise_with_location(text, message):
    with pytest.raises(DirectiveError, match=message) as info:
        render("line one\n" + text)
    assert str(info.value).startswith("edge/cpu-path.md:2")


def test_code_is_left_alone():
    text = "```markdown\n<!-- table: nope/missing -->\n```\nand `<!-- tabel: x -->` inline\n"
    assert render(text) == text
    assert find(text, "x.md") == []


def test_sybil_directives_pass_through():
    text = '<!-- skip: next if(not HAS_CUDA, reason="needs a CUDA GPU") -->'
    assert render(text) == text


def test_artifact_page_counts_the_cpu_flags():
    art = load_all()["environment/amd-epyc-f25m17-2c"]
    flags = art.provenance["host"]["cpu_flags"].split()
    assert f"| host.cpu_flags | {len(flags)} flags (see raw JSON) |" in site.artifact_page(art, [])


def test_artifact_page_lists_provenance_and_citers():
    page = site.artifact_page(GOOD, [("edge/cpu-path.md", "Why the CPU path is slow")])
    assert page.startswith("# A valid artifact")
    assert "[raw JSON](../../results/fixture/good.json)" in page
    assert "| source | fixture |" in page
    assert "- [Why the CPU path is slow](../../edge/cpu-path.md)" in page
    assert "transcribed" in page and "no command to rerun" in page


# --- rounding: three significant figures unless the artifact or the directive says otherwise ----

def _precise(tmp_path: Path, **column) -> dict:
    """The good fixture with figures that carry more digits than a run supports."""
    data = json.loads((Path(__file__).parent / "fixtures" / "good" / "good.json").read_text())
    data["columns"][1].update(column)
    data["columns"].append({"name": "runs", "unit": None, "type": "number"})
    data["rows"] = [["predictor", 17.564, 12345], ["talker", 0.04512, 7], ["decoder", 1234.56, 20]]
    (tmp_path / "p.json").write_text(json.dumps(data))
    return {GOOD.id: load_file(tmp_path / "p.json")}


def _show(arts: dict, text: str) -> str:
    return substitute(text, "p.md", lambda d, _own, where: site.render_directive(arts, d, "p.md", where))


@pytest.mark.parametrize(
    "value,text",
    [
        (17.564, "17.6"), (86.272, "86.3"), (0.04512, "0.0451"), (-17.564, "-17.6"),
        (17.96, "18.0"), (9.996, "10.0"), (99.95, "100"),  # the zeros the rounding gives, and
        (5.3, "5.3"), (0.6, "0.6"), (2.0, "2"), (80.0, "80"),  # no more decimals than the artifact holds
        (123.4, "123"), (1234.56, "1235"), (12345.6, "12,346"),  # integer digits are never rounded away
        (0.000012345, "0.0000123"), (0.0, "0"),  # no scientific notation
    ],
)
def test_floats_round_to_three_significant_figures(value, text):
    from vllm_omni.results.render import format_cell, round_figure
    from vllm_omni.results.schema import Column

    assert round_figure(value) == text
    assert format_cell(value, Column("ms", "ms", "number")) == text


def test_integers_are_counts_and_never_rounded(tmp_path):
    arts = _precise(tmp_path)
    assert "| predictor | 17.6 | 12,345 |" in _show(arts, "<!-- table: fixture/good -->")
    assert _show(arts, '<!-- value: fixture/good row="#0" col=runs -->').startswith("[12,345](")


def test_values_round_like_tables(tmp_path):
    arts = _precise(tmp_path)
    assert _show(arts, '<!-- value: fixture/good row="#0" col=ms -->').startswith("[17.6 ms](")
    assert _show(arts, '<!-- value: fixture/good row="#1" col=ms unit=no -->').startswith("[0.0451](")


def test_a_column_states_its_own_precision(tmp_path):
    arts = _precise(tmp_path, digits=4)
    assert "| predictor | 17.56 | 12,345 |" in _show(arts, "<!-- table: fixture/good -->")
    assert _show(arts, '<!-- value: fixture/good row="#1" col=ms -->').startswith("[0.04512 ms](")
    assert arts[GOOD.id].to_dict()["columns"][1]["digits"] == 4  # written back as read


def test_the_directive_wins_over_the_column(tmp_path):
    arts = _precise(tmp_path, digits=4)
    assert "| predictor | 17.564 | 12,345 |" in _show(arts, "<!-- table: fixture/good digits=5 -->")
    assert "| predictor | 18 | 12,345 |" in _show(arts, '<!-- table: fixture/good columns="component,ms,runs" digits=2 -->')
    assert _show(arts, '<!-- value: fixture/good row="#0" col=ms digits=5 -->').startswith("[17.564 ms](")
    assert _show(arts, '<!-- value: fixture/good row="#0" col=ms fmt=".3f" -->').startswith("[17.564 ms](")
    arts = _precise(tmp_path, format=".1f")  # a column's format spec is its precision too
    assert _show(arts, '<!-- value: fixture/good row="#0" col=ms -->').startswith("[17.6 ms](")
    assert _show(arts, '<!-- value: fixture/good row="#0" col=ms digits=4 -->').startswith("[17.56 ms](")


def test_a_run_value_rounds_too(tmp_path):
    data = json.loads((Path(__file__).parent / "fixtures" / "good" / "good.json").read_text())
    data["provenance"]["run"] = {"load_s": 0.97364, "accepted": 1200}
    (tmp_path / "r.json").write_text(json.dumps(data))
    arts = {GOOD.id: load_file(tmp_path / "r.json")}
    assert _show(arts, '<!-- value: fixture/good run="load_s" -->').startswith("[0.974](")
    assert _show(arts, '<!-- value: fixture/good run="load_s" digits=2 -->').startswith("[0.97](")
    assert _show(arts, '<!-- value: fixture/good run="accepted" -->').startswith("[1,200](")
    assert _show(arts, '<!-- value: fixture/good run="accepted" fmt="d" -->').startswith("[1200](")


@pytest.mark.parametrize(
    "text,message",
    [
        ("<!-- table: fixture/good digits=0 -->", "digits='0'"),
        ("<!-- table: fixture/good digits=three -->", "digits='three'"),
        ("<!-- table: fixture/good digits=16 -->", "from 1 to 15"),
        ("<!-- table: fixture/good fmt=.2f -->", "option 'fmt=.2f'"),
        ('<!-- value: fixture/good row="#0" col=ms digits=4 fmt=".1f" -->', "fmt= or digits=, not both"),
        ('<!-- value: fixture/good row="#0" col=ms fmt="%" -->', ""),  # '%' is a number spec: accepted
        ('<!-- value: fixture/good row="#0" col=ms fmt="x.q" -->', "not a Python format spec"),
        ("<!-- chart: fixture/good x=component y=ms digits=2.5 -->", "digits='2.5'"),
    ],
)
def test_bad_precision_options_fail(text, message):
    if not message:
        render(text)
        return
    with pytest.raises(DirectiveError, match=message) as info:
        render("line one\n" + text)
    assert str(info.value).startswith("edge/cpu-path.md:2")


def test_a_bad_column_precision_names_the_file_and_field(tmp_path):
    from vllm_omni.results import ArtifactError

    for digits, message in ((0, "from 1 to 15"), (3.5, "got float 3.5"), (True, "got bool True")):
        with pytest.raises(ArtifactError, match=message) as info:
            _precise(tmp_path, digits=digits)
        assert str(info.value).startswith(f"{tmp_path / 'p.json'}: columns[1].digits:")
    data = json.loads((Path(__file__).parent / "fixtures" / "good" / "good.json").read_text())
    data["columns"][0]["digits"] = 3
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="columns\\[0\\].digits: a text column has no figures"):
        load_file(tmp_path / "t.json")
