"""llama.cpp running our GGUF export computes what our eager reference computes.

The key check: with F32 weights, an F32 KV cache and flash attention off, llama.cpp's logits
for a token sequence equal the eager reference's for the same embedding rows to float
rounding (observed ~2e-6 on logits of magnitude ~3; we allow 1e-4 absolute + 1e-4 relative).
That pins the layout: no q/k permutation, NEOX-style RoPE, q/k norms, GQA, SwiGLU, the head.

Other tolerances, and why:

- llama.cpp's defaults (F16 KV cache, flash attention on the CPU, which rounds through F16):
  observed ~1e-3; we allow 1 % of the largest |logit|.
- Q8_0/Q4_0: the reference runs the same weights quantized and dequantized by gguf.quants,
  so the only extra error is llama.cpp quantizing activations to 8 bits per block (as our
  int8/int4 kernels do): we allow 5 % of the largest |logit| (max) and 1 % (mean), the
  bounds of tests/test_native_predictor.py.
"""

from __future__ import annotations

import json

import pytest

from vllm_omni.engines import EngineUnsupported

torch = pytest.importorskip("torch")

from vllm_omni.cpu.reference import ReferenceStack, make_linear  # noqa: E402
from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights  # noqa: E402
from vllm_omni.engines.gguf_export import GGUF_TYPES, gguf_type  # noqa: E402
from vllm_omni.models import MODELS, predictor_pass_bytes  # noqa: E402

SPEC = MODELS["0.6B"]
TOKENS = [5, 100, 2000, 7, 42, 1500, 3, 999]
FP32_ATOL = FP32_RTOL = 1e-4
DEFAULTS_REL = 0.01
QUANT_MAX_REL, QUANT_MEAN_REL = 0.05, 0.01


def test_format_names():
    assert [gguf_type(f) for f in ("fp32", "fp16", "int8", "int4")] == ["F32", "F16", "Q8_0", "Q4_0"]
    with pytest.raises(ValueError, match="valid: fp32, fp16, int8, int4"):
        gguf_type("bf16")


def test_module_import_is_light():
    import subprocess
    import sys

    code = ("import sys, vllm_omni.engines.llamacpp, vllm_omni.engines.gguf_export, vllm_omni.bench.llamacpp;"
            "print(','.join(m for m in ('llama_cpp', 'gguf', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


# --- everything below needs llama-cpp-python and gguf ---------------------------------------------

engines = pytest.mark.engines


@pytest.fixture(scope="module")
def pweights():
    return random_predictor_weights(SPEC, seed=0)  # the full 5-layer stack


def reference_logits(layers, norm, stack, head, inputs) -> torch.Tensor:
    """Eager logits of each position when ``inputs`` [T, H] are fed one token at a time."""
    st = ReferenceStack(layers, norm, stack, "fp32", len(inputs))
    lin = make_linear(head, "fp32")
    out = []
    with torch.inference_mode():
        for i in range(len(inputs)):
            out.append(lin(st.forward_last(inputs[i:i + 1].float()))[0])
    return torch.stack(out)


def llama_logits(path, tokens, *, batch: bool, **kw) -> torch.Tensor:
    from vllm_omni.engines.llamacpp import LlamaCppModel

    m = LlamaCppModel(path, threads=1, n_ctx=64, **kw)
    try:
        if batch:
            m.decode(tokens, 0, all_logits=True)
            rows = [m.logits(i) for i in range(len(tokens))]
        else:
            rows = []
            for i, t in enumerate(tokens):
                m.decode([t], i)
                rows.append(m.logits())
    finally:
        m.close()
    import numpy as np

    return torch.from_numpy(np.stack(rows))


@engines
@pytest.mark.parametrize("batch", [True, False], ids=["one-batch", "token-by-token"])
def test_fp32_matches_reference(pweights, tmp_path, batch):
    from vllm_omni.engines.gguf_export import export_predictor

    g = export_predictor(pweights, tmp_path / "p.gguf", "fp32")
    got = llama_logits(g.path, TOKENS, batch=batch, kv_type="f32", flash_attn="off")
    want = reference_logits(pweights.layers, pweights.norm, SPEC.predictor, pweights.lm_head[0],
                            pweights.codec_embedding[0][TOKENS])
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=FP32_RTOL)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@engines
def test_llama_defaults_close_to_reference(pweights, tmp_path):
    from vllm_omni.engines.gguf_export import export_predictor

    g = export_predictor(pweights, tmp_path / "p.gguf", "fp32")
    got = llama_logits(g.path, TOKENS, batch=False)  # F16 KV cache, flash attention as llama.cpp picks
    want = reference_logits(pweights.layers, pweights.norm, SPEC.predictor, pweights.lm_head[0],
                            pweights.codec_embedding[0][TOKENS])
    assert (got - want).abs().max() <= DEFAULTS_REL * want.abs().max()


