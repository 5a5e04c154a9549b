"""The decoder's native kernels against their eager twins (``vllm_omni.cpu.conv``,
``vllm_omni.cpu.decoder_transformer``).

What each is held to, and why:

- bf16 convolutions (``Bf16Conv``, ``Bf16TransConv``): against PyTorch's fp32 convolution of the
  same bf16-rounded weights and inputs, so only the order of the fp32 sums differs: 1e-5 of the
  output's largest magnitude. The SnakeBeta folded in is the native one (a polynomial sine),
  compared with ``torch.sin`` before rounding, so a few inputs round to the neighbouring bf16
  value: there the bound is 2e-3 of the largest magnitude, still far below bf16's own step.
- A sample's arithmetic does not depend on the call's length or its place in it, so a stream
  cut into chunks equals one whole call bit for bit (convs, transposed convs, the transformer).
- ``Bf16ResidualUnit`` is the two ``Bf16Conv`` calls in time tiles: equal bit for bit.
- The transformer in bf16 against the fp32 PyTorch layers: a signal-over-difference bound.
- Each loop a host can run (AMX, AVX-512 BF16, plain C) against the others: the fp32 sums of the
  same products in other orders (1e-5 of the largest magnitude).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from vllm_omni.cpu import conv, native  # noqa: E402
from vllm_omni.tts.checkpoint import load_checkpoint  # noqa: E402
from vllm_omni.tts.decoder import StreamingDecoder  # noqa: E402
from vllm_omni.tts.random_checkpoint import write_random_checkpoint  # noqa: E402

HARDWARE = pytest.mark.skipif(not conv.available(), reason="this CPU has neither AMX nor AVX-512 BF16: the decoder "
                              "keeps PyTorch's bf16 convolutions, and the native loop here is the plain-C reference")
INT8 = pytest.mark.skipif(not conv.int8_available(), reason="this CPU multiplies int8 in neither AVX-512 VNNI nor "
                          "ARM's dot product: the int8 decoder is refused here, its loop being the plain-C reference")
SUM_ORDER = 1e-5  # of the largest |output|: fp32 sums of the same products in another order
SNAKE_ROUNDING = 2e-3  # a few snake outputs round to the neighbouring bf16 value


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bf(t):
    return t.bfloat16().float()


def snake_of(c: int, seed: int):
    g = gen(seed)
    return torch.rand(c, generator=g) + 0.5, torch.rand(c, generator=g)


def snake(x, s):
    return x + s[1][:, None] * torch.sin(s[0][:, None] * x).pow(2)


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def conv_case(cout, cin, k, d, t, seed=0):
    g = gen(seed)
    w = torch.randn(cout, cin, k, generator=g) / (cin * k) ** 0.5
    return w, torch.randn(cout, generator=g), torch.randn(cin, (k - 1) * d, generator=g), torch.randn(cin, t, generator=g)


@HARDWARE
@pytest.mark.parametrize("cout,cin,k,d,t", [(64, 32, 7, 3, 50), (96, 96, 7, 9, 1920), (768, 768, 7, 1, 128),
                                            (32, 64, 1, 1, 5), (1536, 1024, 7, 1, 1), (96, 192, 1, 1, 33)])
def test_bf16_conv_is_the_conv_of_the_rounded_operands(cout, cin, k, d, t):
    w, b, hist, x = conv_case(cout, cin, k, d, t)
    c = conv.Bf16Conv(w, b, d)
    y, new_hist = c(x, hist)
    full = torch.cat([hist, x], 1)
    ref = F.conv1d(bf(full)[None], bf(w), b, dilation=d)[0]
    assert rel(y, ref) < SUM_ORDER
    assert torch.equal(new_hist, full[:, full.shape[1] - hist.shape[1]:])  # the history is kept in fp32
    residual = torch.randn(cout, t, generator=gen(1))
    y2, _ = c(x, hist, residual=residual)
    assert rel(y2, ref + residual) < SUM_ORDER
    s = snake_of(cin, 2)
    y3, hist3 = c(x, hist, snake=s)
    full3 = torch.cat([hist, snake(x, s)], 1)
    assert rel(y3, F.conv1d(bf(full3)[None], bf(w), b, dilation=d)[0]) < SNAKE_ROUNDING
    assert torch.allclose(hist3, full3[:, full3.shape[1] - hist.shape[1]:], atol=1e-5)
    y4, _ = c(x, None)
    assert rel(y4, F.conv1d(bf(F.pad(x, (hist.shape[1], 0)))[None], bf(w), b, dilation=d)[0]) < SUM_ORDER


@pytest.mark.parametrize("kind", [pytest.param(conv.Bf16Conv, marks=HARDWARE, id="bf16"),
                                  pytest.param(conv.Int8Conv, marks=INT8, id="int8")])
def test_conv_streams_and_shares_calls_bit_for_bit(kind):
    """A stream cut into chunks is one whole call bit for bit (int8 too: each input sample has its own
    scale), and streams in one call are each alone bit for bit (one joining mid-way from no history)."""
    w, b, _, x = conv_case(192, 96, 7, 9, 700)
    s = snake_of(96, 3)
    c = kind(w, b, 9)
    whole, whole_hist = c(x, None, s)
    outs, hist = [], None
    for a, e in [(0, 1), (1, 33), (33, 40), (40, 300), (300, 700)]:
        y, hist = c(x[:, a:e], hist, s)
        outs.append(y)
    assert torch.equal(torch.cat(outs, 1), whole) and torch.equal(hist, whole_hist)
    xs = [x[:, :40], x[:, 40:300], torch.randn(96, 5, generator=gen(1))]
    hs = [None, c(x[:, :40], None, s)[1], None]
    ys, news = c.many(xs, hs, s)
    for got, new, xi, hi in zip(ys, news, xs, hs):
        alone, alone_hist = c(xi, hi, s)
        assert torch.equal(got, alone) and torch.equal(new, alone_hist)


@HARDWARE
@pytest.mark.parametrize("cin,cout,stride", [(1536, 768, 8), (192, 96, 3), (1024, 1024, 2)])
def test_bf16_transposed_conv_streams_as_the_whole_transposed_conv(cin, cout, stride):
    k = 2 * stride if stride > 2 else 2
    g = gen(4)
    w = torch.randn(cin, cout, k, generator=g) / cin ** 0.5
    b = torch.randn(cout, generator=g)
    x = torch.randn(cin, 21, generator=g)
    s = snake_of(cin, 5)
    tc = conv.Bf16TransConv(w, b, stride)
    whole, carry = tc(x, None, s)
    n = 21 * stride
    ref = F.conv_transpose1d(bf(snake(x, s))[None], bf(w), None, stride=stride)[0]
    assert rel(whole, ref[:, :n] + b[:, None]) < SNAKE_ROUNDING
    assert rel(carry, ref[:, n:]) < SNAKE_ROUNDING if k > stride else carry.numel() == 0
    outs, c = [], None
    for a, e in [(0, 1), (1, 2), (2, 9), (9, 21)]:
        y, c = tc(x[:, a:e], c, s)
        outs.append(y)
    assert torch.equal(torch.cat(outs, 1), whole) and torch.equal(c, carry)


@HARDWARE
@pytest.mark.parametrize("c,d,t", [(96, 9, 7680), (192, 3, 2560), (192, 1, 100), (64, 3, 50), (96, 9, 20)])
def test_fused_residual_unit_is_its_two_convs_bit_for_bit(c, d, t):
    w1, b1, hist, x = conv_case(c, c, 7, d, t, seed=6)
    w2, b2, _, _ = conv_case(c, c, 1, 1, 1, seed=7)
    c1, c2 = conv.Bf16Conv(w1, b1, d), conv.Bf16Conv(w2, b2)
    s1, s2 = snake_of(c, 8), snake_of(c, 9)
    y, new_hist = conv.Bf16ResidualUnit(c1, c2)(x, hist, s1, s2)
    h, hist_ref = c1(x, hist, s1)
    assert torch.equal(y, c2(h, None, s2, residual=x)[0]) and torch.equal(new_hist, hist_ref)
    with pytest.raises(ValueError, match="a C -> C conv then a 1x1"):
        conv.Bf16ResidualUnit(c2, c1)


def test_narrow_conv_is_the_fp32_conv():
    w, b, hist, x = conv_case(1, 96, 7, 1, 1000)
    s = snake_of(96, 10)
    c = conv.NarrowConv(w, b)
    y, new_hist = c(x, hist, s)
    full = torch.cat([hist, snake(x, s)], 1)
    assert rel(y, F.conv1d(full[None], w, b)[0]) < 1e-5
    assert torch.allclose(new_hist, full[:, -6:], atol=1e-5)
    parts = [c(x[:, :500], hist, s), None]
    parts[1] = c(x[:, 500:], parts[0][1], s)
    assert torch.equal(torch.cat([parts[0][0], parts[1][0]], 1), y)
    with pytest.raises(ValueError, match="at most 8 channels"):
        conv.NarrowConv(torch.zeros(9, 4, 3), None)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="multiples of 32, got 48 out, 96 in"):
        conv.Bf16Conv(torch.zeros(48, 96, 7), None)
    if conv.available():
        c = conv.Bf16Conv(torch.zeros(32, 64, 3), None, 2)
        with pytest.raises(ValueError, match=r"conv takes \[64, T\] inputs, got \[32, 5\]"):
            c(torch.zeros(32, 5), None)
        with pytest.raises(ValueError, match=r"history is \[64, 4\], got \[64, 3\]"):
            c(torch.zeros(64, 5), torch.zeros(64, 3))
        with pytest.raises(ValueError, match=r"residual must be \[32, 5\]"):
            c(torch.zeros(64, 5), None, residual=torch.zeros(32, 4))


LOOPS = [v for v in ("no-amx", "generic") if v in native.LOOP_VARIANT_FLAGS or v in native.VARIANT_FLAGS]


@pytest.mark.parametrize("variant", LOOPS)
def test_every_loop_computes_the_same_conv(variant):
    """The AVX-512 BF16 loop (the build without AMX) and the plain-C loop, against PyTorch on the
    rounded operands, and against the host's own loop where it has one."""
    w, b, hist, x = conv_case(64, 96, 7, 3, 70, seed=11)
    s = snake_of(96, 12)
    y, _ = conv.Bf16Conv(w, b, 3, variant=variant)(x, hist, s)
    full = torch.cat([hist, snake(x, s)], 1)
    assert rel(y, F.conv1d(bf(full)[None], bf(w), b, dilation=3)[0]) < SNAKE_ROUNDING
    if conv.available():
        assert rel(y, conv.Bf16Conv(w, b, 3)(x, hist, s)[0]) < SUM_ORDER
    expected = {"generic": "plain C"}.get(variant)
    if expected:
        assert conv.path(variant) == expected


