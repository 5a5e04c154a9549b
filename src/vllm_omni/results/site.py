"""What the site shows of artifacts: tables and figures in pages, one page per artifact,
and the index. Pure functions over :class:`Artifact`; the MkDocs hook only wires them in.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from typing import Any, Iterable

from .directives import Directive, DirectiveError
from .render import ORIGIN_LABELS, caption, format_cell, markdown_table
from .schema import Artifact, Column

ARTIFACT_PAGES = "artifacts"  # artifact pages live at artifacts/<id>.md
RAW_JSON = "results"  # raw files are published at results/<id>.json


def page_uri(artifact_id: str) -> str:
    return f"{ARTIFACT_PAGES}/{artifact_id}.md"


def raw_uri(artifact_id: str) -> str:
    return f"{RAW_JSON}/{artifact_id}.json"


def rel(target: str, from_page: str) -> str:
    """A relative link from one docs file to another (MkDocs validates and rewrites it)."""
    return posixpath.relpath(target, posixpath.dirname(from_page) or ".")


def _lookup(artifacts: dict[str, Artifact], d: Directive, where: str) -> Artifact:
    try:
        return artifacts[d.artifact_id]
    except KeyError:
        raise DirectiveError(
            f"{where}: no artifact {d.artifact_id!r} (expected results/{d.artifact_id}.json)"
        ) from None


def render_directive(artifacts: dict[str, Artifact], d: Directive, page: str, where: str) -> str:
    art = _lookup(artifacts, d, where)
    link = rel(page_uri(art.id), page)
    try:
        if d.name == "table":
            cols = [c.strip() for c in d.options["columns"].split(",")] if "columns" in d.options else None
            digits = int(d.options["digits"]) if "digits" in d.options else None
            return "\n" + markdown_table(art, cols, digits) + "\n\n" + caption(art, link) + "\n"
        return render_value(art, d, link)
    except KeyError as exc:
        raise DirectiveError(f"{where}: {exc.args[0]}") from None


def _run_value(art: Artifact, path: str) -> Any:
    """The number at ``path`` (keys joined by dots) in the artifact's ``provenance.run``."""
    value: Any = (art.provenance or {}).get("run") or {}
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"{art.path}: provenance.run has no {path!r} (no key {key!r})")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KeyError(f"{art.path}: provenance.run.{path} is {value!r}, not a number a page can quote")
    return value


def _value_text(value: Any, d: Directive, col: Column) -> str:
    """``fmt=`` wins, then ``digits=``, then the column's precision, then the default rounding."""
    if "fmt" in d.options:
        try:
            return format(value, d.options["fmt"])
        except ValueError:
            raise KeyError(f"fmt={d.options['fmt']!r} cannot format the {type(value).__name__} {value!r}") from None
    return format_cell(value, col, int(d.options["digits"]) if "digits" in d.options else None)


def render_value(art: Artifact, d: Directive, link: str) -> str:
    if "run" in d.options:
        value = _run_value(art, d.options["run"])
        text = _value_text(value, d, Column(d.options["run"], None, "number"))
        return f"[{text}]({link} \"{art.id}\")"
    row_key: str | int = d.options["row"]
    if row_key.startswith("#") and row_key[1:].isdigit():
        row_key = int(row_key[1:])  # "#2" picks the third row by position
    col = art.columns[art.column_index(d.options["col"])]
    value = art.value(row_key, col.name)
    if value is None:
        raise KeyError(f"{art.path}: the cell ({d.options['row']!r}, {col.name!r}) is null; a page cannot quote it")
    text = _value_text(value, d, col)
    if col.unit and d.options.get("unit", "yes") != "no":
        text += "%" if col.unit == "%" else f" {col.unit}"
    return f"[{text}]({link} \"{art.id}\")"


def _prov_value(value: Any) -> str:
    if value is None:
        return "null (not stated / unknown)"
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, ensure_ascii=False).replace("|", "\\|").replace("`", "'") + "`"
    return str(value).replace("|", "\\|").replace("\n", " ")


def artifact_page(art: Artifact, cited_by: Iterable[tuple[str, str]]) -> str:
    """The generated page for one artifact: table, provenance, columns, how to regenerate."""
    me = page_uri(art.id)
    prov = art.provenance
    lines = [
        f"# {art.title}",
        "",
        f"`{art.id}` · **{ORIGIN_LABELS[art.origin]}** · [raw JSON]({rel(raw_uri(art.id), me)})",
        "",
        markdown_table(art),
        "",
    ]
    if art.notes:
        lines += ["!!! note", "", "    " + art.notes.replace("\n", "\n    "), ""]
    lines += ["## Provenance", "", "| field | value |", "|:---|:---|"]
    for key in ("source", "date", "model", "weights", "quantization", "threads"):
        lines.append(f"| {key} | {_prov_value(prov[key])} |")
    for key, value in prov["host"].items():
        if key == "cpu_flags":
            value = f"{len(value.split())} flags (see raw JSON)" if value else value  # space-separated
        lines.append(f"| host.{key} | {_prov_value(value)} |")
    for key, value in prov["builds"].items():
        lines.append(f"| builds.{key} | {_prov_value(value)} |")
    if "repo" in prov:
        lines.append(f"| repo | {_prov_value(prov['repo'])} |")
    if "run" in prov:
        for key, value in prov["run"].items():
            lines.append(f"| run.{key} | {_prov_value(value)} |")
    if prov.get("packages"):
        lines.append(f"| packages | {_prov_value(prov['packages'])} |")
    lines += ["", "## Columns", "", "| column | unit | type |", "|:---|:---|:---|"]
    for col in art.columns:
        lines.append(f"| {col.name} | {col.unit or '—'} | {col.type} |")
    lines += ["", "## Regenerate", ""]
    if prov["command"]:
        lines += ["```text", prov["command"], "```", ""]
        if art.origin == "measured":
            lines += [
                "Run it from a checkout with the package installed (`make test` sets one up). "
                "Timings depend on the host: compare ratios and medians, not absolute times.",
                "",
            ]
    else:
        lines += [
            "This artifact is transcribed: its figures come from published text (the study's, a report's or "
            f"a peer project's: {prov['source']}). There is no command to rerun; the raw captures are not public.",
            "",
        ]
    lines += check_yourself(art)
    cited = sorted(set(cited_by))
    lines += ["## Cited by", ""]
    if cited:
        lines += [f"- [{title}]({rel(src, me)})" for src, title in cited]
    else:
        lines.append("No page cites this artifact yet.")
    lines.append("")
    return "\n".join(lines)


