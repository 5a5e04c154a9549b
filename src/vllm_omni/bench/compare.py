"""``vllm-omni-bench compare``: a new run's artifact beside the published one, cell by cell.

Why: a reader who reruns a figure's command needs a verdict, not two JSON files. Rows are
matched by their key columns, each compared cell is shown with both values and their ratio,
and it passes when the new value is within the artifact's relative tolerance of the
published one. Hosts are noisy, so by default only medians and ratios are compared.

Settings come from the published artifact's optional ``compare`` block
(``tolerance``, ``columns``, ``key_columns``); whatever it leaves out falls back to the
defaults of :func:`resolve`, and the output says which applied.

Exit status: 0 when every compared cell passes, 1 when any fails (or a published row has
no counterpart in the new run), 2 for bad input (unknown id, unreadable or malformed file,
unknown column, ambiguous or no matching rows).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.bench.common import BenchError
from vllm_omni.results import store
from vllm_omni.results.render import format_cell
from vllm_omni.results.schema import Artifact, Column, load_file

#: Relative tolerance when an artifact states none, by origin.
DEFAULT_TOLERANCE = {"measured": 0.15, "transcribed": 0.15, "computed": 1e-9}
#: Column names that make a default compared column: medians and ratios travel across hosts.
ROBUST_MARKERS = ("median", "/", "ratio", "rtf", "share")
#: Numeric columns that identify a row rather than measure it (thread counts).
KEY_MARKERS = ("thread",)


@dataclass(frozen=True)
class Settings:
    """What a comparison matches on and checks, and where each choice came from."""

    key_columns: tuple[str, ...]
    columns: tuple[str, ...]
    tolerance: float
    key_source: str
    columns_source: str
    tolerance_source: str

    def describe(self) -> list[str]:
        keys = ", ".join(self.key_columns) if self.key_columns else "row position (no key columns)"
        return [
            f"rows matched by: {keys} ({self.key_source})",
            f"columns compared: {', '.join(self.columns)} ({self.columns_source})",
            f"tolerance: ±{format_tolerance(self.tolerance)} relative to the published value ({self.tolerance_source})",
        ]


def format_tolerance(tol: float) -> str:
    pct = tol * 100
    return f"{pct:g} %" if pct >= 0.01 else f"{tol:g}"


def _names(art: Artifact, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BenchError(f"{art.path}: {where}: expected a list of column names, got {value!r}")
    known = [c.name for c in art.columns]
    for name in value:
        if name not in known:
            raise BenchError(f"{art.path}: {where}: no column {name!r}; valid: {', '.join(known)}")
    return tuple(value)


def default_keys(art: Artifact) -> tuple[str, ...]:
    """The text columns a table opens with (its row labels) plus columns named after threads.

    Later text columns (notes, units, host-specific values such as CPU lists) are not keys:
    they would stop rows from matching across hosts. When every column is text, the first
    one alone is the key and the rest are compared for equality. When these keys repeat in
    the published rows, every text column is tried, and failing that rows match by position.
    """
    leading: list[str] = []
    for c in art.columns:
        if c.type != "text":
            break
        leading.append(c.name)
    if len(leading) == len(art.columns):
        leading = leading[:1]
    threads = [c.name for c in art.columns if c.type != "text" and any(m in c.name.lower() for m in KEY_MARKERS)]
    keys = tuple(leading + threads)
    if _unique(art, keys):
        return keys
    # Row labels repeat: try every text column, else fall back to matching rows by position.
    wider = tuple([c.name for c in art.columns if c.type == "text"] + threads)
    return wider if len(wider) < len(art.columns) and _unique(art, wider) else ()


def _unique(art: Artifact, keys: tuple[str, ...]) -> bool:
    if not keys:
        return False
    idx = [art.column_index(k) for k in keys]
    seen = {tuple(row[i] for i in idx) for row in art.rows}
    return len(seen) == len(art.rows)


def resolve(art: Artifact, tolerance: float | None = None) -> Settings:
    """The comparison settings for a published artifact: its compare block, else defaults.

    Defaults: rows are keyed by :func:`default_keys` (no keys: by position). The compared
    columns are every non-key column of a computed artifact (it must reproduce exactly);
    otherwise the non-key numeric columns that are medians, ratios, shares or RTFs, else
    every non-key numeric column, else every non-key column. Text and booleans are compared
    for equality. The tolerance is 15 % for measured and transcribed artifacts and 1e-9 for
    computed ones.
    """
    block = art.compare or {}
    if "key_columns" in block:
        keys, key_source = _names(art, block["key_columns"], "compare.key_columns"), "from the artifact's compare block"
    else:
        keys = default_keys(art)
        key_source = "default: the leading text columns and thread counts"
    if "columns" in block:
        cols = _names(art, block["columns"], "compare.columns")
        cols_source = "from the artifact's compare block"
        if not cols:
            raise BenchError(f"{art.path}: compare.columns: empty; name at least one column")
    else:
        rest = [c for c in art.columns if c.name not in keys]
        numeric = [c.name for c in rest if c.type == "number"]
        robust = [n for n in numeric if any(m in n.lower() for m in ROBUST_MARKERS)]
        if art.origin == "computed" and rest:
            cols, cols_source = tuple(c.name for c in rest), "default for computed artifacts: every column that is not a key"
        elif robust:
            cols, cols_source = tuple(robust), "default: the medians, ratios and shares among the numeric columns"
        elif numeric:
            cols, cols_source = tuple(numeric), "default: every numeric column that is not a key"
        else:
            cols, cols_source = tuple(c.name for c in rest), "default: every column that is not a key, for equality"
        if not cols:
            raise BenchError(f"{art.path}: columns: every column is a key column; nothing to compare")
    overlap = set(cols) & set(keys)
    if overlap:
        raise BenchError(f"{art.path}: compare: {sorted(overlap)[0]!r} is both a key column and a compared column")
    if tolerance is not None:
        if not (isinstance(tolerance, (int, float)) and tolerance > 0 and math.isfinite(tolerance)):
            raise BenchError(f"--tolerance must be a positive number, got {tolerance!r}")
        tol, tol_source = float(tolerance), "given with --tolerance"
    elif block.get("tolerance") is not None:
        tol, tol_source = float(block["tolerance"]), "from the artifact's compare block"
    else:
        tol = DEFAULT_TOLERANCE[art.origin]
        tol_source = f"default for {art.origin} artifacts"
    return Settings(keys, cols, tol, key_source, cols_source, tol_source)


# --- the comparison ----------------------------------------------------------------------------

@dataclass
class Cell:
    key: tuple[Any, ...]
    column: str
    published: Any
    new: Any
    ratio: float | None
    ok: bool
    why: str = ""


@dataclass
class Result:
    settings: Settings
    cells: list[Cell] = field(default_factory=list)
    missing: list[tuple[Any, ...]] = field(default_factory=list)  # published rows absent from the new run
    extra: list[tuple[Any, ...]] = field(default_factory=list)  # new rows absent from the published artifact

    @property
    def failed(self) -> list[Cell]:
        return [c for c in self.cells if not c.ok]

    @property
    def ok(self) -> bool:
        return not self.failed and not self.missing


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compare_cell(published: Any, new: Any, tol: float) -> tuple[float | None, bool, str]:
    """(new/published, passes, reason) for one cell."""
    if published is None and new is None:
        return None, True, "both null"
    if published is None or new is None:
        return None, False, "null on one side only"
    if _is_num(published) and _is_num(new):
        ratio = new / published if published != 0 else None
        if published == 0:
            return ratio, new == 0, "" if new == 0 else "published is 0"
        ok = abs(new - published) <= tol * abs(published)
        return ratio, ok, "" if ok else f"outside ±{format_tolerance(tol)}"
    ok = published == new
    return None, ok, "" if ok else "differs"


def _index(art: Artifact, keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[Any]]:
    if not keys:
        return {(f"#{i}",): row for i, row in enumerate(art.rows)}
    idx = [art.column_index(k) for k in keys]
    out: dict[tuple[Any, ...], list[Any]] = {}
    for row in art.rows:
        key = tuple(row[i] for i in idx)
        if key in out:
            raise BenchError(f"{art.path}: rows: two rows share the key {dict(zip(keys, key))}; "
                             f"the key columns ({', '.join(keys)}) do not identify a row")
        out[key] = row
    return out


def compare(new: Artifact, published: Artifact, settings: Settings) -> Result:
    """Match rows and compare cells; raises :class:`BenchError` on bad input."""
    for name in settings.key_columns + settings.columns:
        try:
            new.column_index(name)
        except KeyError:
            raise BenchError(
                f"{new.path}: columns: no column {name!r} (the published {published.id} has it); "
                f"valid: {', '.join(c.name for c in new.columns)}"
            ) from None
    pub_rows, new_rows = _index(published, settings.key_columns), _index(new, settings.key_columns)
    matched = [k for k in pub_rows if k in new_rows]
    if not matched:
        shown = ", ".join(str(dict(zip(settings.key_columns, k))) for k in list(pub_rows)[:3])
        raise BenchError(
            f"{new.path}: rows: no row matches the published {published.id} on "
            f"{', '.join(settings.key_columns) or 'row position'} (published keys: {shown})"
        )
    result = Result(settings)
    for key in pub_rows:
        if key not in new_rows:
            result.missing.append(key)
            continue
        for name in settings.columns:
            p = pub_rows[key][published.column_index(name)]
            n = new_rows[key][new.column_index(name)]
            ratio, ok, why = compare_cell(p, n, settings.tolerance)
            result.cells.append(Cell(key, name, p, n, ratio, ok, why))
    result.extra = [k for k in new_rows if k not in pub_rows]
    return result


# --- output ------------------------------------------------------------------------------------

def _describe(art: Artifact) -> str:
    prov = art.provenance
    host = prov["host"].get("cpu") or prov["host"].get("gpu") or "host not stated"
    return f"{art.path} ({art.origin}, {prov['date']}, {host})"


def _key_text(key: tuple[Any, ...]) -> str:
    return ", ".join("—" if k is None else str(k) for k in key)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def report(new: Artifact, published: Artifact, result: Result) -> str:
    s = result.settings
    cols = {c.name: c for c in published.columns}
    lines = [f"compare {published.id}", f"  published: {_describe(published)}", f"  new:       {_describe(new)}"]
    lines += ["  " + d for d in s.describe()]
    lines.append("")
    rows = []
    for c in result.cells:
        col: Column = cols[c.column]
        rows.append([
            _key_text(c.key), c.column + (f" ({col.unit})" if col.unit else ""),
            format_cell(c.published, col), format_cell(c.new, col),
            "—" if c.ratio is None else f"{c.ratio:.3f}",
            ("pass" if c.ok else "FAIL") + (f" ({c.why})" if c.why and not c.ok else ""),
        ])
    lines += _table([" / ".join(s.key_columns) or "row", "column", "published", "new", "new/published", "result"], rows)
    lines.append("")
    for key in result.missing:
        lines.append(f"FAIL: published row {_key_text(key)} has no counterpart in the new run")
    for key in result.extra:
        lines.append(f"note: new row {_key_text(key)} is not in the published artifact (not compared)")
    n_fail = len(result.failed)
    verdict = "PASS" if result.ok else "FAIL"
    lines.append(
        f"{verdict}: {len(result.cells)} cells compared, {len(result.cells) - n_fail} pass, {n_fail} fail"
        + (f"; {len(result.missing)} published rows missing from the new run" if result.missing else "")
    )
    return "\n".join(lines)


# --- the command -------------------------------------------------------------------------------

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare a new run's artifact with the published one, cell by cell",
        description=(
            "Load NEW (an artifact file written by a rerun, or a results folder holding "
            "<id>.json) and the published artifact ID from the repository's results/, match rows "
            "by key columns, and check each compared cell within a relative tolerance. Exit "
            "status 0: all pass; 1: any fails; 2: bad input."
        ),
    )
    p.add_argument("new", type=Path, help="the new artifact file, or the results folder it was written into")
    p.add_argument("artifact_id", metavar="ID", help="the published artifact's id, e.g. cpu-path/sampler-t2")
    p.add_argument("--tolerance", type=float, default=None,
                   help="relative tolerance, overriding the artifact's (e.g. 0.2 for ±20 %%)")
    p.add_argument("--published", type=Path, default=None,
                   help="results folder holding the published artifact (default: this checkout's results/)")
    p.add_argument("--allow-other-id", action="store_true",
                   help="compare even when NEW carries a different artifact id")
    p.set_defaults(func=run)


def load_pair(args: argparse.Namespace) -> tuple[Artifact, Artifact]:
    published = store.load(args.artifact_id, args.published)
    path = args.new
    if path.is_dir():
        path = path / f"{args.artifact_id}.json"
    new = load_file(path)
    if new.id != published.id and not args.allow_other_id:
        raise BenchError(f"{path}: id: the new artifact is {new.id!r}, not {published.id!r} "
                         "(pass --allow-other-id to compare them anyway)")
    return new, published


def run(args: argparse.Namespace) -> int:
    new, published = load_pair(args)
    result = compare(new, published, resolve(published, args.tolerance))
    print(report(new, published, result))
    return 0 if result.ok else 1


def check_command(art: Artifact, scratch: str = "$VLLM_OMNI_RESULTS_DIR") -> str:
    """The compare command a reader runs after writing a rerun into ``scratch``."""
    return f'vllm-omni-bench compare "{scratch}/{art.id}.json" {art.id}'


__all__ = ["DEFAULT_TOLERANCE", "Result", "Settings", "check_command", "compare", "compare_cell", "report", "resolve"]
