"""The artifact schema and its validation.

An artifact is one JSON file per table-sized result under ``results/<area>/<name>.json``.
Validation is hand-written so that every error names the file and the dotted field
(``results/x/y.json: provenance.host.cpu: expected a non-empty string or null, got int 3``), and so that
importing it costs nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MAX_DIGITS = 15  # a column's "digits": significant figures, 1 to 15 (what a float holds)
ORIGINS = ("transcribed", "measured", "computed")
COLUMN_TYPES = ("number", "text", "bool")

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)+$")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

TOP_LEVEL_REQUIRED = ("schema", "id", "title", "origin", "provenance", "columns", "rows")
TOP_LEVEL_OPTIONAL = ("notes", "compare", "extra")
PROVENANCE_REQUIRED = (
    "source", "date", "host", "model", "weights", "quantization", "threads", "builds", "command",
)
# Filled by provenance capture for measured artifacts; optional otherwise.
PROVENANCE_OPTIONAL = ("repo", "packages", "argv", "run")
HOST_REQUIRED = ("cpu", "cores_used", "isa", "gpu", "memory_gib")
HOST_OPTIONAL = ("cores_total", "cpu_id", "cpu_flags", "hostname", "os", "python", "notes", "gpu_memory_gib", "gpu_sms")


class ArtifactError(ValueError):
    """A malformed artifact. The message always starts with the file, then the field."""

    def __init__(self, path: str | Path, field_path: str, message: str):
        self.path = str(path)
        self.field = field_path
        super().__init__(f"{self.path}: {field_path}: {message}")


@dataclass(frozen=True)
class Column:
    name: str
    unit: str | None
    type: str
    format: str | None = None
    digits: int | None = None  # significant figures of its floats (default: render.DEFAULT_DIGITS)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.unit})" if self.unit else self.name


@dataclass
class Artifact:
    """A validated artifact. ``raw`` keeps the JSON exactly as read (for the site and diffs)."""

    id: str
    title: str
    origin: str
    provenance: dict[str, Any]
    columns: list[Column]
    rows: list[list[Any]]
    notes: str | None = None
    compare: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None
    path: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    # --- lookups -------------------------------------------------------------------------
    def column_index(self, name: str) -> int:
        for i, col in enumerate(self.columns):
            if col.name == name:
                return i
        raise KeyError(
            f"{self.path or self.id}: columns: no column {name!r}; "
            f"valid: {', '.join(c.name for c in self.columns)}"
        )

    def row(self, key: str | int) -> list[Any]:
        """A row by its first-column value, or by index when ``key`` is an int."""
        if isinstance(key, int):
            try:
                return self.rows[key]
            except IndexError:
                raise KeyError(f"{self.path or self.id}: rows: no row {key}; there are {len(self.rows)}") from None
        for row in self.rows:
            if str(row[0]) == key:
                return row
        raise KeyError(
            f"{self.path or self.id}: rows: no row whose {self.columns[0].name!r} is {key!r}; "
            f"valid: {', '.join(repr(str(r[0])) for r in self.rows)}"
        )

    def value(self, row: str | int, column: str) -> Any:
        return self.row(row)[self.column_index(column)]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "id": self.id,
            "title": self.title,
            "origin": self.origin,
            "provenance": self.provenance,
            "columns": [
                {k: v for k, v in (("name", c.name), ("unit", c.unit), ("type", c.type), ("format", c.format),
                                   ("digits", c.digits))
                 if k not in ("format", "digits") or v is not None}
                for c in self.columns
            ],
            "rows": self.rows,
        }
        for key in TOP_LEVEL_OPTIONAL:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


# --- validation -------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def leaves(value: Any, field: str = "") -> list[tuple[str, Any]]:
    """Every non-container value under ``value`` (dicts and lists, nested), with its field path."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{field}.{k}")]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{field}[{i}]")]
    return [(field, value)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Checker:
    def __init__(self, path: str | Path):
        self.path = path

    def fail(self, field_path: str, message: str) -> None:
        raise ArtifactError(self.path, field_path, message)

    def keys(self, obj: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(obj, dict):
            self.fail(where, f"expected an object, got {_type_name(obj)}")
        for key in required:
            if key not in obj:
                self.fail(f"{where}.{key}" if where != "(top level)" else key, "missing (required)")
        unknown = sorted(set(obj) - set(required) - set(optional))
        if unknown:
            allowed = ", ".join(required + optional)
            self.fail(f"{where}.{unknown[0]}" if where != "(top level)" else unknown[0],
                      f"unknown field; allowed here: {allowed}")
        return obj

    def string(self, value: Any, where: str, *, nullable: bool = False) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str) or not value.strip():
            kind = "a non-empty string" + (" or null" if nullable else "")
            self.fail(where, f"expected {kind}, got {_type_name(value)} {value!r}")

    def string_or_int(self, value: Any, where: str) -> None:
        if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return
        self.fail(where, f"expected a string, an integer or null, got {_type_name(value)}")


def validate(data: Any, path: str | Path = "<artifact>") -> Artifact:
    """Check ``data`` (parsed JSON) against the schema and return an :class:`Artifact`.

    Raises :class:`ArtifactError` naming ``path`` and the first offending field.
    """
    c = _Checker(path)
    c.keys(data, "(top level)", TOP_LEVEL_REQUIRED, TOP_LEVEL_OPTIONAL)
    if data["schema"] != SCHEMA_VERSION:
        c.fail("schema", f"expected {SCHEMA_VERSION}, got {data['schema']!r}")

    c.string(data["id"], "id")
    if not _ID_RE.match(data["id"]):
        c.fail("id", f"{data['id']!r} is not '<area>/<name>' in lower case (letters, digits, '.', '_', '-')")
    if isinstance(path, Path) or (isinstance(path, str) and path.endswith(".json")):
        expected = _id_from_path(Path(path))
        if expected is not None and expected != data["id"]:
            c.fail("id", f"{data['id']!r} does not match the file's place under results/ ({expected!r})")
    c.string(data["title"], "title")
    if data["origin"] not in ORIGINS:
        c.fail("origin", f"{data['origin']!r} is not one of {', '.join(ORIGINS)}")

    prov = c.keys(data["provenance"], "provenance", PROVENANCE_REQUIRED, PROVENANCE_OPTIONAL)
    c.string(prov["source"], "provenance.source")
    c.string(prov["date"], "provenance.date")
    if not _DATE_RE.match(prov["date"]):
        c.fail("provenance.date", f"expected YYYY-MM-DD, got {prov['date']!r}")
    for key in ("model", "weights", "quantization"):
        c.string(prov[key], f"provenance.{key}", nullable=True)
    c.string_or_int(prov["threads"], "provenance.threads")
    c.string(prov["command"], "provenance.command", nullable=True)
    if data["origin"] in ("measured", "computed") and prov["command"] is None:
        c.fail("provenance.command", f"a {data['origin']} artifact must name the command that regenerates it")
    if data["origin"] == "measured":
        for key in ("repo", "packages", "argv"):
            if key not in prov:
                c.fail(f"provenance.{key}", "missing (required for measured artifacts; use provenance capture)")
        run = prov.get("run")
        if not isinstance(run, dict) or not _is_number(run.get("peak_rss_mib")):
            c.fail("provenance.run.peak_rss_mib", "missing or not a number (a measured artifact states the peak "
                   "memory of the process that measured it; use provenance capture)")
        for key in ("host_steal_share", "host_other_busy_share"):
            value = run.get(key)
            if value is not None and not (_is_number(value) and 0 <= value <= 1):
                c.fail(f"provenance.run.{key}", f"expected a fraction between 0 and 1 or null, got {value!r}")
        clock = run.get("core_clock_ghz")
        if clock is not None:
            if not isinstance(clock, dict) or set(clock) != {"start", "end"}:
                c.fail("provenance.run.core_clock_ghz", f"expected {{'start': GHz, 'end': GHz}}, got {clock!r}")
            for key, value in clock.items():
                if value is not None and not (_is_number(value) and value > 0):
                    c.fail(f"provenance.run.core_clock_ghz.{key}", f"expected GHz > 0 or null, got {value!r}")
        trips = run.get("core_round_trip_ns")
        if trips is not None:
            for field, value in leaves(trips, "provenance.run.core_round_trip_ns"):
                if value is not None and not (_is_number(value) and value > 0):
                    c.fail(field, f"expected a round trip in ns > 0 or null, got {value!r}")

    host = c.keys(prov["host"], "provenance.host", HOST_REQUIRED, HOST_OPTIONAL)
    c.string(host["cpu"], "provenance.host.cpu", nullable=True)
    c.string(host["gpu"], "provenance.host.gpu", nullable=True)
    if "cpu_id" in host:
        c.string(host["cpu_id"], "provenance.host.cpu_id", nullable=True)
    c.string_or_int(host["cores_used"], "provenance.host.cores_used")
    if host["isa"] is not None and (
        not isinstance(host["isa"], list) or not all(isinstance(x, str) for x in host["isa"])
    ):
        c.fail("provenance.host.isa", f"expected a list of strings or null, got {_type_name(host['isa'])}")
    if host["memory_gib"] is not None and not _is_number(host["memory_gib"]):
        c.fail("provenance.host.memory_gib", f"expected a number or null, got {_type_name(host['memory_gib'])}")

    builds = prov["builds"]
    if not isinstance(builds, dict):
        c.fail("provenance.builds", f"expected an object, got {_type_name(builds)}")
    for name, version in builds.items():
        c.string(version, f"provenance.builds.{name}", nullable=True)
    if "repo" in prov:
        repo = c.keys(prov["repo"], "provenance.repo", ("sha", "dirty"), ("diff_sha256", "changed"))
        c.string(repo["sha"], "provenance.repo.sha", nullable=True)
        if repo["dirty"] is not None and not isinstance(repo["dirty"], bool):
            c.fail("provenance.repo.dirty", f"expected true, false or null, got {_type_name(repo['dirty'])}")
        if repo["dirty"] is not True and ("diff_sha256" in repo or "changed" in repo):
            c.fail("provenance.repo", "diff_sha256 and changed describe a dirty tree; dirty is not true")
        if "diff_sha256" in repo:
            digest = repo["diff_sha256"]
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                           and all(ch in "0123456789abcdef" for ch in digest)):
                c.fail("provenance.repo.diff_sha256", f"expected 64 lowercase hex digits or null, got {digest!r}")
        if "changed" in repo and not (isinstance(repo["changed"], list)
                                      and all(isinstance(x, str) for x in repo["changed"])):
            c.fail("provenance.repo.changed", "expected a list of strings")
    if "argv" in prov and not (isinstance(prov["argv"], list) and all(isinstance(a, str) for a in prov["argv"])):
        c.fail("provenance.argv", "expected a list of strings")
    for key in ("packages", "run"):
        if key in prov and not isinstance(prov[key], dict):
            c.fail(f"provenance.{key}", f"expected an object, got {_type_name(prov[key])}")

    columns = data["columns"]
    if not isinstance(columns, list) or not columns:
        c.fail("columns", "expected a non-empty list")
    parsed_columns: list[Column] = []
    seen: set[str] = set()
    for i, col in enumerate(columns):
        where = f"columns[{i}]"
        c.keys(col, where, ("name", "unit", "type"), ("format", "digits"))
        c.string(col["name"], f"{where}.name")
        c.string(col["unit"], f"{where}.unit", nullable=True)
        if col["type"] not in COLUMN_TYPES:
            c.fail(f"{where}.type", f"{col['type']!r} is not one of {', '.join(COLUMN_TYPES)}")
        if col["name"] in seen:
            c.fail(f"{where}.name", f"duplicate column name {col['name']!r}")
        seen.add(col["name"])
        fmt = col.get("format")
        if fmt is not None:
            c.string(fmt, f"{where}.format")
            try:
                format(1.5, fmt)
            except ValueError:
                c.fail(f"{where}.format", f"{fmt!r} is not a Python format spec for numbers")
        digits = col.get("digits")
        if digits is not None:
            if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= MAX_DIGITS:
                c.fail(f"{where}.digits", f"expected a whole number of significant figures from 1 to {MAX_DIGITS}, "
                       f"got {_type_name(digits)} {digits!r}")
            if col["type"] != "number":
                c.fail(f"{where}.digits", f"a {col['type']} column has no figures to round")
            if fmt is not None:
                c.fail(f"{where}.digits", "give format or digits, not both (format already fixes the figures)")
        parsed_columns.append(Column(col["name"], col["unit"], col["type"], fmt, digits))

    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        c.fail("rows", "expected a non-empty list of rows")
    for r, row in enumerate(rows):
        if not isinstance(row, list):
            c.fail(f"rows[{r}]", f"expected a list, got {_type_name(row)}")
        if len(row) != len(parsed_columns):
            c.fail(f"rows[{r}]", f"has {len(row)} cells but there are {len(parsed_columns)} columns")
        for j, (cell, col) in enumerate(zip(row, parsed_columns)):
            where = f"rows[{r}][{j}] ({col.name})"
            if cell is None:
                continue
            if col.type == "number" and not _is_number(cell):
                c.fail(where, f"expected a number or null in numeric column, got {_type_name(cell)} {cell!r}")
            if col.type == "text" and not isinstance(cell, str):
                c.fail(where, f"expected a string or null in text column, got {_type_name(cell)}")
            if col.type == "bool" and not isinstance(cell, bool):
                c.fail(where, f"expected true, false or null, got {_type_name(cell)}")

    c.string(data.get("notes"), "notes", nullable=True)
    if "compare" in data:
        cmp_ = c.keys(data["compare"], "compare", (), ("tolerance", "columns", "key_columns"))
        tol = cmp_.get("tolerance")
        if tol is not None and (not _is_number(tol) or tol <= 0):
            c.fail("compare.tolerance", f"expected a positive number, got {tol!r}")
    if "extra" in data and not isinstance(data["extra"], dict):
        c.fail("extra", f"expected an object, got {_type_name(data['extra'])}")

    return Artifact(
        id=data["id"], title=data["title"], origin=data["origin"], provenance=prov,
        columns=parsed_columns, rows=rows, notes=data.get("notes"), compare=data.get("compare"),
        extra=data.get("extra"), path=Path(path) if not isinstance(path, Path) else path, raw=data,
    )


def _id_from_path(path: Path) -> str | None:
    """``.../results/a/b.json`` -> ``a/b``; None when the file is not under a results/ folder."""
    parts = path.parts
    if "results" not in parts:
        return None
    idx = len(parts) - 1 - parts[::-1].index("results")
    rel = parts[idx + 1:]
    if not rel:
        return None
    return "/".join(rel)[: -len(".json")] if rel[-1].endswith(".json") else None


class _NotJsonNumber(ValueError):
    """NaN or Infinity: Python's json reads them, JSON itself (and the site's readers) does not."""


def _not_json(name: str) -> None:
    raise _NotJsonNumber(name)


def load_file(path: str | Path) -> Artifact:
    """Read and validate one artifact file; invalid JSON is reported with its line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(path, "(file)", f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ArtifactError(path, "(file)", "not UTF-8 text, so not an artifact") from None
    try:
        data = json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise ArtifactError(path, "(json)", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except _NotJsonNumber as exc:
        raise ArtifactError(path, "(json)", f"{exc} is not a JSON number (NaN and infinities cannot be figures)"
                            ) from None
    return validate(data, path)
