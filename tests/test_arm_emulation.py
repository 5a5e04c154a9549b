"""The native kernels cross-compiled for aarch64 and run under qemu-user (vllm_omni.cpu.cross),
against the x86 builds of the same source on the same inputs: bit for bit against the plain C++
build (the int4 and int8 loops keep its order of arithmetic, and so does the decoder's int8 conv;
the NEON fp32 dots fuse and reorder, so they are held to the fp32 tolerance), within the x86
tests' tolerances against this host's own build and the eager reference. Several emulated cores:
Cortex-A53 (Armv8.0, the plain C loops), Cortex-A76 and Neoverse-N1 (Armv8.2-A with the dot
product: arch/arm's NEON loops) and qemu's ``max`` (every extension it knows: the decoder's bf16
conv runs BFDOT there). Then the whole generation loop on each core: a small checkpoint's greedy
codes (``vllm_omni.cpu.cross_remote``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.cpu import cross, native
from vllm_omni.cpu.quant import dequantize, quantize

reason = cross.toolchain_missing()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

RUNS = [(target, cpu) for target, (_, cpus) in cross.TARGETS.items() for cpu in cpus]


class Arm:
    """One target's driver on one emulated core: ``arm(case)`` runs a case; ``neon`` says which loops it runs."""

    def __init__(self, target: str, cpu: str):
        self.target, self.cpu, self.binary = target, cpu, cross.build(target)
        self.neon = target != "armv8-a"

    def __call__(self, case: bytes) -> np.ndarray:
        return cross.run(self.binary, self.cpu, case)


@pytest.fixture(scope="module", params=RUNS, ids=lambda r: f"{r[0]}@{r[1]}")
def arm(request):
    return Arm(*request.param)


def packed(fmt: str, rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(rows, cols, generator=g) * 0.05, fmt)


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("m_rows, rows, cols", [(1, 96, 320), (3, 96, 320), (2, 64, 2048)])
def test_linear_equals_the_x86_builds(arm, fmt, m_rows, rows, cols):
    m = packed(fmt, rows, cols, seed=m_rows)
    x = np.random.default_rng(m_rows).standard_normal((m_rows, cols)).astype(np.float32)
    y = arm(cross.matrix_case(m, x)).reshape(m_rows, rows)
    plain = cross.host_linear("generic", m, x)
    eager = x @ dequantize(m).numpy().T
    if fmt == "fp32" and arm.neon:  # NEON fused multiply-adds, summed in another order: within rounding
        assert np.abs(y - plain).max() <= 1e-5 * np.abs(eager).max()
    else:  # the plain C, or the int8/int4 loops that keep its order: the same bits
        assert np.array_equal(y, plain)
    tol = {"fp32": 1e-5, "int8": 2e-2, "int4": 2e-2}[fmt]  # int8/int4: activations quantised per block too
    assert np.abs(y - cross.host_linear("native", m, x)).max() <= tol * np.abs(eager).max()
    assert np.abs(y - eager).max() <= tol * np.abs(eager).max()


def test_a_bad_shape_is_refused_by_the_arm_kernel_as_by_the_x86_one(arm):
    m = packed("int8", 32, 64, seed=0)
    bad = cross.linear_case("int8", m.data.numpy().tobytes(), m.scale.numpy().tobytes(), 32, 63, np.zeros(63))
    with pytest.raises(cross.EmulationError, match="refused the case"):
        arm(bad)


