"""The exported predictor pass, and each engine's run of it, against the eager reference.

Tolerances, and why:

- the export vs the eager reference (fp32, full 5-block stack): the same ops in another order
  (explicit GQA matmuls instead of SDPA), so logits differ by float rounding only (observed
  ~2e-6 on logits of magnitude ~2); we allow 1e-4 absolute + 1e-4 relative, as for the
  fused kernels (tests/test_native_predictor.py).
- each engine's fp32 run vs the torch export: the same graph with another summation order
  and kernels (observed <= 1.5e-6 relative L2); same 1e-4 + 1e-4 bound.
- quantized formats report agreement, not equality: relative L2 error of the logits against
  the fp32 export. With these random weights one block in int8 gives ~1 %, int4 (groups of
  32) ~10 %; the bounds, 5 % and 30 %, catch a broken quantization (a wrong scale or layout
  gives errors of order 1) without pinning an engine's rounding.

Engine runs use a one-block stack (the shapes of one published block, 8 KV positions) to keep
conversions short; the benchmark runs all five.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from vllm_omni.cpu.weights import random_predictor_weights  # noqa: E402
from vllm_omni.engines import EngineUnsupported  # noqa: E402
from vllm_omni.engines.export import PredictorPass, example_inputs, fingerprint, reference_pass  # noqa: E402
from vllm_omni.models import get_model  # noqa: E402

SPEC = get_model("0.6B")
POSITION = 8
FP32_ATOL = FP32_RTOL = 1e-4
QUANT_MAX_REL_L2 = {"int8": 0.05, "int4": 0.30}
ENGINE_MODULES = ("onnxrt", "openvino_rt", "executorch_rt", "mnn_rt", "ncnn_rt")


def rel_l2(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64).reshape(-1), np.asarray(ref, dtype=np.float64).reshape(-1)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def full_weights():
    return random_predictor_weights(SPEC, seed=0)


@pytest.fixture(scope="module")
def one_block():
    return random_predictor_weights(SPEC, seed=0, layers=1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def export_logits(one_block):
    with torch.no_grad():
        return PredictorPass(one_block, POSITION).eval()(*example_inputs(one_block, POSITION))[0].numpy()


# --- the export itself (torch only) -------------------------------------------------------

@torch.no_grad()
def test_export_matches_eager_reference(full_weights):
    x, past_k, past_v = example_inputs(full_weights, POSITION)
    logits, new_k, new_v = PredictorPass(full_weights, POSITION).eval()(x, past_k, past_v)
    ref = reference_pass(full_weights, x, past_k, past_v)
    assert logits.shape == (1, SPEC.codebook_size)
    torch.testing.assert_close(logits, ref, atol=FP32_ATOL, rtol=FP32_RTOL)
    assert new_k.shape == new_v.shape == (SPEC.predictor.layers, SPEC.predictor.kv_heads, 1, SPEC.predictor.head_dim)


@torch.no_grad()
def test_export_new_kv_is_what_the_reference_caches(full_weights):
    from vllm_omni.cpu.reference import ReferencePredictor

    x, past_k, past_v = example_inputs(full_weights, POSITION)
    _, new_k, new_v = PredictorPass(full_weights, POSITION).eval()(x, past_k, past_v)
    ref = ReferencePredictor(full_weights, "fp32")
    for i, cache in enumerate(ref.stack.caches):
        cache.append(past_k[i], past_v[i])
    ref.stack.forward_last(x)
    for i, cache in enumerate(ref.stack.caches):
        torch.testing.assert_close(new_k[i], cache.k[:, POSITION:POSITION + 1], atol=FP32_ATOL, rtol=FP32_RTOL)
        torch.testing.assert_close(new_v[i], cache.v[:, POSITION:POSITION + 1], atol=FP32_ATOL, rtol=FP32_RTOL)


@torch.no_grad()
def test_export_position_changes_the_result(one_block):
    """RoPE is baked in per position: the same inputs at another position give other logits."""
    x, past_k, past_v = example_inputs(one_block, POSITION)
    a = PredictorPass(one_block, POSITION)(x, past_k, past_v)[0]
    b = PredictorPass(one_block, POSITION + 1)(x, past_k, past_v)[0]
    assert not torch.allclose(a, b, atol=1e-3)


def test_export_rejects_bad_arguments(one_block):
    with pytest.raises(ValueError, match="position"):
        PredictorPass(one_block, 0)
    with pytest.raises(ValueError, match="head"):
        PredictorPass(one_block, POSITION, head=SPEC.residual_codebooks)
    with pytest.raises(ValueError, match="0.6B"):
        PredictorPass(random_predictor_weights(get_model("1.7B"), layers=1), POSITION)


def test_fingerprint_tells_weights_and_shapes_apart(one_block):
    other = random_predictor_weights(SPEC, seed=1, layers=1)
    assert fingerprint(one_block, POSITION) == fingerprint(one_block, POSITION)
    assert fingerprint(one_block, POSITION) != fingerprint(other, POSITION)
    assert fingerprint(one_block, POSITION) != fingerprint(one_block, POSITION + 1)


# --- the engines -----------------------------------------------------------------------------

def engine(name: str):
    import importlib

    mod = importlib.import_module(f"vllm_omni.engines.{name}")
    why = mod.unavailable()
    if why:
        pytest.skip(why)
    return mod


@pytest.mark.engines
@pytest.mark.parametrize("name", ENGINE_MODULES)
def test_engine_fp32_equals_torch_export(name, one_block, workdir, export_logits):
    mod = engine(name)
    runner = mod.prepare(one_block, fmt="fp32", threads=1, workdir=workdir, position=POSITION)
    got = np.asarray(runner.logits(), dtype=np.float32).reshape(1, -1)
    np.testing.assert_allclose(got, export_logits, atol=FP32_ATOL, rtol=FP32_RTOL)
    runner.run_once()  # the timed call runs too
    assert runner.model_bytes > 4 * SPEC.codebook_size * SPEC.predictor.hidden  # at least the head in fp32
    versions = mod.versions()
    assert versions and all(v is None or isinstance(v, str) for v in versions.values())


@pytest.mark.engines
@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("name", ["onnxrt", "openvino_rt", "executorch_rt", "mnn_rt"])
def test_engine_quantized_agrees_with_torch_export(name, fmt, one_block, workdir, export_logits):
    mod = engine(name)
    runner = mod.prepare(one_block, fmt=fmt, threads=1, workdir=workdir, position=POSITION)
    err = rel_l2(runner.logits(), export_logits)
    assert 0 < err < QUANT_MAX_REL_L2[fmt], f"{mod.NAME} {fmt}: relative L2 error {err:.3g}"
    fp32_bytes = mod.prepare(one_block, fmt="fp32", threads=1, workdir=workdir, position=POSITION).model_bytes
    assert runner.model_bytes < (0.4 if fmt == "int8" else 0.25) * fp32_bytes  # the file holds low-bit weights


@pytest.mark.engines
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_ncnn_says_why_it_has_no_quantized_path(fmt, one_block, workdir):
    mod = engine("ncnn_rt")
    with pytest.raises(EngineUnsupported, match="ncnn"):
        mod.prepare(one_block, fmt=fmt, threads=1, workdir=workdir, position=POSITION)


@pytest.mark.engines
@pytest.mark.parametrize("name", ENGINE_MODULES)
def test_engine_rejects_bad_format_and_threads(name, one_block, workdir):
    mod = engine(name)
    with pytest.raises(ValueError, match="weight format"):
        mod.prepare(one_block, fmt="fp8", threads=1, workdir=workdir, position=POSITION)
    with pytest.raises(ValueError, match="threads"):
        mod.prepare(one_block, fmt="fp32", threads=0, workdir=workdir, position=POSITION)


@pytest.mark.engines
def test_mnn_gets_its_memory_mode_as_the_integer_its_binding_reads(one_block, workdir, monkeypatch):
    """MNN's Python binding reads the memory mode only as an integer and ignores a name such as
    "low" without a word; quantized runs must pass its low mode (2), fp32 the normal one (0)."""
    import MNN.nn as nn

    seen = []
    real = nn.create_runtime_manager
    monkeypatch.setattr(nn, "create_runtime_manager", lambda configs: seen.append(dict(configs[0])) or real(configs))
    settings = [engine("mnn_rt").prepare(one_block, fmt=fmt, threads=1, workdir=workdir, position=POSITION).settings
                for fmt in ("fp32", "int4")]
    assert [c["memory"] for c in seen] == [0, 2] and all(type(c["memory"]) is int for c in seen)
    assert "memory=normal (0)" in settings[0] and "memory=low (2)" in settings[1]


@pytest.mark.engines
def test_engines_use_exactly_the_threads_asked_for(one_block, workdir):
    ort = engine("onnxrt").prepare(one_block, fmt="fp32", threads=2, workdir=workdir, position=POSITION)
    assert ort.session.get_session_options().intra_op_num_threads == 2
    ov = engine("openvino_rt").prepare(one_block, fmt="fp32", threads=2, workdir=workdir, position=POSITION)
    assert int(ov.compiled.get_property("INFERENCE_NUM_THREADS")) == 2
    assert str(ov.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    nc = engine("ncnn_rt").prepare(one_block, fmt="fp32", threads=2, workdir=workdir, position=POSITION)
    assert nc.net.opt.num_threads == 2 and not nc.net.opt.use_fp16_storage
    et = engine("executorch_rt").prepare(one_block, fmt="fp32", threads=1, workdir=workdir, position=POSITION)
    assert et.threads == 1


def test_openvino_weight_compression_quantizes_symmetrically():
    """The int8/int4 rewrite's quantizer (numpy only): round trip within half a step per weight."""
    from vllm_omni.engines.openvino_rt import INT4_GROUP, _quantize

    w = np.random.default_rng(0).normal(0, 0.02, size=(64, 48)).astype(np.float32)  # [K, N]
    q8, s8 = _quantize(w, "int8")
    assert q8.dtype == np.int8 and q8.shape == (48, 64) and np.abs(q8).max() == 127
    assert np.all(np.abs(q8 * s8 - w.T) <= s8 / 2 + 1e-7)
    q4, s4 = _quantize(w, "int4")
    assert q4.shape == (48, 64 // INT4_GROUP, INT4_GROUP) and q4.min() >= -8 and q4.max() <= 7
    assert np.all(np.abs((q4 * s4).reshape(48, 64) - w.T) <= np.repeat(s4, INT4_GROUP, axis=2).reshape(48, 64) / 2 + 1e-7)
    with pytest.raises(ValueError, match="divisible"):
        _quantize(w[:40], "int4")


# --- the benchmark command ----------------------------------------------------------------------

def test_bench_rejects_unknown_engines_and_formats():
    from vllm_omni.bench.cli import main

    assert main(["engines", "--engines", "tflite", "--output", "/nonexistent"]) == 2
    assert main(["engines", "--weights", "fp16", "--output", "/nonexistent"]) == 2


def test_relative_error():
    from vllm_omni.bench.engines import relative_error

    assert relative_error([3.0, 4.0], [3.0, 4.0]) == 0
    assert relative_error([3.0, 4.0], [0.0, 5.0]) == pytest.approx(np.sqrt(10) / 5)
    with pytest.raises(ValueError, match="shape"):
        relative_error([1.0], [1.0, 2.0])


@pytest.mark.engines
def test_bench_records_an_unsupported_format_with_its_reason(tmp_path):
    from vllm_omni.bench.cli import main
    from vllm_omni.results.schema import load_file

    assert main(["engines", "--quick", "--engines", "ncnn", "--weights", "int8", "--threads", "1",
                 "--output", str(tmp_path)]) == 0
    art = load_file(tmp_path / "engines" / "cross-engine-t1-quick.json")
    assert [r[0] for r in art.rows] == ["this project int8", "ncnn int8"]
    ours, ncnn = art.rows
    assert ours[art.column_index("pass median")] > 0
    assert ours[art.column_index("logit error vs torch fp32")] < QUANT_MAX_REL_L2["int8"]
    assert ncnn[art.column_index("pass median")] is None
    assert "ncnn2int8" in ncnn[art.column_index("not run because")]
    assert art.provenance["builds"]["ncnn"] is not None
    json.dumps(art.raw)  # serialisable as written
