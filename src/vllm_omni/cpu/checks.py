"""One check for the counts the CPU path takes from its callers (threads, positions, frames,
top-k): a whole number in range, or a ValueError that names the argument and what it got."""

from __future__ import annotations

import operator


def whole_number(name: str, value: object, least: int = 1, most: int | None = None) -> int:
    """``value`` as an int in ``least..most``: any integer type (numpy's too), never a bool or a float."""
    try:
        n = operator.index(value)
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or n < least or (most is not None and n > most):
        span = f">= {least}" if most is None else f"in {least}..{most}"
        raise ValueError(f"{name} must be a whole number {span}, got {value!r}")
    return n