def test_swiglu_sampling_uniforms_and_snake_equal_the_generic_build(arm):
    lib = native.load("generic")
    rng = np.random.default_rng(7)
    g, u = (rng.standard_normal(1000).astype(np.float32) * 4 for _ in range(2))
    out = np.zeros(1000, np.float32)
    lib.vo_swiglu(g.ctypes.data, u.ctypes.data, out.ctypes.data, 1000)
    assert np.array_equal(arm(cross.swiglu_case(g, u)), out)

    uni = np.zeros(4096, np.float32)
    lib.vo_counter_uniforms(0xC0FFEE, 123, 4096, uni.ctypes.data)
    assert np.array_equal(arm(cross.uniforms_case(0xC0FFEE, 123, 4096)), uni)

    x = rng.standard_normal((96, 400)).astype(np.float32) * 3
    a, b = rng.uniform(0.5, 2, 96).astype(np.float32), rng.uniform(0.5, 2, 96).astype(np.float32)
    y = np.zeros_like(x)
    lib.vo_snake(x.ctypes.data, y.ctypes.data, 96, 400, a.ctypes.data, b.ctypes.data, 2)
    got = arm(cross.snake_case(x, a, b)).reshape(96, 400)
    assert np.array_equal(got, y)
    assert np.abs(got - (x + b[:, None] * np.sin(a[:, None] * x) ** 2)).max() < 1e-5


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_the_decoders_convs_equal_the_x86_builds(arm, precision):
    """The decoder's native conv (SnakeBeta, history, bias) under emulation. bf16: the plain C loop of
    the Armv8.0 and Armv8.2-A builds gives the x86 plain C build's bits; the Armv8.6-A build's BFDOT
    loop sums the same products in another order (and BFDOT's own rounding), so it is held to the
    host's AMX or AVX-512 result within 1e-5 of the largest output, as the x86 loops are to each
    other. int8: the dot-product loop (Armv8.2-A and later) and the plain C sum the same integers as
    the x86 plain C build and scale them in its order, so every core gives its bits."""
    from vllm_omni.cpu import conv

    rng = np.random.default_rng(11)
    cout, cin, k, d, t = 64, 96, 7, 3, 40
    w = (rng.standard_normal((cout, cin, k)) / np.sqrt(cin * k)).astype(np.float32)
    bias, hist = rng.standard_normal(cout).astype(np.float32), rng.standard_normal((cin, (k - 1) * d)).astype(np.float32)
    x = rng.standard_normal((cin, t)).astype(np.float32)
    a, ib = rng.uniform(0.5, 1.5, cin).astype(np.float32), rng.uniform(0, 1, cin).astype(np.float32)
    out = arm(cross.conv_case(w, bias, hist, x, a, ib, d, precision=precision))
    y, new_hist = out[:cout * t].reshape(cout, t), out[cout * t:].reshape(cin, -1)
    kind, fast = (conv.Bf16Conv, conv.available()) if precision == "bf16" else (conv.Int8Conv, conv.int8_available())

    def host(variant):
        c = kind(torch.from_numpy(w), torch.from_numpy(bias), d, variant=variant)
        got, h = c(torch.from_numpy(x), torch.from_numpy(hist), (torch.from_numpy(a), torch.from_numpy(ib)))
        return got.numpy(), h.numpy()

    plain, plain_hist = host("generic")
    assert np.array_equal(new_hist, plain_hist)
    if precision == "bf16" and arm.target == "armv8.6-a+i8mm+bf16":
        assert np.abs(y - plain).max() <= 1e-5 * np.abs(plain).max() and not np.array_equal(y, plain)
    else:
        assert np.array_equal(y, plain)
    if fast:
        assert np.abs(y - host("native")[0]).max() <= 1e-5 * np.abs(plain).max()


def test_a_cut_case_file_is_an_error_naming_the_binary_and_the_core(arm):
    case = cross.swiglu_case(np.ones(64), np.ones(64))
    with pytest.raises(cross.EmulationError, match=r"vo_driver-.* on .* exited 2: .*cut short"):
        arm(case[:-4])


def test_each_target_runs_the_loops_meant_for_it():
    """The GEMVs' loops, and the decoder's int8 conv: plain C on Armv8.0, SDOT with the dot product,
    SMMLA with i8mm."""
    a53 = cross.build("armv8-a")
    assert (cross.isa(a53, "cortex-a53"), cross.int8_conv_path(a53, "cortex-a53")) == ("generic C", "plain C")
    for target, conv_loop in (("armv8.2-a+dotprod", "NEON dot product"), ("armv8.6-a+i8mm+bf16", "NEON i8mm")):
        cpu = cross.TARGETS[target][1][0]
        assert cross.isa(cross.build(target), cpu) == "NEON dot product"
        assert cross.int8_conv_path(cross.build(target), cpu) == conv_loop


def test_a_core_without_the_dot_product_stops_at_the_first_sdot():
    """Cortex-A53 (Armv8.0) lacks SDOT: the dot-product build's int8 GEMV stops there, and says so."""
    m = packed("int8", 32, 64, seed=0)
    case = cross.linear_case("int8", m.data.numpy().tobytes(), m.scale.numpy().tobytes(), 32, 64, np.ones((1, 64)))
    with pytest.raises(cross.EmulationError, match="on cortex-a53 exited -4 .SIGILL"):
        cross.run(cross.build("armv8.2-a+dotprod"), "cortex-a53", case)


def test_unknown_targets_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown ARM target 'armv9'; valid: armv8-a, armv8.2-a"):
        cross.build("armv9")