@HARDWARE
def test_native_transformer_against_the_fp32_layers_and_chunk_by_chunk(tmp_path):
    ck = load_checkpoint(write_random_checkpoint(tmp_path / "ck", "0.6B", dtype="fp32", talker_layers=1,
                                                 predictor_layers=1, decoder_layers=3, text_hidden=256,
                                                 decoder_dim=192))
    dc = ck.config.decoder
    fp32, b16 = StreamingDecoder(ck.decoder, dc, "fp32"), StreamingDecoder(ck.decoder, dc, "bf16")
    assert b16.native_transformer is not None and fp32.native_transformer is None
    x = torch.randn(100, dc.spec.latent_dim, generator=gen(13))

    def run(dec, chunks):
        dec.reset()
        out, a = [], 0
        for c in chunks:
            out.append(dec._transformer(x[a:a + c]))
            dec.position += c
            a += c
        return torch.cat(out)

    ref = run(fp32, [100])
    whole = run(b16, [100])
    snr = 10 * torch.log10(ref.pow(2).mean() / (whole - ref).pow(2).mean())
    assert 40 < float(snr) < 90  # close to fp32, and not secretly fp32
    chunked = run(b16, [1, 2, 4, 7, 16, 3, 67])  # crosses the 72-position window
    assert torch.equal(chunked, whole)
    keys = [layer["attn"].keys for layer in b16.layers]
    assert all(k.shape == (dc.kv_heads, dc.sliding_window - 1, dc.head_dim) for k in keys)


