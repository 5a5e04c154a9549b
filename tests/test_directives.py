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
