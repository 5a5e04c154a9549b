"""Lists that Python-Markdown renders wrongly are found in the source or in the HTML."""

from __future__ import annotations

import pytest

markdown = pytest.importorskip("markdown")

from vllm_omni.results.lists import shallow_nested_items, swallowed_items  # noqa: E402


def render(text: str) -> str:
    return markdown.markdown(text, extensions=["tables"])


def test_a_nested_list_indented_by_two_is_found_and_renders_flat():
    page = "- parent:\n  - child one\n  - child two\n- next\n"
    assert shallow_nested_items(page) == [2, 3]
    assert render(page).count("<ul>") == 1  # the children came out as the parent's siblings


def test_nested_lists_by_four_and_fenced_code_pass():
    page = "- parent:\n    - child\n      more\n\n```yaml\nkey:\n  - not a list\n```\n1. step\n    - detail\n"
    assert shallow_nested_items(page) == []
    assert render(page).count("<ul>") == 2


def test_a_second_paragraph_by_two_swallows_the_next_items():
    page = "- first item\n\n  second paragraph\n- **second item** text\n- third\n"
    html = render(page)
    assert swallowed_items(html) == ["second item text", "third"]


def test_a_second_paragraph_by_four_keeps_the_list():
    page = "- first item\n\n    second paragraph\n\n- **second item** text\n- third\n"
    html = render(page)
    assert swallowed_items(html) == []
    assert html.count("<li>") == 3
