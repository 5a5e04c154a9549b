"""Build and load the native CPU kernels (``csrc/vo_kernels.cpp``) with ctypes.

The library is compiled just in time, on first use, with the machine's C++ compiler
(``$CXX`` or ``g++``) and ``-O3 -fopenmp``; the ``"native"`` build adds ``-march=native``, so
that it matches the host's instruction set (AVX-512 VNNI, AVX2 or plain C, chosen by
preprocessor macros). The result is cached as ``libvo_kernels-<variant>-<key>.so``, the key a
hash of the sources, the flags, the compiler version and (for ``-march=native``) the CPU's
feature flags, in:

- ``$VLLM_OMNI_NATIVE_DIR`` when set, else ``$XDG_CACHE_HOME/vllm_omni/native``
  (``~/.cache/vllm_omni/native``);
- where that folder cannot be written, a per-user folder under the system's temporary one.

A file lock serialises concurrent builds (pytest-xdist workers, several processes). No torch
headers are used, so a build takes a few seconds. Tensors are passed as raw pointers
(``tensor.data_ptr()``); the Python side owns every buffer.

``variant`` selects the instruction set: ``"native"`` (the host's best), ``"avx2"``
(AVX2 + FMA + F16C, the AVX2-only path) or ``"generic"`` (plain C fallback); the last two let
tests check the fallbacks on an AVX-512 machine. On an ARM (aarch64) host the variants are
``"native"`` (``-mcpu=native``: the NEON dot-product loops where the core has them),
``"dotprod"`` (Armv8.2-A with the dot product) and ``"generic"`` (Armv8.0, plain C), all with
floating-point contraction off, as the emulated builds that prove them (``cpu.cross``).
"""

from __future__ import annotations

import ctypes
import fcntl
import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("vo_kernels.cpp", "vo_decoder.cpp")
BASE_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno")
X86_VARIANT_FLAGS = {
    "native": ("-march=native",),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "generic": ("-march=x86-64",),
}
ARM_VARIANT_FLAGS = {
    "native": ("-mcpu=native", "-ffp-contract=off"),
    "dotprod": ("-march=armv8.2-a+dotprod", "-ffp-contract=off"),
    "generic": ("-march=armv8-a", "-ffp-contract=off"),
}
VARIANT_FLAGS = ARM_VARIANT_FLAGS if platform.machine() in ("aarch64", "arm64") else X86_VARIANT_FLAGS
# Builds that exist to run one loop on a host that would pick another (tests, benchmarks), not
# offered as a choice: "no-amx" is the host's build without AMX, so that an AMX host runs the
# AVX-512 BF16 convolution loop of the hosts without AMX (Zen 4, Zen 5); "no-bf16" is also without
# AVX-512 BF16, the instruction set of the hosts with AVX-512 VNNI alone (Ice Lake, Cascade Lake).
_NO_AMX = ("-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8")
LOOP_VARIANT_FLAGS = {} if VARIANT_FLAGS is ARM_VARIANT_FLAGS else {
    "no-amx": _NO_AMX,
    "no-bf16": _NO_AMX + ("-mno-avx512bf16",),
}
ISA_NAMES = {0: "generic C", 1: "AVX2", 2: "AVX-512 VNNI", 3: "NEON dot product"}


class NativeBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded."""


def cache_dir() -> Path:
    env = os.environ.get("VLLM_OMNI_NATIVE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm_omni" / "native"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise NativeBuildError(
            f"C++ compiler {cxx!r} not found: the native CPU kernels are compiled on first use; "
            "install g++ (e.g. `apt-get install g++`) or point $CXX at a compiler"
        )
    return path


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, aarch64
                    return line.strip()
    except OSError:
        pass
    return ""


def _build_key(cxx: str, flags: tuple[str, ...], sources: tuple[Path, ...]) -> str:
    """The build's name: its sources, every header they may include (``csrc``'s, so that an edit of an
    ISA file alone makes a new build), the flags and the compiler."""
    h = hashlib.sha256()
    for path in (*sources, *sorted(CSRC.rglob("*.h"))):
        h.update(path.read_bytes())
    h.update(" ".join(flags).encode())
    try:
        h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.encode())
    except (OSError, subprocess.TimeoutExpired):
        h.update(cxx.encode())
    if "-march=native" in flags or "-mcpu=native" in flags:
        h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def writable_cache_dir() -> Path:
    """``cache_dir()``, made; a per-user temporary folder where it cannot be written."""
    out_dir = cache_dir()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(out_dir, os.W_OK):
            raise PermissionError(str(out_dir))
    except OSError:  # read-only home: fall back to a per-user temporary folder
        out_dir = Path(tempfile.gettempdir()) / f"vllm_omni-native-{os.getuid()}"
        out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def compile_cached(cxx: str, flags: tuple[str, ...], sources: tuple[Path, ...], stem: str, suffix: str) -> Path:
    """``cxx flags sources -o STEM-KEY{suffix}`` in the cache folder unless that build exists (KEY: the sources,
    flags and compiler); older builds of the same stem are removed. Never half-written: built under a temporary
    name, renamed when complete, one build at a time."""
    out_dir = writable_cache_dir()
    out = out_dir / f"{stem}-{_build_key(cxx, flags, sources)}{suffix}"
    if out.exists():
        return out
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if out.exists():
                return out
            fd, tmp = tempfile.mkstemp(suffix=suffix or ".bin", dir=out_dir)
            os.close(fd)
            cmd = [cxx, *flags, *(str(p) for p in sources), "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                os.unlink(tmp)
                raise NativeBuildError(f"compiling the native kernels failed:\n$ {' '.join(cmd)}\n{proc.stderr[-4000:]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
            for old in out_dir.glob(f"{stem}-*{suffix}"):  # builds of older sources
                if old != out and old.name[len(stem) + 1:len(old.name) - len(suffix)].isalnum():
                    old.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def build(variant: str = "native") -> Path:
    """Compile the library for ``variant`` unless a cached build exists; return its path."""
    table = {**VARIANT_FLAGS, **LOOP_VARIANT_FLAGS}
    if variant not in table:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(table)}")
    cxx = _compiler()
    rows = f32_rows_setting(variant)
    flags = BASE_FLAGS + table[variant] + ((f"-DVO_F32_STREAMS={rows}",) if rows else ())
    return compile_cached(cxx, flags, tuple(CSRC / s for s in SOURCES), f"libvo_kernels-{variant}", ".so")


# --- ctypes mirrors of the C structs (keep in the same order as vo_kernels.cpp) ----------------

class VoMat(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("s", ctypes.c_void_p), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64)]


class VoLayer(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
        ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
        ("qkv", VoMat), ("o", VoMat), ("gate_up", VoMat), ("down", VoMat),
        ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
    ]


class VoStack(ctypes.Structure):
    _fields_ = [
        ("fmt", ctypes.c_int32), ("n_layers", ctypes.c_int32), ("hidden", ctypes.c_int32),
        ("inter", ctypes.c_int32), ("heads", ctypes.c_int32), ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32), ("max_pos", ctypes.c_int32), ("threads", ctypes.c_int32),
        ("eps", ctypes.c_float), ("kv_f16", ctypes.c_int32),
        ("layers", ctypes.POINTER(VoLayer)), ("final_norm", ctypes.c_void_p),
        ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
        ("ws", ctypes.c_void_p), ("ws_bytes", ctypes.c_int64),
    ]


class VoSeg(ctypes.Structure):  # vo_decoder.cpp: one stream's part of a decoder call
    _fields_ = [("x", ctypes.c_void_p), ("x_stride", ctypes.c_int64), ("T", ctypes.c_int64),
                ("hist", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("y_stride", ctypes.c_int64), ("new_hist", ctypes.c_void_p)]


class VoDecPart(ctypes.Structure):  # vo_decoder.cpp: one stream's part of a transformer call
    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("T", ctypes.c_int64), ("rope_cos", ctypes.c_void_p),
                ("rope_sin", ctypes.c_void_p), ("P", ctypes.c_int64), ("past_k", ctypes.c_void_p),
                ("past_v", ctypes.c_void_p), ("new_k", ctypes.c_void_p), ("new_v", ctypes.c_void_p)]


class VoDecLayer(ctypes.Structure):  # vo_decoder.cpp
    _fields_ = [("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p),
                ("down", ctypes.c_void_p), ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p)]


class VoDecTransformer(ctypes.Structure):  # vo_decoder.cpp
    _fields_ = [
        ("n_layers", ctypes.c_int32), ("latent", ctypes.c_int32), ("hidden", ctypes.c_int32),
        ("inter", ctypes.c_int32), ("heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("window", ctypes.c_int32), ("eps", ctypes.c_float),
        ("in_proj", ctypes.c_void_p), ("in_bias", ctypes.c_void_p), ("out_proj", ctypes.c_void_p),
        ("out_bias", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("layers", ctypes.POINTER(VoDecLayer)),
    ]


P = ctypes.c_void_p
_I32, _I64, _F32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "vo_version": (_I32, []),
    "vo_max_tokens": (_I32, []),
    "vo_isa": (_I32, []),
    "vo_workspace_bytes": (_I64, [ctypes.POINTER(VoStack), _I64]),
    "vo_stack_forward": (_I32, [ctypes.POINTER(VoStack), P, _I32, _I32, P, ctypes.POINTER(VoMat), P]),
    "vo_stack_forward_rows": (_I32, [ctypes.POINTER(VoStack), P, _I32, P, P, P, ctypes.POINTER(VoMat), P, _I32]),
    "vo_talker_step": (_I32, [ctypes.POINTER(VoStack), ctypes.POINTER(VoMat), P, _I32, P, P]),
    "vo_predictor_frame": (_I32, [
        ctypes.POINTER(VoStack), ctypes.POINTER(VoMat), _I32, P, _I64, ctypes.POINTER(VoMat), P, P, P,
        _I32, _F32, _I32, P, ctypes.c_uint64, P, P, P,
    ]),
    "vo_predictor_frames": (_I32, [
        ctypes.POINTER(VoStack), ctypes.POINTER(VoMat), _I32, P, _I64, ctypes.POINTER(VoMat), P, _I32, P, P, P,
        _I32, _F32, _I32, P, P, P, P, P, P,
    ]),
    "vo_max_streams": (_I32, []),
    "vo_counter_uniforms": (None, [ctypes.c_uint64, ctypes.c_uint64, _I64, P]),
    "vo_linear": (_I32, [_I32, ctypes.POINTER(VoMat), P, _I32, P, _I32]),
    "vo_swiglu": (None, [P, P, P, _I32]),
    "vo_talker_sample": (_I64, [P, _I64, P, _I64, _F32, _I64, _I64, _I32, _F32, _I32, _F32, ctypes.c_uint64,
                                ctypes.c_uint64, P]),
    "vo_read_bandwidth": (ctypes.c_double, [_I64, _I32, _I32, _I32, P]),
    "vo_clock_ghz": (ctypes.c_double, [_I64]),
    "vo_core_round_trip_ns": (ctypes.c_double, [_I64]),
    "vo_set_q4_prefetch": (_I32, [_I32]),
    "vo_f32_streams": (_I32, []),
    "vo_gemv_sweeps": (_I32, [_I32, ctypes.POINTER(VoMat), _I32, P, _I64, P, _I32, _I32, P]),
    "vo_read_sweeps": (_I32, [_I32, ctypes.POINTER(VoMat), _I32, _I32, _I32, P, ctypes.POINTER(_I64)]),
    "vo_snake": (None, [P, P, _I64, _I64, P, P, _I32]),
    "vo_conv_bf16_path": (_I32, []),
    "vo_conv_pack_bf16": (_I32, [P, _I64, _I64, _I64, P]),
    "vo_conv_i8_path": (_I32, []),
    "vo_conv_pack_i8": (_I32, [P, _I64, _I64, _I64, P, P, P]),
    "vo_conv_i8": (_I32, [P, P, P, P, _I64, _I64, _I64, _I64, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_tconv_i8": (_I32, [P, P, P, P, _I64, _I64, _I64, _I64, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_conv_bf16": (_I32, [P, P, _I64, _I64, _I64, _I64, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_tconv_bf16": (_I32, [P, P, _I64, _I64, _I64, _I64, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_dec_transformer": (_I32, [ctypes.POINTER(VoDecTransformer), ctypes.POINTER(VoDecPart), _I64, _I32]),
    "vo_res_unit_bf16": (_I32, [P, P, P, P, _I64, _I64, _I64, P, P, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_convnext_bf16": (_I32, [P, P, _I64, _I64, P, P, _F32, P, P, _I64, P, P, ctypes.POINTER(VoSeg), _I64, _I32]),
    "vo_conv_f32_narrow": (_I32, [P, P, _I64, _I64, _I64, _I64, P, P, _I64, P, P, P, P, _I32]),
}
FMT_CODES = {"fp32": 0, "int8": 1, "int4": 2}

_LIBS: dict[str, ctypes.CDLL] = {}
_Q4_PREFETCH: dict[str, int | None] = {}
Q4_PREFETCH_ENV = "VLLM_OMNI_Q4_PREFETCH"
# (x86 family, model) -> int4 groups ahead, where the AVX2 build's prefetch was measured to help
Q4_PREFETCH_HOSTS = {(23, 1): 8}
F32_ROWS_ENV = "VLLM_OMNI_F32_ROWS"
F32_ROWS_CHOICES = (1, 2, 4)
# (x86 family, model) -> fp32 rows read side by side by the native build, where more rows than
# its default (one with AVX-512, four in the AVX2-only build) were measured to help
F32_ROWS_HOSTS = {(6, 167): 4}


@contextlib.contextmanager
def standing_in(variant: str):
    """While open, the "native" build (what ``load()`` and every kernel wrapper get by default) is the
    ``variant`` build, so that a benchmark runs another CPU's loops on this one ("no-bf16": those of a
    CPU with AVX-512 VNNI alone). Not thread-safe; for benchmarks and tests."""
    lib = load(variant)
    saved = _LIBS.get("native")
    _LIBS["native"] = lib
    try:
        yield lib
    finally:
        if saved is None:
            _LIBS.pop("native", None)
        else:
            _LIBS["native"] = saved


def load(variant: str = "native") -> ctypes.CDLL:
    """The loaded library for ``variant`` (built on first use)."""
    if variant in _LIBS:
        return _LIBS[variant]
    if "torch" not in sys.modules:
        # torch ships its own libgomp; importing it first keeps one OpenMP runtime per process.
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    path = build(variant)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeBuildError(f"loading {path} failed: {exc}") from exc
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    groups = lib.vo_set_q4_prefetch(q4_prefetch_groups())
    _Q4_PREFETCH[variant] = groups if groups >= 0 else None
    _LIBS[variant] = lib
    return lib


def q4_prefetch_groups() -> int:
    """How many int4 groups ahead the AVX2 build prefetches its int4 tiles (0: not at all).

    ``$VLLM_OMNI_Q4_PREFETCH`` when set (0 to 64); else the distance measured to help on this
    host's x86 family and model (``Q4_PREFETCH_HOSTS``), and 0 elsewhere. Measured both ways:
    8 groups ahead made the int4 pass about a third faster on a first-generation EPYC, and the
    same prefetch made it an eighth to two fifths slower on a Zen 4 running the AVX2 build
    (docs/analysis/cpu-kernels/). The AVX-512 and plain-C builds never prefetch."""
    text = os.environ.get(Q4_PREFETCH_ENV)
    if text is not None:
        try:
            groups = int(text)
        except ValueError:
            groups = -1
        if not 0 <= groups <= 64:
            raise ValueError(f"{Q4_PREFETCH_ENV}={text!r} is not a whole number of int4 groups from 0 to 64; "
                             "unset it for this host's default, or give 0 (no prefetch) or e.g. 8")
        return groups
    return Q4_PREFETCH_HOSTS.get(_host_key(), 0)


def _host_key() -> tuple[int, int] | None:
    """This CPU's (x86 family, model), the key of the per-host kernel settings; None if unknown."""
    from vllm_omni.results.provenance import cpuinfo

    ident = cpuinfo()["cpu_id"] or ""
    parts = dict(p.split() for p in ident.split(", ") if len(p.split()) == 2)
    try:
        return int(parts["family"]), int(parts["model"])
    except (KeyError, ValueError):
        return None