@HARDWARE
def test_convnext_block_against_its_torch_ops():
    g = gen(14)
    c, inner, t = 64, 256, 23
    dw_w, dw_b = torch.randn(c, 1, 7, generator=g) / 7 ** 0.5, torch.randn(c, generator=g)
    norm = (torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g))
    fc1 = (torch.randn(inner, c, generator=g) / c ** 0.5, torch.randn(inner, generator=g))
    fc2 = (torch.randn(c, inner, generator=g) / inner ** 0.5, torch.randn(c, generator=g))
    x, hist = torch.randn(c, t, generator=g), torch.randn(c, 6, generator=g)
    block = conv.Bf16ConvNeXt(dw_w, dw_b, norm, 1e-6, fc1, fc2)
    y, new_hist = block(x, hist)
    full = torch.cat([hist, x], 1)
    h = F.conv1d(full[None], dw_w, dw_b, groups=c)[0].T
    h = F.layer_norm(h, (c,), *norm, eps=1e-6)
    h = F.gelu(bf(h) @ bf(fc1[0]).T + fc1[1])
    ref = x + (bf(h) @ bf(fc2[0]).T + fc2[1]).T
    assert rel(y - x, ref - x) < SNAKE_ROUNDING  # the normed input rounds to bf16 at other neighbours now and then
    assert torch.equal(new_hist, full[:, -6:])
    y1, h1 = block(x[:, :10], hist)
    y2, h2 = block(x[:, 10:], h1)
    assert torch.equal(torch.cat([y1, y2], 1), y) and torch.equal(h2, new_hist)