def _roundtrip(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """``t`` as llama.cpp sees it after gguf.quants wrote it in ``fmt``."""
    import gguf

    q = gguf.GGMLQuantizationType[GGUF_TYPES[fmt]]
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(t.float().numpy(), q), q).copy()).float()


@engines
@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
def test_quantized_matches_dequantized_reference(pweights, tmp_path, fmt):
    import dataclasses

    from vllm_omni.engines.gguf_export import export_predictor

    g = export_predictor(pweights, tmp_path / f"p-{fmt}.gguf", fmt)
    got = llama_logits(g.path, TOKENS, batch=False, kv_type="f32", flash_attn="off")
    layers = [dataclasses.replace(b, **{n: _roundtrip(m, fmt) for n, m in b.matrices().items()})
              for b in pweights.layers]
    want = reference_logits(layers, pweights.norm, SPEC.predictor, _roundtrip(pweights.lm_head[0], fmt),
                            pweights.codec_embedding[0][TOKENS])
    err = (got - want).abs()
    scale = want.abs().max()
    assert err.max() <= QUANT_MAX_REL * scale, (fmt, float(err.max()), float(scale))
    assert err.mean() <= QUANT_MEAN_REL * scale, (fmt, float(err.mean()), float(scale))


@engines
def test_projected_embedding_for_1_7b(tmp_path):
    """1.7B: token ids feed small_to_mtp_projection(codec_embedding[0][id]), as the reference does."""
    from vllm_omni.cpu.reference import ReferencePredictor
    from vllm_omni.engines.gguf_export import export_predictor

    spec = MODELS["1.7B"]
    w = random_predictor_weights(spec, seed=3, layers=1)
    g = export_predictor(w, tmp_path / "p17.gguf", "fp32")
    got = llama_logits(g.path, TOKENS[:4], batch=True, kv_type="f32", flash_attn="off")
    with torch.inference_mode():
        x = ReferencePredictor(w, "fp32")._input(w.codec_embedding[0][TOKENS[:4]])
    want = reference_logits(w.layers, w.norm, spec.predictor, w.lm_head[0], x)
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=FP32_RTOL)


@engines
def test_talker_fp32_matches_reference(tmp_path):
    from vllm_omni.engines.gguf_export import export_talker

    w = random_talker_weights(SPEC, seed=1, layers=2)
    g = export_talker(w, tmp_path / "t.gguf", "fp32")
    assert g.vocab == SPEC.codec_vocab
    ids = [2149, 0, 3071, 1024]
    got = llama_logits(g.path, ids, batch=True, kv_type="f32", flash_attn="off")
    want = reference_logits(w.layers, w.norm, SPEC.talker, w.codec_head, w.codec_embedding[ids])
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=FP32_RTOL)


@engines
def test_file_metadata_and_bytes(pweights, tmp_path):
    import gguf

    from vllm_omni.engines.gguf_export import export_predictor

    for fmt in ("fp32", "int4"):
        g = export_predictor(pweights, tmp_path / f"p-{fmt}.gguf", fmt)
        r = gguf.GGUFReader(str(g.path))
        fields = {k: f.contents() for k, f in r.fields.items() if k.startswith(("general.architecture", "qwen3."))}
        assert fields["general.architecture"] == "qwen3"
        assert fields["qwen3.block_count"] == 5
        assert fields["qwen3.attention.key_length"] == fields["qwen3.attention.value_length"] == 128
        assert fields["qwen3.rope.freq_base"] == pytest.approx(1e6)
        assert len(r.fields["tokenizer.ggml.tokens"].data) == g.vocab == SPEC.codebook_size
        assert len(r.tensors) == 3 + 11 * 5
        assert {t.name: int(t.n_bytes) for t in r.tensors} == g.tensor_bytes
        # Q4_0 stores 18 bytes per 32 weights, exactly our int4's 0.5 B + an fp16 scale per group;
        # F32 matches fp32. llama.cpp also reads one embedding row (fp32) per pass.
        assert g.token_bytes == predictor_pass_bytes(SPEC, fmt) + 4 * SPEC.predictor.hidden