def f32_rows_setting(variant: str = "native") -> int | None:
    """How many fp32 rows the GEMVs of the ``variant`` build are to read side by side, or None for
    the build's default (``F32_STREAMS`` in the source: four in the AVX2-only build, one in the
    others).

    ``$VLLM_OMNI_F32_ROWS`` when set (1, 2 or 4), in every build; else, in the native build, the
    count measured to help on this host's x86 family and model (``F32_ROWS_HOSTS``). On the Xeon
    of family 6, model 167, four rows took the native fp32 pass 4 to 8 % less time than one at 1
    and 2 threads (three pairs of runs, alternated), and two about as little as four; on the
    Zen 4 host, with an earlier layout, one row did best (docs/analysis/cpu-kernels/). The
    count is a compile-time constant, so it enters the build's flags (``-DVO_F32_STREAMS``) and
    its cache key. A row's result is the same whatever the count."""
    text = os.environ.get(F32_ROWS_ENV)
    if text is not None:
        if text.strip() not in {str(n) for n in F32_ROWS_CHOICES}:
            raise ValueError(f"{F32_ROWS_ENV}={text!r} is not one of {', '.join(map(str, F32_ROWS_CHOICES))} "
                             "(fp32 rows read side by side); unset it for this host's default")
        return int(text)
    return F32_ROWS_HOSTS.get(_host_key()) if variant == "native" else None


def q4_prefetch(variant: str = "native") -> int | None:
    """The int4 prefetch distance in force in the loaded ``variant`` (groups), None where the build
    has no such prefetch: what a benchmark records beside its timings."""
    load(variant)
    return _Q4_PREFETCH[variant]


def kernel_settings(variant: str = "native", used: bool = True) -> dict[str, int | None]:
    """The per-host settings in force in the loaded ``variant``, which a benchmark records beside
    its timings: the int4 prefetch distance (``q4_prefetch``) and the fp32 rows read side by
    side (``F32_STREAMS``); both null where the run did not use the kernels (``used``)."""
    if not used:
        return {"q4_prefetch_groups": None, "f32_rows": None}
    return {"q4_prefetch_groups": q4_prefetch(variant), "f32_rows": load(variant).vo_f32_streams()}


def isa(variant: str = "native") -> str:
    """The instruction-set path the library for ``variant`` was compiled with."""
    return ISA_NAMES[load(variant).vo_isa()]