@HARDWARE
def test_several_streams_in_one_call_are_each_alone_bit_for_bit():
    """Each kernel's ``many``: the weights read once for every stream, each stream's samples the same bits
    as in a call of its own, each with its own state (lengths 1 to 45, one stream with no history yet)."""
    g = gen(20)
    lengths = [4, 1, 45, 16]

    def streams(c, tail):
        xs = [torch.randn(c, t, generator=g) for t in lengths]
        return xs, [None if i == 1 else torch.randn(c, tail, generator=g) for i in range(len(lengths))]

    def same(many, alone):
        for got, want in zip(many, alone):
            for a, b in zip(got, want):
                assert torch.equal(a, b)

    w, b, _, _ = conv_case(64, 96, 7, 3, 1, seed=21)
    c, s = conv.Bf16Conv(w, b, 3), snake_of(96, 22)
    xs, hs = streams(96, 18)
    rs = [torch.randn(64, t, generator=g) for t in lengths]
    same(zip(*c.many(xs, hs, s, rs)), [c(x, h, s, r) for x, h, r in zip(xs, hs, rs)])

    tc = conv.Bf16TransConv(torch.randn(96, 64, 8, generator=g) / 10, torch.randn(64, generator=g), 4)
    xs, _ = streams(96, 0)
    carries = [None, torch.randn(64, 4, generator=g), torch.randn(64, 4, generator=g), None]
    same(zip(*tc.many(xs, carries, s)), [tc(x, k, s) for x, k in zip(xs, carries)])

    w2, b2, _, _ = conv_case(96, 96, 1, 1, 1, seed=23)
    unit = conv.Bf16ResidualUnit(conv.Bf16Conv(*conv_case(96, 96, 7, 9, 1, seed=24)[:2], 9), conv.Bf16Conv(w2, b2))
    xs, hs = streams(96, 54)
    s2 = snake_of(96, 25)
    same(zip(*unit.many(xs, hs, s, s2)), [unit(x, h, s, s2) for x, h in zip(xs, hs)])

    block = conv.Bf16ConvNeXt(torch.randn(64, 1, 7, generator=g) / 3, torch.randn(64, generator=g),
                              (torch.rand(64, generator=g) + 0.5, torch.randn(64, generator=g)), 1e-6,
                              (torch.randn(128, 64, generator=g) / 8, torch.randn(128, generator=g)),
                              (torch.randn(64, 128, generator=g) / 11, torch.randn(64, generator=g)))
    xs, hs = streams(64, 6)
    same(zip(*block.many(xs, hs)), [block(x, h) for x, h in zip(xs, hs)])


