"""The native kernels against the eager reference: fused predictor frame, single pass, talker step.

Tolerances, and why:

- fp32: the kernels and torch sum in different orders (vector FMAs vs MKL), so logits and
  hidden states differ by float rounding only (observed ~2e-6 on logits of magnitude ~3); we
  allow 1e-4 absolute + 1e-4 relative. Greedy codes must be identical: the top-2 gap of these
  random weights is ~0.1, five orders above that rounding.
- int8/int4: the kernels quantize activations to int8 in blocks of 32 (scale max|x|/127) and
  use integer dot products, so against a reference running the *dequantized* weights in fp32
  the only extra error is activation rounding (~0.4 % per element), compounded over 5 blocks:
  observed ~1.3 % of the largest logit. We allow 5 % of the largest |logit| (max error) and
  1 % (mean error); codes may then differ where two logits are closer than that, so codes
  are compared only for fp32.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_omni.cpu import native  # noqa: E402
from vllm_omni.cpu.quant import dequantized_weights  # noqa: E402
from vllm_omni.cpu.reference import ReferencePredictor, ReferenceTalker  # noqa: E402
from vllm_omni.cpu.sampler import draw_uniforms  # noqa: E402
from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights  # noqa: E402
from vllm_omni.models import MODELS  # noqa: E402

SPEC = MODELS["0.6B"]
FP32_ATOL = 1e-4
FP32_RTOL = 1e-4
QUANT_MAX_REL = 0.05
QUANT_MEAN_REL = 0.01


@pytest.fixture(scope="module")
def weights():
    return random_predictor_weights(SPEC, seed=0)  # the full 5-layer stack


@pytest.fixture(scope="module")
def fused_fp32(weights):
    from vllm_omni.cpu.predictor import FusedPredictor

    # one thread: on a shared 2-core machine a second, descheduled thread makes every barrier
    # wait for a time slice (test_thread_count_does_not_change_any_format covers 2 and 3 threads)
    return FusedPredictor(weights, "fp32", threads=1)


@pytest.fixture(scope="module")
def reference(weights):
    return ReferencePredictor(weights, "fp32")


def inputs(seed: int, h: int = SPEC.talker.hidden):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(h, generator=g), torch.randn(h, generator=g) * 0.5


@torch.inference_mode()
def teacher_forced_logits(ref: ReferencePredictor, weights, ph, c0, codes):
    """The reference's 15 logit rows when fed the given codes (the fused frame's choices)."""
    st = ref.stack
    st.clear()
    x = ref._input(torch.stack([ph, c0]))
    rows = []
    for k in range(1, 16):
        h = st.forward_last(x)
        rows.append(ref.heads[k - 1](h)[0].float())
        x = ref._input(weights.codec_embedding[k - 1, codes[k - 1]][None])
    return torch.stack(rows)


def test_native_library_builds_and_reports_its_isa():
    from vllm_omni.cpu import native

    assert native.isa() in native.ISA_NAMES.values()
    assert native.load().vo_version() >= 1


@pytest.mark.parametrize("seed", range(12))
def test_fp32_greedy_codes_identical_to_reference(seed, fused_fp32, reference):
    ph, c0 = inputs(seed)
    ref_codes, ref_sum = reference.frame(ph, c0)
    codes, emb_sum = fused_fp32.frame(ph, c0)
    assert codes.dtype == torch.int64 and codes.shape == (15,)
    assert codes.tolist() == ref_codes.tolist()
    torch.testing.assert_close(emb_sum, ref_sum, atol=1e-5, rtol=1e-6)


def test_fp32_logits_match_reference(weights, fused_fp32, reference):
    ph, c0 = inputs(100)
    codes, _, logits = fused_fp32.frame(ph, c0, return_logits=True)
    ref = teacher_forced_logits(reference, weights, ph, c0, codes)
    torch.testing.assert_close(logits, ref, atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("seed, temperature, top_k", [(0, 0.9, 50), (1, 1.3, 5), (2, 0.7, 2048)])
def test_sampled_codes_identical_given_uniforms(seed, temperature, top_k, fused_fp32, reference):
    ph, c0 = inputs(50 + seed)
    u = draw_uniforms(torch.Generator().manual_seed(seed), 15, 2048)
    ref_codes, ref_sum = reference.frame(ph, c0, greedy=False, temperature=temperature, top_k=top_k, uniforms=u)
    codes, emb_sum = fused_fp32.frame(ph, c0, greedy=False, temperature=temperature, top_k=top_k, uniforms=u)
    assert codes.tolist() == ref_codes.tolist()
    torch.testing.assert_close(emb_sum, ref_sum, atol=1e-5, rtol=1e-6)
    with pytest.raises(ValueError):
        fused_fp32.frame(ph, c0, greedy=False)


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_sampled_codes_identical_given_noise_key(seed, fused_fp32, reference):
    """The kernel computes counter-based noise for the top-k ids only; the reference builds the
    whole [15, 2048] grid from the same key: the codes must be the same."""
    from vllm_omni.cpu.sampler import frame_noise_key

    ph, c0 = inputs(80 + seed)
    key = frame_noise_key(seed, 5)
    ref_codes, ref_sum = reference.frame(ph, c0, greedy=False, noise_key=key)
    codes, emb_sum = fused_fp32.frame(ph, c0, greedy=False, noise_key=key)
    assert codes.tolist() == ref_codes.tolist()
    torch.testing.assert_close(emb_sum, ref_sum, atol=1e-5, rtol=1e-6)
    other, _ = fused_fp32.frame(ph, c0, greedy=False, noise_key=frame_noise_key(seed, 6))
    assert other.tolist() != codes.tolist()  # a different frame draws different noise


def test_native_counter_uniforms_match_python():
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.sampler import counter_uniforms

    lib = native.load()
    for key in (0, 1, (7 << 32) | 3, (1 << 64) - 1):
        out = torch.empty(15 * 2048)
        lib.vo_counter_uniforms(ctypes.c_uint64(key), ctypes.c_uint64(0), out.numel(), out.data_ptr())
        assert torch.equal(out.view(15, 2048), counter_uniforms(key)), key


def test_single_pass_matches_reference(weights, fused_fp32, reference):
    g = torch.Generator().manual_seed(7)
    prefix = torch.randn(6, 1024, generator=g) * 0.5
    x = torch.randn(1, 1024, generator=g) * 0.5
    # fill the fused cache through the same positions with the same inputs
    for pos in range(6):
        fused_fp32.native.forward(prefix[pos:pos + 1], pos)
    logits = fused_fp32.pass_once(x, position=6, head=3)
    with torch.inference_mode():
        reference.stack.clear()
        reference.stack.forward_last(prefix)
        ref = reference.heads[3](reference.stack.forward_last(x))[0]
    torch.testing.assert_close(logits, ref, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_pass_once_is_forward_without_allocating(fused_fp32):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 1024, generator=g) * 0.5
    _, expected = fused_fp32.native.forward(x, 7, fused_fp32.heads[2])  # allocates its outputs
    got = fused_fp32.pass_once(x, position=7, head=2)
    assert torch.equal(got, expected)
    again = fused_fp32.pass_once(x.double().view(1024), position=7, head=2)  # converted, same values
    assert again.data_ptr() == got.data_ptr() and torch.equal(again, expected)
    with pytest.raises(ValueError, match="1024 values"):
        fused_fp32.pass_once(torch.zeros(1, 512), position=7)
    with pytest.raises(ValueError, match="head must be in 0..14"):
        fused_fp32.pass_once(x, position=7, head=15)
    with pytest.raises(RuntimeError, match="vo_stack_forward failed"):
        fused_fp32.pass_once(x, position=16)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
def test_thread_count_does_not_change_any_format(fmt):
    """Every format's rows, tile pairs and read streams are split across the threads: 2 and 3
    threads (uneven shares) give the bit-identical frame, talker steps and hidden states of
    1 thread."""
    from vllm_omni.cpu.fused_talker import FusedTalker
    from vllm_omni.cpu.predictor import FusedPredictor

    w = random_predictor_weights(SPEC, seed=4, layers=2)
    fused = FusedPredictor(w, fmt, threads=1)
    talker = FusedTalker(random_talker_weights(SPEC, seed=4, layers=2), fmt, threads=1, max_positions=8)
    ph, c0 = inputs(5)
    x = torch.randn(SPEC.talker.hidden, generator=torch.Generator().manual_seed(6))
    got = {}
    for threads in (1, 2, 3):
        fused.set_threads(threads)
        talker.set_threads(threads)
        talker.reset()
        steps = [talker.step(x * (i + 1)) for i in range(2)]
        got[threads] = (*fused.frame(ph, c0, return_logits=True), *(t for step in steps for t in step))
    for threads in (2, 3):
        for a, b in zip(got[1], got[threads]):
            assert torch.equal(a, b), (fmt, threads)


def test_workspace_follows_the_thread_count():
    """Each thread keeps its own copy of every GEMV's input in the workspace: set_threads grows
    it, and a stack whose thread count outgrew its workspace is refused (-4), not overrun."""
    from vllm_omni.cpu.fused_talker import FusedTalker
    from vllm_omni.cpu.predictor import FusedPredictor

    fused = FusedPredictor(random_predictor_weights(SPEC, seed=4, layers=1), "int4", threads=1)
    talker = FusedTalker(random_talker_weights(SPEC, seed=4, layers=1), "int4", threads=1, max_positions=8)
    one = fused.native.c.ws_bytes
    fused.set_threads(4)
    assert fused.native.c.ws_bytes > one
    fused.set_threads(1)
    assert fused.native.c.ws_bytes > one  # kept: large enough for fewer threads too
    ph, c0 = inputs(5)
    x = torch.randn(SPEC.talker.hidden, generator=torch.Generator().manual_seed(6))
    fused.native.c.threads = talker.native.c.threads = 64  # behind set_threads' back
    with pytest.raises(RuntimeError, match=r"vo_stack_forward failed \(-4\)"):
        fused.pass_once()
    with pytest.raises(RuntimeError, match=r"vo_predictor_frame failed \(-4\)"):
        fused.frame(ph, c0)
    with pytest.raises(RuntimeError, match=r"vo_talker_step failed \(-4\)"):
        talker.step(x)


def _rel_errors(got, ref):
    scale = ref.abs().max()
    diff = (got - ref).abs()
    return float(diff.max() / scale), float(diff.mean() / scale)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_frame_matches_reference_on_dequantized_weights(fmt):
    from vllm_omni.cpu.predictor import FusedPredictor

    weights = random_predictor_weights(SPEC, seed=2, layers=2)  # 2 of 5 blocks keep packing fast

    fused = FusedPredictor(weights, fmt, threads=1)
    ref = ReferencePredictor(dequantized_weights(weights, fmt), "fp32")
    for seed in range(2):
        ph, c0 = inputs(seed)
        codes, emb_sum, logits = fused.frame(ph, c0, return_logits=True)
        expect = teacher_forced_logits(ref, ref.weights, ph, c0, codes)
        mx, mean = _rel_errors(logits, expect)
        assert mx < QUANT_MAX_REL and mean < QUANT_MEAN_REL, (fmt, mx, mean)
        # the embedding sum follows the fused codes exactly
        want = c0 + sum(weights.codec_embedding[k, codes[k]] for k in range(15))
        torch.testing.assert_close(emb_sum, want, atol=1e-4, rtol=1e-5)


OTHER_BUILDS = [v for v in native.VARIANT_FLAGS if v != "native"]  # x86: avx2, generic; ARM: dotprod, generic


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
def test_fallback_instruction_sets_agree(variant, fmt):
    """The AVX2 and plain-C builds compute what the host build computes (1-layer stack)."""
    from vllm_omni.cpu.predictor import FusedPredictor

    w = random_predictor_weights(SPEC, seed=4, layers=1)
    ph, c0 = inputs(9)
    host = FusedPredictor(w, fmt, threads=1).frame(ph, c0, return_logits=True)
    other = FusedPredictor(w, fmt, threads=1, variant=variant).frame(ph, c0, return_logits=True)
    if fmt == "fp32":
        assert other[0].tolist() == host[0].tolist()
        torch.testing.assert_close(other[2], host[2], atol=FP32_ATOL, rtol=FP32_RTOL)
    else:
        # Builds differ in FMA contraction of the scalar float code; an activation value on a
        # rounding boundary can then land on the neighbouring int8 step, so only the first
        # pass (which does not depend on earlier codes) is compared, at 1 % of the largest logit.
        mx, mean = _rel_errors(other[2][0], host[2][0])
        assert mx < 0.01 and mean < 0.001, (mx, mean)


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_tiles_agree_bit_for_bit_across_builds(variant, fmt):
    """Every build sums a tile's even and odd groups apart and scales each group with one fused
    multiply-add, so the AVX2 and plain-C int8 and int4 kernels give the host build's bits exactly."""
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.predictor import vo_mat
    from vllm_omni.cpu.quant import quantize

    g = torch.Generator().manual_seed(8)
    # 11 tiles: at 1 and 2 threads a build's walk takes several tiles side by side (four int4
    # tiles in the AVX-512 build) and some left over one at a time
    m = quantize(torch.randn(352, 1088, generator=g), fmt)
    x = torch.randn(3, 1088, generator=g)
    for threads in (1, 2):
        ys = []
        for lib in (native.load(), native.load(variant)):
            y = torch.full((3, 352), float("nan"))
            assert lib.vo_linear(native.FMT_CODES[fmt], ctypes.byref(vo_mat(m)), x.data_ptr(), 3, y.data_ptr(),
                                 threads) == 0
            ys.append(y)
        assert torch.equal(ys[0], ys[1]), threads