SCRATCH_ENV = "VLLM_OMNI_RESULTS_DIR"


# Subcommands whose default artifact name comes from the host they run on (``env``: the CPU and
# its core count). Their rerun is given the artifact's own name, so that the compare after it
# finds the file on any machine and for artifacts written before the naming rule changed.
NAMED_BY_HOST = ("env",)


def rerun_command(art: Artifact) -> str | None:
    """The command that regenerates ``art``, as a reader types it: from the recorded argv when
    there is one (the console script by name, any ``--output`` dropped, ``--name`` added for a
    host-named subcommand), else the recorded command; None for transcribed artifacts."""
    prov = art.provenance
    argv = prov.get("argv")
    if argv:
        words = list(argv)
        if posixpath.basename(words[0]) == "vllm-omni-bench":
            words[0] = "vllm-omni-bench"
        out: list[str] = []
        skip = False
        for w in words:
            if skip:
                skip = False
                continue
            if w == "--output":
                skip = True
                continue
            if w.startswith("--output="):
                continue
            out.append(w)
        named = any(w == "--name" or w.startswith("--name=") for w in out)
        if len(out) > 1 and out[1] in NAMED_BY_HOST and not named:
            out += ["--name", art.id.rsplit("/", 1)[1]]
        return shlex.join(out)
    return prov["command"]


def check_yourself(art: Artifact) -> list[str]:
    """The "Check this yourself" section: rerun into a scratch folder, then compare."""
    from vllm_omni.bench.compare import BenchError, check_command, format_tolerance, resolve

    lines = ["## Check this yourself", ""]
    command = rerun_command(art)
    if command is None:
        lines += [
            "There is no run to repeat: every figure here was carried over from published text, and "
            f"the provenance names the place (*{_prov_value(art.provenance['source'])}*). Check each cell "
            "against that section of the source; its raw captures are not public. Where the study does arithmetic with "
            "these figures, `vllm-omni-bench audit` redoes it and the claims audit (Analysis, Claims "
            "audit) shows each claim with its verdict:",
            "",
            "```bash",
            "vllm-omni-bench audit --no-write",
            "```",
            "",
        ]
        return lines
    lines += [
        f"Rerun the command with `{SCRATCH_ENV}` pointing at a scratch folder, so the published file "
        "stays as it is, then compare the new file with this artifact:",
        "",
        "```bash",
        f'export {SCRATCH_ENV}="$(mktemp -d)"',
        command,
        check_command(art, f"${SCRATCH_ENV}"),
        "```",
        "",
    ]
    try:
        s = resolve(art)
    except BenchError as exc:  # a compare block naming a missing column: say so rather than hide it
        lines += [f"The artifact's compare settings are unusable: {exc}", ""]
        return lines
    keys = ", ".join(f"*{k}*" for k in s.key_columns) or "position"
    lines += [
        f"`compare` matches rows by {keys} ({s.key_source}), compares {', '.join(f'*{c}*' for c in s.columns)} "
        f"({s.columns_source}) within ±{format_tolerance(s.tolerance)} ({s.tolerance_source}), and exits "
        "with 0 when every cell passes, 1 when any fails and 2 for bad input.",
        "",
    ]
    if art.origin == "measured":
        lines += [
            "The figures depend on the host: on a different machine expect the medians to move and the "
            "ratios to travel better; `--tolerance` widens the check.",
            "",
        ]
    return lines


def index_page(artifacts: dict[str, Artifact], citations: dict[str, set[tuple[str, str]]]) -> str:
    me = f"{ARTIFACT_PAGES}/index.md"
    lines = [
        "# Artifacts",
        "",
        "Every figure on this site comes from one of these files under `results/`. "
        "*Transcribed* figures are carried over from published text (the study's, the technical report's, "
        "peer projects'), each file naming its source; *measured* ones were "
        "produced here by `vllm-omni-bench`, which records its own provenance; *computed* ones "
        "are derived by this package and kept fresh by a test.",
        "",
        "| artifact | title | origin | date | cited by |",
        "|:---|:---|:---|:---|---:|",
    ]
    for art_id in sorted(artifacts):
        art = artifacts[art_id]
        lines.append(
            f"| [`{art_id}`]({rel(page_uri(art_id), me)}) | {art.title.replace('|', '/')} | {art.origin} "
            f"| {art.provenance['date']} | {len(citations.get(art_id, ()))} |"
        )
    lines.append("")
    return "\n".join(lines)