@pytest.fixture(scope="module")
def wide_decoder(tmp_path_factory):
    """A checkpoint whose every decoder conv fits the native loops: the published conv width, two transformer layers."""
    ck = load_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("wide") / "ck", "0.6B", dtype="fp32",
                                                 talker_layers=1, predictor_layers=1, decoder_layers=2,
                                                 text_hidden=256, decoder_dim=1536))
    return ck


@HARDWARE
def test_streams_decoded_together_are_each_decoded_alone(wide_decoder):
    """``push_streams``: every stage one call for all streams, each stream's samples and state the same
    bits as its own ``push``; a stream joins mid-way from a fresh state, another brings no frames, and
    the decoder's own state is left alone."""
    ck = wide_decoder
    dec = StreamingDecoder(ck.decoder, ck.config.decoder, "bf16")
    assert dec.streams_together
    g = gen(30)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (9, 13, 4)]
    alone, states = [], []
    for c in codes:  # each stream some frames in, alone
        dec.reset()
        dec.push(c[:3])
        states.append(dec.save_state())
    for c, st in zip(codes, states):
        dec.load_state(st)
        alone.append(dec.push(c[3:]))
    mine = dec.save_state()
    outs, news = dec.push_streams([c[3:] for c in codes] + [torch.zeros(0, 16, dtype=torch.int64)],
                                  states + [dec.fresh_state()])
    for got, want in zip(outs, alone):
        assert torch.equal(got, want)
    assert outs[3].numel() == 0 and news[3].position == 0
    dec.load_state(news[1])  # a state from the shared call continues alone as it would have
    nxt = dec.push(codes[1][:2])
    dec.load_state(states[1])
    dec.push(codes[1][3:])
    assert torch.equal(nxt, dec.push(codes[1][:2]))
    joined = dec.fresh_state()  # a stream that joins now: its first frames beside the others' later ones
    outs2, _ = dec.push_streams([codes[0][:2], codes[2][:1]], [news[0], joined])
    dec.reset()
    assert torch.equal(outs2[1], dec.push(codes[2][:1]))
    assert dec.save_state().position == 1 and mine.position == states[2].position + 1


@HARDWARE
def test_utterances_decoded_together_get_the_audio_they_get_alone(wide_decoder):
    """The server's path (``pipeline.decode_together``): two utterances whose chunks fill at the same
    frames are decoded in one pass, and each gets the samples it gets alone, chunk for chunk."""
    from vllm_omni.tts.generate import Sampling
    from vllm_omni.tts.pipeline import Speech, decode_together
    from vllm_omni.tts.prompt import build_prompt

    speech = Speech(wide_decoder, "int4", threads=2, max_positions=128, decoder="bf16")
    assert speech.decoder.streams_together
    texts = ["Hello there.", "今天天气很好。"]
    codes = [list(speech.generator.generate(build_prompt(wide_decoder, t, speaker="ryan", language="auto"),
                                            Sampling(greedy=True), max_frames=8)) for t in texts]
    alone = []
    for t, c in zip(texts, codes):
        sp = speech.open(t, speaker="ryan", greedy=True, max_frames=8)
        alone.append([x.samples for x in (sp.add(row) for row in c) if x is not None])
    both = [speech.open(t, speaker="ryan", greedy=True, max_frames=8) for t in texts]
    together = [[], []]
    for rows in zip(*codes):
        due = [sp for sp, row in zip(both, rows) if sp.take(row)]
        for sp, chunk in zip(due, decode_together(due)):
            together[both.index(sp)].append(chunk.samples)
    assert [len(a) for a in alone] == [len(t) for t in together] and len(alone[0]) >= 3
    for a, t in zip(alone, together):
        for x, y in zip(a, t):
            assert np.array_equal(x, y)


