"""Artifacts as DataFrames and as Markdown tables (no ``tabulate`` needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .schema import Artifact, Column

if TYPE_CHECKING:  # pandas is imported only when a DataFrame is asked for
    import pandas as pd

ORIGIN_LABELS = {
    "transcribed": "transcribed from the study",
    "measured": "measured here",
    "computed": "computed by this package",
}


def to_frame(artifact: Artifact) -> "pd.DataFrame":
    """The rows as a DataFrame; units and provenance travel in ``df.attrs``."""
    import pandas as pd

    df = pd.DataFrame(artifact.rows, columns=[c.name for c in artifact.columns])
    df.attrs["id"] = artifact.id
    df.attrs["units"] = {c.name: c.unit for c in artifact.columns}
    df.attrs["origin"] = artifact.origin
    df.attrs["provenance"] = artifact.provenance
    return df


def format_cell(value: Any, column: Column) -> str:
    """One cell as text: ``null`` shows as an em dash, numbers keep their meaning."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if column.format:
            return format(value, column.format)
        if isinstance(value, int):
            return f"{value:,}"
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def select_columns(artifact: Artifact, names: Sequence[str] | None) -> list[int]:
    if not names:
        return list(range(len(artifact.columns)))
    return [artifact.column_index(n) for n in names]


def markdown_table(artifact: Artifact, columns: Sequence[str] | None = None) -> str:
    """A GitHub/Python-Markdown pipe table; units go into the header."""
    idx = select_columns(artifact, columns)
    cols = [artifact.columns[i] for i in idx]
    header = "| " + " | ".join(_escape(c.label) for c in cols) + " |"
    align = "|" + "|".join("---:" if c.type == "number" else ":---" for c in cols) + "|"
    lines = [header, align]
    for row in artifact.rows:
        lines.append("| " + " | ".join(_escape(format_cell(row[i], artifact.columns[i])) for i in idx) + " |")
    return "\n".join(lines)


def caption(artifact: Artifact, link: str | None = None) -> str:
    """One line under a table: title, origin, date and host, and a link to the artifact page."""
    prov = artifact.provenance
    where = prov["host"].get("cpu") or prov["host"].get("gpu")
    if prov["host"].get("cpu") and prov["host"].get("cpu_id"):
        where += f", {prov['host']['cpu_id']}"  # a VM's model name can cover several generations
    bits = [ORIGIN_LABELS[artifact.origin], prov["date"]]
    if where:
        bits.append(where)
    target = f"[`{artifact.id}`]({link})" if link else f"`{artifact.id}`"
    return f"*{_escape(artifact.title)} ({'; '.join(bits)}). Source: {target}.*"