@pytest.mark.parametrize("variant", ["dotprod", "generic"])
def test_an_arm_hosts_own_builds_compile(variant, tmp_path):
    """What ``native.build`` runs on an aarch64 host, cross-compiled here (all but -mcpu=native, which
    names the host's own core)."""
    import subprocess

    flags = native.BASE_FLAGS + native.ARM_VARIANT_FLAGS[variant]
    out = tmp_path / f"libvo_kernels-{variant}.so"
    proc = subprocess.run([cross.CROSS_CXX, *flags, *(str(native.CSRC / s) for s in native.SOURCES), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes()[:4] == b"\x7fELF" and out.read_bytes()[18] == 183  # e_machine: EM_AARCH64


def test_an_arm_hosts_cpuinfo_names_its_core_and_features():
    from vllm_omni.results.provenance import parse_cpuinfo

    pi5 = "\n\n".join(
        f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
        "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
        "CPU variant\t: 0x4\nCPU part\t: 0xd0b\nCPU revision\t: 1" for i in range(4))
    info = parse_cpuinfo(pi5)
    assert info["model"] == "Cortex-A76" and info["logical_cpus"] == 4
    assert info["cpu_id"] == "implementer 0x41, part 0xd0b, variant 0x4, revision 1"
    assert {"asimd", "asimddp"} <= info["flags"] and "i8mm" not in info["flags"]
    x86 = parse_cpuinfo("processor : 0\ncpu family : 6\nmodel : 167\nstepping : 1\nmodel name : Intel Xeon\n"
                        "flags : fpu avx2 avx512f\n")
    assert x86["cpu_id"] == "family 6, model 167, stepping 1" and x86["model"] == "Intel Xeon"


# --- the whole generation loop on ARM (vllm_omni.cpu.cross_remote) -----------------------------

SMALL = dict(talker_layers=2, predictor_layers=1, decoder_layers=1, text_hidden=256, decoder_dim=384)
FRAMES = 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small checkpoint in the official layout (the published widths, two talker layers and one predictor
    layer), and its prompt."""
    from vllm_omni.tts.checkpoint import load_checkpoint
    from vllm_omni.tts.prompt import build_prompt
    from vllm_omni.tts.random_checkpoint import write_random_checkpoint

    ckpt = load_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("arm") / "small", "0.6B", dtype="fp32",
                                                   **SMALL))
    return ckpt, build_prompt(ckpt, "Hello there, from the edge.", speaker="ryan", language="english")


@pytest.fixture(scope="module")
def generators(small):
    from vllm_omni.tts.generate import CodeGenerator

    return {fmt: CodeGenerator(small[0], fmt, threads=2, max_positions=64, cache=False, share_cores=False)
            for fmt in ("int4", "int8", "fp32")}


def greedy_codes(gen, prompt) -> torch.Tensor:
    from vllm_omni.tts.generate import Sampling

    return torch.stack(list(gen.generate(prompt, Sampling(greedy=True), max_frames=FRAMES)))


CODE_RUNS = [("int4", target, cpu) for target, cpu in RUNS] + [
    ("int8", "armv8.2-a+dotprod", "cortex-a76"), ("fp32", "armv8.2-a+dotprod", "cortex-a76"),
    ("int8", "armv8-a", "cortex-a53")]


@pytest.mark.parametrize("fmt, target, cpu", CODE_RUNS, ids=lambda v: str(v))
def test_the_greedy_codes_of_a_small_checkpoint_on_arm_are_this_hosts(small, generators, fmt, target, cpu):
    """The production loop (``CodeGenerator.generate``: prefill, c0, the predictor's frames, the next
    input) with every native call on the emulated core gives the codes this host's own build gives."""
    from vllm_omni.cpu import cross_remote

    gen, prompt = generators[fmt], small[1]
    host = greedy_codes(gen, prompt)
    with cross_remote.on_arm(gen, target, cpu) as on_arm:
        codes = greedy_codes(gen, prompt)
        assert native.ISA_NAMES[on_arm.vo_isa()] == ("generic C" if target == "armv8-a" else "NEON dot product")
    assert on_arm.calls > FRAMES  # the talker's and the predictor's calls ran there
    assert codes.shape == (FRAMES, 16) and torch.equal(codes, host)


@pytest.mark.parametrize("fmt", ["int4", "fp32"])
def test_the_talkers_prompt_rows_on_arms_plain_c_are_the_x86_plain_c_bits(small, generators, fmt):
    """Beneath the codes: the talker's hidden states and logits over the whole prompt, through every
    layer (the GEMVs, the norms, the attention over an fp16 or fp32 cache), are the same bits on the
    Armv8.0 build as on the x86 plain C build, and within the kernels' tolerance of this host's own."""
    from vllm_omni.cpu import cross_remote

    gen, prompt = generators[fmt], small[1]
    rows = prompt.prefill[: gen.talker.lib.vo_max_tokens()]
    stack = gen.talker.native

    def run():
        caches = stack.new_cache()
        return stack.forward_rows(rows, list(range(len(rows))), [caches] * len(rows), head=gen.talker.head)

    with cross_remote.calling(gen, native.load("generic")):
        plain = run()
    with cross_remote.on_arm(gen, "armv8-a", "cortex-a53"):
        arm = run()
    own = run()
    tol = {"int4": 2e-2, "fp32": 1e-4}[fmt]  # int4: this host's loops quantise the activations by block
    for got, want, mine in zip(arm, plain, own):
        assert torch.equal(got, want)
        assert (got - mine).abs().max() <= tol * mine.abs().max()


def test_a_call_arm_does_not_run_is_refused_by_name(generators):
    from vllm_omni.cpu import cross_remote

    gen = generators["int4"]
    with cross_remote.on_arm(gen, "armv8-a", "cortex-a53"):
        with pytest.raises(AttributeError, match="vo_talker_step is not run on ARM"):
            gen.talker.step(torch.zeros(gen.talker.hidden))
    assert gen.talker.lib is gen.talker.native.lib is native.load()  # the host's build again
