"""The machinery every CPU patch shares: find the target, check its behaviour, swap atomically.

A patch replaces one or more attributes of vLLM classes (a platform or worker method). It

1. resolves its targets by importing them (a missing module or attribute refuses the patch),
2. checks that the behaviour it fixes is present, by reading the target's code (a target
   that no longer does what the patch expects refuses the patch; no version strings),
3. builds every replacement before touching anything, then swaps them all; if one swap
   fails, the ones already made are undone, so a patch is either fully applied or not at all,
4. logs what it did, and can be reverted (tests do this).

Refusing raises :class:`PatchRefused` from :meth:`Patch.apply` with nothing changed;
:func:`vllm_omni.patches.apply_all` turns that into a logged warning so that a vLLM release
that fixed (or moved) a behaviour keeps working without the patch.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("vllm_omni.patches")

MARK = "__vllm_omni_patch__"


class PatchRefused(RuntimeError):
    """The patch's target is missing or behaves differently; nothing was changed."""

    def __init__(self, patch: str, reason: str):
        self.patch = patch
        self.reason = reason
        super().__init__(f"patch {patch!r} refused: {reason}; nothing was changed")


@dataclass
class Target:
    """One attribute to replace: ``owner.attr`` where owner is a class or module."""

    module: str
    owner: str | None  # class name inside ``module``; None means the module itself
    attr: str

    @property
    def qualname(self) -> str:
        return ".".join(x for x in (self.module, self.owner, self.attr) if x)

    def resolve(self, patch: str) -> tuple[Any, Any]:
        """(owner object, raw attribute as stored on it) or PatchRefused."""
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            raise PatchRefused(patch, f"cannot import {self.module} ({exc})") from None
        owner = mod
        if self.owner is not None:
            owner = getattr(mod, self.owner, None)
            if owner is None:
                raise PatchRefused(patch, f"{self.module} has no {self.owner}")
        raw = owner.__dict__.get(self.attr) if isinstance(owner, type) else getattr(owner, self.attr, None)
        if raw is None:
            raise PatchRefused(patch, f"{self.qualname} does not exist")
        return owner, raw


def function_of(raw: Any) -> Callable:
    """The plain function behind a stored attribute (unwraps classmethod/staticmethod)."""
    return raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw


def source_tree(patch: str, func: Callable) -> ast.AST:
    """The parsed source of ``func``; PatchRefused when it cannot be read."""
    try:
        src = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise PatchRefused(patch, f"cannot read the code of {getattr(func, '__qualname__', func)} ({exc})") from None
    return ast.parse(src)


def assigns_attribute(tree: ast.AST, attr: str, *, on: str | None = None) -> bool:
    """Whether the code assigns ``<x>.attr = ...`` (``on`` restricts ``<x>`` to that name)."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == attr:
                if on is None or (isinstance(t.value, ast.Name) and t.value.id == on):
                    return True
    return False


def mentions_string(tree: ast.AST, text: str) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(tree))


def reads_attribute(tree: ast.AST, attr: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))


def compares_is_none(tree: ast.AST, attr: str) -> bool:
    """Whether the code tests ``<x>.attr is None``."""
    for n in ast.walk(tree):
        if (isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == attr
                and any(isinstance(op, ast.Is) for op in n.ops)
                and any(isinstance(c, ast.Constant) and c.value is None for c in n.comparators)):
            return True
    return False


class Patch:
    """Base class. Subclasses set ``name``, ``summary``, ``targets`` and implement
    :meth:`check` and :meth:`build`."""

    name: str = ""
    summary: str = ""
    targets: tuple[Target, ...] = ()

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attr, original raw value)

    # --- to implement ------------------------------------------------------------------
    def check(self, originals: dict[str, Any]) -> None:
        """Raise PatchRefused unless the behaviour to fix is present. ``originals`` maps
        each target's attr-qualname to its raw stored value."""
        raise NotImplementedError

    def build(self, originals: dict[str, Any]) -> dict[str, Any]:
        """The replacement raw values, keyed like ``originals``."""
        raise NotImplementedError

    # --- state -------------------------------------------------------------------------
    @property
    def applied(self) -> bool:
        if self._saved:
            return True
        # Applied by another instance (e.g. after a module reload): our mark is on the target.
        for t in self.targets:
            try:
                _, raw = t.resolve(self.name)
            except PatchRefused:
                return False
            if getattr(function_of(raw), MARK, None) != self.name:
                return False
        return bool(self.targets)

    def probe(self) -> str | None:
        """None if the patch could be applied now, else the reason it would be refused."""
        if self.applied:
            return None
        try:
            self.check(self._resolve()[1])
        except PatchRefused as exc:
            return exc.reason
        return None

    def _resolve(self) -> tuple[dict[str, Any], dict[str, Any]]:
        owners, originals = {}, {}
        for t in self.targets:
            owner, raw = t.resolve(self.name)
            if getattr(function_of(raw), MARK, None) is not None:
                raise PatchRefused(self.name, f"{t.qualname} is already replaced by patch {getattr(function_of(raw), MARK)!r}")
            owners[t.qualname], originals[t.qualname] = owner, raw
        return owners, originals

    # --- apply / revert ----------------------------------------------------------------
    def apply(self) -> bool:
        """Apply once. Returns True if it changed something, False if it was already applied."""
        if self.applied:
            logger.debug("patch %s: already applied", self.name)
            return False
        owners, originals = self._resolve()
        self.check(originals)
        replacements = self.build(originals)
        if set(replacements) != set(originals):
            raise PatchRefused(self.name, "internal error: replacements do not match the targets")
        for key, new in replacements.items():
            setattr(function_of(new), MARK, self.name)
        done: list[tuple[Any, str, Any]] = []
        try:
            for t in self.targets:
                owner = owners[t.qualname]
                setattr(owner, t.attr, replacements[t.qualname])
                done.append((owner, t.attr, originals[t.qualname]))
        except Exception:
            for owner, attr, raw in reversed(done):
                setattr(owner, attr, raw)
            raise
        self._saved = done
        logger.info("vllm_omni patch %s applied: %s (replaced %s)", self.name, self.summary,
                    ", ".join(t.qualname for t in self.targets))
        return True

    def revert(self) -> bool:
        """Put the originals back. Returns False if the patch was not applied by this object."""
        if not self._saved:
            return False
        for owner, attr, raw in reversed(self._saved):
            setattr(owner, attr, raw)
        self._saved = []
        logger.info("vllm_omni patch %s reverted", self.name)
        return True
