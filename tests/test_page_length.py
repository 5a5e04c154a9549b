"""The study pages stay readable: the front page about 500 words, each study page at most about 2,500.

Investigations live in docs/analysis/ as notes of their own, linked from the page whose figure
they explain; this test keeps them from growing back into the pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.results.prose import prose_words

DOCS = Path(__file__).resolve().parents[1] / "docs"
FRONT_MAX = 650
PAGE_MAX = 2600
STUDY = sorted(p for folder in ("edge", "engines") for p in (DOCS / folder).glob("*.md"))


def test_prose_words_count_what_a_reader_reads():
    page = ("# Title\n\nTwo words <!-- value: a/b row=x col=y --> here, [a link](x.md#anchor).\n\n"
            "```python\nprint('not prose')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<div markdown>\n")
    assert prose_words(page) == 7  # Title, Two, words, the figure, here, a, link: no code, table or target


def test_the_front_page_answers_in_about_500_words():
    assert prose_words((DOCS / "index.md").read_text(encoding="utf-8")) <= FRONT_MAX


@pytest.mark.parametrize("page", STUDY, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_each_study_page_stays_under_about_2500_words(page):
    words = prose_words(page.read_text(encoding="utf-8"))
    assert words <= PAGE_MAX, f"{page.relative_to(DOCS)}: {words} words of prose; move investigations to docs/analysis/"