@engines
def test_runner_repeats_the_same_pass(pweights, tmp_path):
    """run_once decodes at ``position`` and removes the token again, so every pass sees one cache."""
    from vllm_omni.engines import llamacpp

    r = llamacpp.prepare(pweights, fmt="int4", threads=1, workdir=tmp_path, position=8)
    try:
        m = r.model
        assert m.L.llama_memory_seq_pos_max(m.mem, 0) == 7
        outs = []
        for _ in range(3):
            r.run_once()
            assert m.L.llama_memory_seq_pos_max(m.mem, 0) == 7
            outs.append(m.logits())
        assert (outs[0] == outs[1]).all() and (outs[1] == outs[2]).all()
        m.decode([r.token], 8)  # the same token one position later would differ: position matters
        m.decode([r.token], 9)
        assert not (m.logits() == outs[0]).all()
        assert r.bytes_per_pass == r.gguf.token_bytes
    finally:
        r.close()


@engines
def test_prepare_rejects_unknown_format(pweights, tmp_path):
    from vllm_omni.engines import llamacpp

    with pytest.raises(EngineUnsupported, match="fp32, fp16, int8, int4"):
        llamacpp.prepare(pweights, fmt="bf16", threads=1, workdir=tmp_path, position=8)


@engines
def test_versions_name_the_build():
    import re

    from vllm_omni.engines import llamacpp

    v = llamacpp.versions()
    assert re.match(r"^[0-9a-f]{7,40}", v["llama.cpp"])
    assert v["llama_cpp_python"]
    assert "CPU" in v["llama.cpp system_info"]
    assert "GGML_NATIVE=" in v["llama.cpp build"]


@pytest.mark.parametrize(("info", "extra"), [
    (b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |", False),  # its AMX product crashed here
    (b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |", True),
])
def test_extra_buffers_stay_off_where_the_cpu_backend_has_amx(monkeypatch, info, extra):
    from types import SimpleNamespace

    from vllm_omni.engines import llamacpp

    monkeypatch.setattr(llamacpp, "_llama", lambda: SimpleNamespace(llama_print_system_info=lambda: info))
    assert llamacpp.default_extra_buffers() is extra


@engines
def test_a_model_records_whether_it_used_extra_buffers(pweights, tmp_path):
    from vllm_omni.engines import llamacpp
    from vllm_omni.engines.gguf_export import export_predictor

    g = export_predictor(pweights, tmp_path / "p-int4.gguf", "int4")
    default = llamacpp.LlamaCppModel(g.path, threads=1)
    off = llamacpp.LlamaCppModel(g.path, threads=1, extra_buffers=False)
    try:
        assert default.extra_buffers is llamacpp.default_extra_buffers() and off.extra_buffers is False
        for m in (default, off):  # an int4 decode runs either way (with AMX, only without extra buffers)
            m.decode(TOKENS[:2], 0)
    finally:
        default.close()
        off.close()


@engines
def test_quick_benchmark_writes_an_artifact(tmp_path):
    from vllm_omni.bench.cli import main
    from vllm_omni.results.schema import load_file

    assert main(["llamacpp", "--quick", "--threads", "1", "--suffix", "other-host", "--output", str(tmp_path)]) == 0
    path = tmp_path / "engines" / "llamacpp-predictor-t1-other-host-quick.json"  # --suffix: a second host's run
    a = load_file(path)
    assert a.origin == "measured"
    assert a.provenance["builds"]["llama.cpp"]
    assert a.rows and a.value(0, "format") == "int4" and a.value(0, "gguf type") == "Q4_0"
    assert a.value(0, "llama.cpp median") > 0 and a.value(0, "ours median") > 0
    assert 0 < a.value(0, "llama.cpp bandwidth fraction")
    assert json.loads(path.read_text())["provenance"]["run"]["kv_position"] == 8


def test_bench_rejects_bad_lists(tmp_path):
    from vllm_omni.bench.cli import main

    assert main(["llamacpp", "--formats", "fp8", "--output", str(tmp_path)]) == 2
    assert main(["llamacpp", "--parts", "vocoder", "--output", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as info:  # a bad tag never starts a run
        main(["llamacpp", "--suffix", "Other/Host", "--output", str(tmp_path)])
    assert info.value.code == 2


def test_ratio_by_round_is_not_tilted_by_a_change_of_period():
    """A bandwidth change in the middle of a row can put one engine's median in the fast period
    and the other's in the slow one; the round-by-round ratio compares calls seconds apart."""
    from vllm_omni.bench.common import median
    from vllm_omni.bench.llamacpp import _ratio_by_round

    llama = [1.0, 1.0] + [1.0, 1.0] + [2.0, 2.0]  # rounds 1-2 fast, round 3 slow
    ours = [0.8, 0.8] + [1.6, 1.6] + [1.6, 1.6]  # the host slowed down between llama.cpp and ours in round 2
    assert median(llama) / median(ours) < 1  # the medians say llama.cpp is ahead
    assert _ratio_by_round(llama, ours, rounds=3) == 1.25  # round by round, ours is ahead