def test_an_installed_package_carries_every_kernel_source():
    """The kernels are compiled on the user's machine from the installed package's ``csrc``: every
    source and header there (the ISA files under ``arch/``, the ARM driver) is package data, so a
    wheel or a non-editable install builds as this checkout does."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["vllm_omni.cpu"]
    pkg = root / "src" / "vllm_omni" / "cpu"
    files = [p.relative_to(pkg).as_posix() for p in (pkg / "csrc").rglob("*") if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, pat) and f.count("/") == pat.count("/") for pat in patterns)
                         for f in files), [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]


# --- int8 convolutions (``Int8Conv``, ``Int8TransConv``) and the int8 decoder ------------------------

INT8_CONV_SNR = 38.0  # dB over the fp32 conv: weights rounded per channel, inputs per sample (about 42 measured)


def snr_db(got, ref) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (got - ref).pow(2).sum()))


def int8_emulated(w, b, hist, x, d, residual=None):
    """The int8 conv's arithmetic in float64 (without SnakeBeta, whose polynomial is the kernel's own):
    weights rounded per output channel, [hist | x] per sample, each tap's integer sums scaled."""
    def rounded(v, m):  # the kernel's float32 steps: q = nearbyint(v * (127 / m)), scale m / 127
        inv = torch.where(m > 0, torch.full_like(m, 127) / m, torch.zeros_like(m))  # (not 127 / m: a reciprocal)
        return torch.round(v * inv).double(), (m / 127).double()

    full = torch.cat([hist, x], 1)
    wq, sw = rounded(w, w.abs().amax((1, 2), keepdim=True))
    xq, sx = rounded(full, full.abs().amax(0))
    t = x.shape[1]
    y = torch.zeros(w.shape[0], t, dtype=torch.float64)
    for j in range(w.shape[2]):
        y += (wq[:, :, j] @ xq[:, j * d: j * d + t]) * sx[j * d: j * d + t]
    y = y * sw[:, :, 0] + b.double()[:, None]
    return (y if residual is None else y + residual.double()).float()


@INT8
@pytest.mark.parametrize("cout,cin,k,d,t", [(64, 32, 7, 3, 50), (96, 96, 7, 9, 1920), (768, 768, 7, 1, 128),
                                            (384, 384, 1, 1, 40), (1536, 1024, 7, 1, 4)])
def test_int8_conv_is_its_rounded_arithmetic_and_close_to_fp32(cout, cin, k, d, t):
    """Its integer sums and their scaling, against the same arithmetic in float64 (1e-5: only the order
    of the float scaling differs); and within its rounding of the fp32 conv, SnakeBeta and residual in."""
    w, b, hist, x = conv_case(cout, cin, k, d, t, seed=cout + t)
    res = torch.randn(cout, t, generator=gen(t))
    c = conv.Int8Conv(w, b, d)
    y, new_hist = c(x, hist, residual=res)
    assert rel(y, int8_emulated(w, b, hist, x, d, res)) < SUM_ORDER
    assert torch.equal(new_hist, torch.cat([hist, x], 1)[:, t:]) if k > 1 else new_hist.numel() == 0
    s = snake_of(cin, 2)
    y, _ = c(x, hist, s)
    assert snr_db(y, F.conv1d(torch.cat([hist, snake(x, s)], 1)[None], w, b, dilation=d)[0]) > INT8_CONV_SNR


@INT8
@pytest.mark.parametrize("cin,cout,stride", [(1536, 768, 8), (192, 96, 3)])
def test_int8_transposed_conv_streams_as_the_whole_and_is_close_to_fp32(cin, cout, stride):
    g = gen(6)
    w = torch.randn(cin, cout, 2 * stride, generator=g) / cin ** 0.5
    b = torch.randn(cout, generator=g)
    x = torch.randn(cin, 21, generator=g)
    s = snake_of(cin, 7)
    tc = conv.Int8TransConv(w, b, stride)
    whole, carry = tc(x, None, s)
    ref = F.conv_transpose1d(snake(x, s)[None], w, None, stride=stride)[0]
    assert snr_db(whole, ref[:, :21 * stride] + b[:, None]) > INT8_CONV_SNR
    outs, c = [], None
    for a, e in [(0, 1), (1, 2), (2, 9), (9, 21)]:
        y, c = tc(x[:, a:e], c, s)
        outs.append(y)
    assert torch.equal(torch.cat(outs, 1), whole) and torch.equal(c, carry)