@pytest.mark.parametrize("variant", list(native.VARIANT_FLAGS))
def test_int8_tiles_stay_exact_at_the_largest_magnitudes(variant):
    """Weights and activations of one magnitude quantise to +-127 everywhere, so each int16 pair
    sum of the AVX2 dot is +-2 * 127 * 127, the most it can hold without saturating. The product
    must still equal the float one, in every build, with signs that agree and that do not."""
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.predictor import vo_mat
    from vllm_omni.cpu.quant import quantize

    g = torch.Generator().manual_seed(3)
    cols = 1088
    x = torch.where(torch.rand(2, cols, generator=g) < 0.5, -1.0, 1.0)
    w = torch.cat([x, -x, torch.where(torch.rand(60, cols, generator=g) < 0.5, -1.0, 1.0)])
    y = torch.full((2, 64), float("nan"))
    lib = native.load(variant)
    assert lib.vo_linear(native.FMT_CODES["int8"], ctypes.byref(vo_mat(quantize(w, "int8"))), x.data_ptr(), 2, y.data_ptr(), 1) == 0
    assert y[0, 0] == pytest.approx(cols, rel=1e-5) and y[0, 2] == pytest.approx(-cols, rel=1e-5)
    torch.testing.assert_close(y, x @ w.T, atol=0, rtol=1e-5)


