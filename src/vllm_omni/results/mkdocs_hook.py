"""MkDocs hook: tables, charts and figures from ``results/``, and one generated page per artifact.

Registered in ``mkdocs.yml`` under ``hooks:``. Every failure (a malformed artifact, an
unknown id, a typo in a directive, a directive left in the output, a list that would render
wrongly, see ``vllm_omni.results.lists``) raises ``PluginError`` naming the file, which aborts
the build whether or not ``--strict`` is given.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files, InclusionLevel

from vllm_omni.results import charts, directives, lists, site
from vllm_omni.results.schema import Artifact, ArtifactError
from vllm_omni.results.store import load_all

_state: dict = {"artifacts": {}, "citations": {}}
_LEFTOVER_RE = re.compile(r"<!--\s*(table|value|chart):")
_H1_RE = re.compile(r"^#\s+(.+?)\s*$", re.M)


def _results_dir(config) -> Path:
    return Path(config.config_file_path).resolve().parent / "results"


def on_config(config):
    try:
        _state["artifacts"] = load_all(_results_dir(config))
    except ArtifactError as exc:
        raise PluginError(f"malformed artifact: {exc}") from None
    return config


def _page_title(text: str, src_uri: str) -> str:
    m = _H1_RE.search(text)
    return m.group(1) if m else src_uri


@event_priority(50)  # before plugins (htmlproofer) so they see the generated files
def on_files(files: Files, config) -> Files:
    artifacts: dict[str, Artifact] = _state["artifacts"]
    citations: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for f in files.documentation_pages():
        if f.src_uri.startswith(site.ARTIFACT_PAGES + "/"):
            continue
        text = f.content_string
        try:
            found = directives.find(text, f"docs/{f.src_uri}")
        except directives.DirectiveError as exc:
            raise PluginError(str(exc)) from None
        for d in found:
            if d.artifact_id not in artifacts:
                raise PluginError(
                    f"{d.where}: no artifact {d.artifact_id!r} (expected results/{d.artifact_id}.json) in {d.text}"
                )
            citations[d.artifact_id].add((f.src_uri, _page_title(text, f.src_uri)))
    _state["citations"] = citations

    results_dir = _results_dir(config)
    for art_id, art in artifacts.items():
        files.append(File.generated(config, site.raw_uri(art_id), abs_src_path=str(results_dir / f"{art_id}.json")))
        files.append(
            File.generated(
                config, site.page_uri(art_id), content=site.artifact_page(art, citations.get(art_id, ())),
                inclusion=InclusionLevel.NOT_IN_NAV,
            )
        )
    files.append(File.generated(config, f"{site.ARTIFACT_PAGES}/index.md", content=site.index_page(artifacts, citations)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    artifacts = _state["artifacts"]
    shallow = lists.shallow_nested_items(markdown)
    if shallow:
        raise PluginError(
            f"docs/{src}:{shallow[0]}: a list item indented by 1 to 3 spaces renders as an item of the list "
            "above it, not nested under it; indent nested lists by 4 spaces"
        )

    def render(d: directives.Directive, _own: bool, where: str) -> str:
        if d.name == "chart":  # drawn with matplotlib, imported on the first chart
            return charts.render_directive(artifacts, d, src, where)
        return site.render_directive(artifacts, d, src, where)

    try:
        return directives.substitute(markdown, f"docs/{src}", render)
    except directives.DirectiveError as exc:
        raise PluginError(str(exc)) from None


def on_post_page(output: str, page, config) -> str:
    m = _LEFTOVER_RE.search(output)
    if m:
        raise PluginError(f"docs/{page.file.src_uri}: a '<!-- {m.group(1)}: -->' directive was left unsubstituted")
    swallowed = lists.swallowed_items(output)
    if swallowed:
        raise PluginError(
            f"docs/{page.file.src_uri}: the list item {swallowed[0]!r} is rendered as text inside a paragraph; "
            "leave a blank line before a list, and indent a list item's later paragraphs by 4 spaces"
        )
    return output