@INT8
def test_every_int8_loop_gives_the_plain_c_sums():
    """The host's SIMD loop (AVX-512 VNNI or ARM's dot product) and the plain C compute the same
    integer sums; only the compiler's fusing of the float scaling may differ (1e-5)."""
    w, b, hist, x = conv_case(64, 96, 7, 3, 70, seed=12)
    plain, _ = conv.Int8Conv(w, b, 3, variant="generic")(x, hist)
    own, _ = conv.Int8Conv(w, b, 3)(x, hist)
    assert conv.int8_path("generic") == "plain C" and conv.int8_path() != "plain C"
    assert rel(own, plain) < SUM_ORDER


@INT8
def test_the_int8_decoder_streams_bit_for_bit_within_its_bound_of_fp32(wide_decoder):
    """int8 in the four DecoderBlocks (their transposed convs and ResidualUnits): frame by frame and in
    uneven chunks the same bits as one whole decode; several streams in one pass each the bits they
    get alone; and within a stated distance of the fp32 decode (random weights: about 25 dB, against
    bf16's 38), not secretly another precision."""
    ck = wide_decoder
    codes = torch.randint(0, 2048, (12, 16), generator=gen(40))
    ref = StreamingDecoder(ck.decoder, ck.config.decoder).decode(codes)
    dec = StreamingDecoder(ck.decoder, ck.config.decoder, "int8")
    assert isinstance(dec.blocks[0][2][0].conv1.native, conv.Int8Conv)
    assert isinstance(dec.blocks[0][1].native, conv.Int8TransConv)
    whole = dec.decode(codes)
    dec.reset()
    cuts = [0, 1, 2, 4, 7, 12]
    assert torch.equal(torch.cat([dec.push(codes[a:e]) for a, e in zip(cuts, cuts[1:])]), whole)
    assert 20 < snr_db(whole, ref) < 35
    if dec.streams_together:
        dec.reset()
        dec.push(codes[:3])
        st = dec.save_state()
        later = dec.push(codes[3:7])
        outs, _ = dec.push_streams([codes[3:7], codes[:2]], [st, dec.fresh_state()])
        dec.reset()
        assert torch.equal(outs[0], later) and torch.equal(outs[1], dec.push(codes[:2]))


NO_BF16 = pytest.mark.skipif("no-bf16" not in native.LOOP_VARIANT_FLAGS or not conv.int8_available("no-bf16"),
                             reason="needs an x86 host with AVX-512 VNNI: its build without AMX and AVX-512 BF16 "
                                    "stands in for a CPU that multiplies int8 but not bf16")


@NO_BF16
def test_without_bf16_the_int8_decoders_linears_are_int8_too(wide_decoder):
    """On a CPU that multiplies int8 but not bf16 (this one's build without AMX and BF16 standing in), the
    stages before the blocks keep fp32 convs, and the transformer's and ConvNeXt blocks' linears (weight-
    bound) are int8 GEMVs at every row count. Within its bound of the fp32 decode; chunked, the fp32
    convs' rounding moves with the call's length (PyTorch's), so a chunked decode is the whole one
    within the int8's own noise, not bit for bit."""
    ck = wide_decoder
    codes = torch.randint(0, 2048, (12, 16), generator=gen(41))
    ref = StreamingDecoder(ck.decoder, ck.config.decoder).decode(codes)
    with native.standing_in("no-bf16"):
        dec = StreamingDecoder(ck.decoder, ck.config.decoder, "int8")
        assert dec.native_transformer is None and dec.layers[0]["down"].packed.fmt == "int8"
        assert dec.upsample[0]["fc1"].packed.fmt == "int8" and dec.conv_in.native is None
        whole = dec.decode(codes)
        dec.reset()
        cuts = [0, 1, 3, 4, 12]
        chunked = torch.cat([dec.push(codes[a:e]) for a, e in zip(cuts, cuts[1:])])
    assert 18 < snr_db(whole, ref) < 35 and snr_db(chunked, whole) > snr_db(whole, ref)
