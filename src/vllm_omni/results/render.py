"""Artifacts as DataFrames and as Markdown tables (no ``tabulate`` needed)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Sequence

from .schema import Artifact, Column

if TYPE_CHECKING:  # pandas is imported only when a DataFrame is asked for
    import pandas as pd

ORIGIN_LABELS = {
    "transcribed": "transcribed from a published source",
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


DEFAULT_DIGITS = 3  # significant figures of a float shown without a stated precision


def round_figure(value: float, digits: int = DEFAULT_DIGITS) -> str:
    """``value`` to at most ``digits`` significant figures, in fixed notation.

    The rule: a float is rounded to ``digits`` significant figures, but never loses a digit
    left of the decimal point, and never shows more decimals than the artifact holds. So
    ``17.564`` -> ``17.6``, ``0.04512`` -> ``0.0451``, ``123.4`` -> ``123``, ``1234.56`` ->
    ``1235``, ``12345.6`` -> ``12,346`` (thousands are grouped from 10,000, as for integers);
    ``5.3`` stays ``5.3`` and ``2.0`` is ``2`` (no zeros padded on), while ``17.96`` is
    ``18.0`` (the zero is the rounding's). There is no scientific notation: ``0.000012345``
    is ``0.0000123``.
    """
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    held = max(-Decimal(repr(value)).normalize().as_tuple().exponent, 0)  # 5.3: 1, 2.0: 0
    decimals = min(max(digits - 1 - magnitude, 0), held)
    if decimals and abs(round(value, decimals)) >= 10 ** (magnitude + 1):
        decimals -= 1  # 9.996 rounds to 10.0, not 10.00: still three figures
    if abs(round(value, decimals)) >= 10_000:
        return f"{value:,.{decimals}f}"
    return f"{value:.{decimals}f}"


def format_cell(value: Any, column: Column, digits: int | None = None) -> str:
    """One cell as text: ``null`` shows as an em dash, numbers keep their meaning.

    An integer is a count and is never rounded (``1,234``). A float is rounded by
    :func:`round_figure` to ``digits`` significant figures when given (a directive's
    ``digits=``), else by the column's ``format`` (a Python format spec) or ``digits``, else to
    :data:`DEFAULT_DIGITS`.
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if digits is None and column.format:
            return format(value, column.format)
        if isinstance(value, int):
            return f"{value:,}"
        return round_figure(value, digits or column.digits or DEFAULT_DIGITS)
    return str(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def select_columns(artifact: Artifact, names: Sequence[str] | None) -> list[int]:
    if not names:
        return list(range(len(artifact.columns)))
    return [artifact.column_index(n) for n in names]


def markdown_table(artifact: Artifact, columns: Sequence[str] | None = None, digits: int | None = None) -> str:
    """A GitHub/Python-Markdown pipe table; units go into the header.

    ``digits`` (a table directive's ``digits=``) rounds every float to that many significant
    figures, over the columns' own precision."""
    idx = select_columns(artifact, columns)
    cols = [artifact.columns[i] for i in idx]
    header = "| " + " | ".join(_escape(c.label) for c in cols) + " |"
    align = "|" + "|".join("---:" if c.type == "number" else ":---" for c in cols) + "|"
    lines = [header, align]
    for row in artifact.rows:
        lines.append("| " + " | ".join(_escape(format_cell(row[i], artifact.columns[i], digits)) for i in idx) + " |")
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
