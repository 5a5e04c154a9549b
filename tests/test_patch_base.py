"""The patch machinery on stand-in targets (no vLLM needed): a swap that fails part way is undone."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_omni.patches._base import MARK, Patch, PatchRefused, Target


class _Refusing(type):
    """A metaclass whose classes refuse new values for ``run`` (as a slotted or frozen owner would)."""

    def __setattr__(cls, name, value):
        if name == "run" and getattr(value, MARK, None) is not None:
            raise TypeError(f"cannot replace {cls.__name__}.run")
        super().__setattr__(name, value)


@pytest.fixture
def targets(monkeypatch):
    mod = types.ModuleType("vllm_omni_test_targets")

    class First:
        def run(self):
            return "first"

    class Second:
        def run(self):
            return "second"

    class Locked(metaclass=_Refusing):
        def run(self):
            return "locked"

    for cls in (First, Second, Locked):
        setattr(mod, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def _patch(*owners: str) -> Patch:
    class Demo(Patch):
        name = "demo"
        summary = "replaces run"
        targets = tuple(Target("vllm_omni_test_targets", owner, "run") for owner in owners)

        def check(self, originals):
            pass

        def build(self, originals):
            def make():
                def run(self):
                    return "patched"
                return run
            return {key: make() for key in originals}

    return Demo()


def test_a_failed_swap_undoes_the_earlier_ones(targets):
    first, second = targets.First.__dict__["run"], targets.Second.__dict__["run"]
    patch = _patch("First", "Second", "Locked")
    with pytest.raises(TypeError, match="cannot replace Locked.run"):
        patch.apply()
    assert targets.First.__dict__["run"] is first and targets.Second.__dict__["run"] is second
    assert targets.First().run() == "first" and targets.Locked().run() == "locked"
    assert not patch.applied and patch.revert() is False  # nothing recorded as applied


def test_the_same_patch_without_the_failing_target_applies_and_reverts(targets):
    first = targets.First.__dict__["run"]
    patch = _patch("First", "Second")
    assert patch.apply() is True
    assert targets.First().run() == targets.Second().run() == "patched" and patch.applied
    assert patch.revert() is True and targets.First.__dict__["run"] is first


def test_a_missing_target_refuses_before_any_swap(targets):
    first = targets.First.__dict__["run"]
    patch = _patch("First", "Absent")
    with pytest.raises(PatchRefused, match="has no Absent; nothing was changed"):
        patch.apply()
    assert targets.First.__dict__["run"] is first and not patch.applied