def test_projection_path_of_the_larger_model():
    """1.7B: inputs are talker-width (2048) and go through small_to_mtp_projection (1 layer)."""
    from vllm_omni.cpu.predictor import FusedPredictor

    spec = MODELS["1.7B"]
    w = random_predictor_weights(spec, seed=1, layers=1)
    fused = FusedPredictor(w, "fp32", threads=1)
    ref = ReferencePredictor(w, "fp32")
    for seed in range(2):
        ph, c0 = inputs(seed, spec.talker.hidden)
        ref_codes, ref_sum = ref.frame(ph, c0)
        codes, emb_sum = fused.frame(ph, c0)
        assert codes.tolist() == ref_codes.tolist()
        torch.testing.assert_close(emb_sum, ref_sum, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("variant", ["native", "generic"])
@pytest.mark.parametrize("kv_cache", ["fp32", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(6, 2, 64), (4, 4, 32), (16, 8, 36)])
def test_attention_shapes_match_reference(heads, kv_heads, head_dim, kv_cache, variant):
    """Query heads in pairs with one left over (3 per KV head), one per KV head, and a head_dim
    that is not a multiple of 8 (the row-by-row path), over 23 positions: whole blocks of four
    cache rows and the rows after them, against the eager block."""
    from vllm_omni.cpu.predictor import NativeStack
    from vllm_omni.cpu.reference import ReferenceStack
    from vllm_omni.cpu.weights import random_block
    from vllm_omni.models.spec import StackSpec

    spec = StackSpec(layers=1, hidden=256, intermediate=512, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    w = [random_block(spec, torch.Generator().manual_seed(5))]
    norm = torch.ones(spec.hidden)
    fused = NativeStack(w, norm, spec, "fp32", threads=1, max_positions=24, variant=variant, kv_cache=kv_cache)
    ref = ReferenceStack(w, norm, spec, "fp32", capacity=24)
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(2, spec.hidden, generator=g)] + [torch.randn(1, spec.hidden, generator=g) for _ in range(21)]
    pos = 0
    tol = 1e-4 if kv_cache == "fp32" else 2e-3  # fp16 cache rows: rounding of K and V
    for x in xs:
        got, _ = fused.forward(x, pos)
        want = ref.forward_last(x)
        pos += x.shape[0]
        torch.testing.assert_close(got[-1:], want, atol=tol, rtol=tol)
    assert pos == 23


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_uneven_tile_walks_match_reference(fmt):
    """A block whose matrices split into uneven tile walks: 8 tiles of output rows (o, down),
    14 gate tiles and their up tiles, 16 QKV tiles. At 1, 2 and 3 threads a thread's share ends
    in tiles that are not side by side with others (gate tiles and their up tiles walked four at a
    time in the AVX-512 int4 build, and one pair at a time at the end of a share); every thread
    count gives the same bits, within the quantized tolerance of the eager block."""
    from vllm_omni.cpu.predictor import NativeStack
    from vllm_omni.cpu.quant import dequantized_block
    from vllm_omni.cpu.reference import ReferenceStack
    from vllm_omni.cpu.weights import random_block
    from vllm_omni.models.spec import StackSpec

    spec = StackSpec(layers=1, hidden=256, intermediate=448, heads=4, kv_heads=2, head_dim=64)
    w = random_block(spec, torch.Generator().manual_seed(11))
    deq = dequantized_block(w, fmt)
    norm = torch.ones(spec.hidden)
    fused = NativeStack([w], norm, spec, fmt, threads=1, max_positions=4)
    ref = ReferenceStack([deq], norm, spec, "fp32", capacity=4)
    x = torch.randn(2, spec.hidden, generator=torch.Generator().manual_seed(12))
    got = {}
    for threads in (1, 2, 3):
        fused.set_threads(threads)
        got[threads] = fused.forward(x, 0)[0]
    assert torch.equal(got[1], got[2]) and torch.equal(got[1], got[3])
    want = ref.forward_last(x)
    mx, mean = _rel_errors(got[1][-1:], want)
    assert mx < QUANT_MAX_REL and mean < QUANT_MEAN_REL, (fmt, mx, mean)


# --- talker ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def talker_weights():
    return random_talker_weights(SPEC, seed=0, layers=2)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
def test_fused_talker_step_matches_reference(fmt, talker_weights):
    from vllm_omni.cpu.fused_talker import FusedTalker

    fused = FusedTalker(talker_weights, fmt, threads=1, max_positions=32)
    ref = ReferenceTalker(dequantized_weights(talker_weights, fmt), "fp32")
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(1024, generator=g) * 0.5 for _ in range(6)]
    for x in xs:
        want_logits, want_hidden = ref.step(x)
        logits, hidden = fused.step(x)
        assert logits.shape == (3072,) and hidden.shape == (1024,)
        if fmt == "fp32":
            torch.testing.assert_close(logits, want_logits, atol=FP32_ATOL, rtol=FP32_RTOL)
            torch.testing.assert_close(hidden, want_hidden, atol=FP32_ATOL, rtol=FP32_RTOL)
        else:
            for got, want in ((logits, want_logits), (hidden, want_hidden)):
                mx, mean = _rel_errors(got, want)
                assert mx < QUANT_MAX_REL and mean < QUANT_MEAN_REL, (fmt, mx, mean)
    assert fused.position == 6
    # reset: the same first step again
    fused.reset()
    again, _ = fused.step(xs[0])
    first, _ = FusedTalker(talker_weights, fmt, threads=2, max_positions=32).step(xs[0])
    torch.testing.assert_close(again, first, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("variant", ["native", "generic"])
def test_fused_talker_fp16_kv_cache_stays_close_to_fp32(variant, talker_weights):
    """fp16 cache rows (F16C, or the plain-C rounding) change fp32-weight logits by rounding only."""
    from vllm_omni.cpu.fused_talker import FusedTalker

    caches = {kv: FusedTalker(talker_weights, "fp32", threads=1, max_positions=32, variant=variant, kv_cache=kv)
              for kv in ("fp32", "fp16")}
    assert caches["fp16"].native.k_cache[0].dtype == torch.float16
    g = torch.Generator().manual_seed(12)
    for _ in range(6):
        x = torch.randn(1024, generator=g) * 0.5
        (l32, h32), (l16, h16) = (t.step(x) for t in caches.values())
        for got, want in ((l16, l32), (h16, h32)):
            mx, _ = _rel_errors(got, want)
            assert 0 < mx < 2e-3, mx
    # the first layer's rows at the first position see no earlier rounding: exactly the fp32 rows
    # rounded to nearest fp16
    for which in ("k_cache", "v_cache"):
        c32, c16 = (getattr(t.native, which)[0][:, 0] for t in caches.values())  # fp32 first
        assert torch.equal(c16, c32.half())


def test_fused_talker_kv_cache_defaults_and_bad_value(talker_weights):
    from vllm_omni.cpu.fused_talker import FusedTalker

    assert FusedTalker(talker_weights, "fp32", threads=1, max_positions=8).kv_cache == "fp32"
    assert FusedTalker(talker_weights, "int4", threads=1, max_positions=8).kv_cache == "fp16"
    with pytest.raises(ValueError, match="kv_cache"):
        FusedTalker(talker_weights, "int4", threads=1, max_positions=8, kv_cache="bf16")


@pytest.mark.parametrize("name, value", [("threads", 0), ("threads", -1), ("threads", 1.5), ("threads", True),
                                         ("max_positions", 0), ("max_positions", -5), ("max_positions", 8.0)])
def test_fused_talker_refuses_counts_that_are_not_whole_and_positive(talker_weights, name, value):
    import numpy as np

    from vllm_omni.cpu.fused_talker import FusedTalker

    kwargs = {"threads": 1, "max_positions": 8, name: value}
    with pytest.raises(ValueError, match=f"{name} must be a whole number >= 1, got {value!r}"):
        FusedTalker(talker_weights, "fp32", **kwargs)
    assert FusedTalker(talker_weights, "fp32", threads=np.int64(1), max_positions=np.int32(8)).max_positions == 8


def test_fused_talker_prefill_and_bounds(talker_weights):
    from vllm_omni.cpu.fused_talker import FusedTalker

    t = FusedTalker(talker_weights, "int4", threads=2, max_positions=16)
    t.prefill_random(15)
    assert t.position == 15
    logits, _ = t.step(torch.zeros(1024))
    assert torch.isfinite(logits).all()
    with pytest.raises(RuntimeError):
        t.step(torch.zeros(1024))
    with pytest.raises(ValueError):
        t.prefill_random(16)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
def test_vo_linear_matches_dequantized_matmul(fmt):
    """The plain linear entry point: every row count, odd output sizes (uneven thread shares and
    stream splits), 1 and 2 threads giving identical results."""
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.predictor import vo_mat
    from vllm_omni.cpu.quant import dequantize, quantize

    lib = native.load()
    g = torch.Generator().manual_seed(3)
    n_out = 333 if fmt == "fp32" else 352  # int8/int4: 11 tiles of 32 rows, split 5 + 6 at 2 threads
    w = torch.randn(n_out, 320, generator=g)  # 5 pairs of int4 groups per row
    m = quantize(w, fmt)
    ref_w = w if fmt == "fp32" else dequantize(m)
    for rows in (1, 3, 8):
        x = torch.randn(rows, 320, generator=g)
        ys = []
        for threads in (1, 2):
            y = torch.full((rows, n_out), float("nan"))
            assert lib.vo_linear(native.FMT_CODES[fmt], ctypes.byref(vo_mat(m)), x.data_ptr(), rows, y.data_ptr(),
                                 threads) == 0
            ys.append(y)
        assert torch.equal(ys[0], ys[1])
        ref = x @ ref_w.T
        if fmt == "fp32":
            torch.testing.assert_close(ys[0], ref, atol=FP32_ATOL, rtol=FP32_RTOL)
        else:  # only the int8 rounding of activations differs (see the module doc)
            err = (ys[0] - ref).abs()
            assert float(err.max()) < QUANT_MAX_REL * float(ref.abs().max())
    bad = native.VoMat(None, None, 4, 100)  # 100 inputs: not a multiple of 64
    assert lib.vo_linear(0, ctypes.byref(bad), x.data_ptr(), 1, x.data_ptr(), 1) == -1
    short_tile = native.VoMat(m.data.data_ptr(), None, 40, 320)  # int8/int4 rows come in tiles of 32
    for code in (native.FMT_CODES["int8"], native.FMT_CODES["int4"]):
        assert lib.vo_linear(code, ctypes.byref(short_tile), x.data_ptr(), 1, x.data_ptr(), 1) == -1


def test_vo_linear_int4_takes_long_rows():
    """No limit on the row length: 33024 inputs (1032 scale groups, each one of the tile's 576-byte units)."""
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.predictor import vo_mat
    from vllm_omni.cpu.quant import dequantize, quantize

    g = torch.Generator().manual_seed(5)
    m = quantize(torch.randn(32, 33024, generator=g), "int4")
    x = torch.randn(2, 33024, generator=g)
    y = torch.empty(2, 32)
    assert native.load().vo_linear(native.FMT_CODES["int4"], ctypes.byref(vo_mat(m)), x.data_ptr(), 2, y.data_ptr(), 2) == 0
    ref = x @ dequantize(m).T
    assert float((y - ref).abs().max()) < QUANT_MAX_REL * float(ref.abs().max())


@pytest.mark.parametrize("variant", list(native.VARIANT_FLAGS))
def test_swiglu_exponential_is_within_a_few_ulp(variant):
    """The gate/up GEMV's SwiGLU takes exp from a polynomial on whole vectors of 8 (std::exp for
    the rest and in the plain-C build). Against float64: within 4e-7 relative (a few float ulp)
    wherever silu(g) * u is a normal float, a tail (n = 8k + 5) included; saturated where exp(-g)
    overflows or vanishes; NaN in, NaN out."""
    from vllm_omni.cpu import native

    gen = torch.Generator().manual_seed(9)
    small = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0])
    extreme = torch.tensor([-100.0, -87.5, 88.5, 100.0, float("nan")])
    g = torch.cat([torch.linspace(-80, 80, 4000), torch.randn(4000, generator=gen) * 4, small, extreme])
    n = g.numel()
    assert n % 8 == 5
    u = torch.rand(n, generator=gen) + 0.5
    out = torch.full((n,), 123.0)
    native.load(variant).vo_swiglu(g.data_ptr(), u.data_ptr(), out.data_ptr(), n)
    want = torch.nn.functional.silu(g.double()) * u.double()
    normal = want.abs() > 1e-30
    rel = ((out.double() - want).abs() / want.abs())[normal]
    assert rel.max() < 4e-7, rel.max()
    assert (out.double() - want)[~normal & ~want.isnan()].abs().max() < 1e-30
    assert out[-1].isnan() and not out[:-1].isnan().any()


def test_int4_rows_decoded_together_equal_each_row_alone():
    """Several rows in one call decode each int4 tile once for up to four of them (the AVX-512
    build's q4_tile_rows): every row's result is what that row gives alone, bit for bit, for row
    counts that fill four-row blocks and leave some over."""
    import ctypes

    from vllm_omni.cpu import native
    from vllm_omni.cpu.predictor import vo_mat
    from vllm_omni.cpu.quant import quantize

    g = torch.Generator().manual_seed(9)
    m = quantize(torch.randn(352, 1088, generator=g), "int4")
    lib = native.load()
    for rows in (2, 3, 4, 7, 9):
        x = torch.randn(rows, 1088, generator=g)
        y = torch.full((rows, 352), float("nan"))
        assert lib.vo_linear(native.FMT_CODES["int4"], ctypes.byref(vo_mat(m)), x.data_ptr(), rows, y.data_ptr(), 2) == 0
        for r in range(rows):
            alone = torch.full((1, 352), float("nan"))
            xr = x[r:r + 1].contiguous()
            assert lib.vo_linear(native.FMT_CODES["int4"], ctypes.byref(vo_mat(m)), xr.data_ptr(), 1, alone.data_ptr(),
                                 2) == 0
            assert torch.equal(y[r], alone[0]), (rows, r)
