"""The native kernels on ARM, proven on this x86 machine: cross-compiled for aarch64 and run under qemu.

Why emulation: the edge's CPUs are ARM (Cortex-A76 in a Raspberry Pi 5, A78AE in a Jetson Orin,
Neoverse in Graviton), and no ARM machine is at hand. Debian's ``g++-aarch64-linux-gnu`` builds
the kernels (``csrc/vo_kernels.cpp``, ``csrc/vo_decoder.cpp``) with a small command-line driver
(``csrc/driver/vo_driver.cpp``: Python is not needed on the ARM side) into one static binary
per target, and ``qemu-aarch64`` runs it as a given core would decode it: ``cortex-a76`` (dot
product, no i8mm or bf16), ``neoverse-n1``, or ``max`` (every extension qemu knows). A core that
lacks an instruction the build used stops with SIGILL, so each target runs only on cores that
have its extensions.

What is compared: the ARM build computes the same thing as the x86 builds on the same inputs.
The cross builds turn off floating-point contraction (``-ffp-contract=off``, an ARM compiler
would otherwise fuse multiply-adds), so that with the same code path as x86's ``generic`` build
(plain C++; the AVX paths are x86-only) the results can be compared bit for bit. Emulated time
says nothing about a device's time and is never reported as one.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from vllm_omni.cpu.native import CSRC, SOURCES, NativeBuildError, compile_cached

CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
DRIVER = CSRC / "driver" / "vo_driver.cpp"
FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-static")
# target -> (-march, qemu CPU models that have its extensions). Armv8.0 has no dot product: its
# build runs the plain C loops, as the x86 generic build does; the others run arch/arm's NEON.
TARGETS = {
    "armv8-a": ("-march=armv8-a", ("cortex-a53",)),
    "armv8.2-a+dotprod": ("-march=armv8.2-a+dotprod", ("cortex-a76", "neoverse-n1")),
    "armv8.6-a+i8mm+bf16": ("-march=armv8.6-a+i8mm+bf16", ("max",)),
}
KIND_LINEAR, KIND_SWIGLU, KIND_UNIFORMS, KIND_SNAKE, KIND_CONV, KIND_CONV_I8 = 0, 1, 2, 3, 4, 5
FMT_CODES = {"fp32": 0, "int8": 1, "int4": 2}


class EmulationError(RuntimeError):
    """The driver refused a case or failed under emulation."""


def toolchain_missing() -> str | None:
    """Why the ARM builds cannot run here (the Debian packages to install), or None."""
    missing = [pkg for tool, pkg in ((CROSS_CXX, "g++-aarch64-linux-gnu"), (QEMU, "qemu-user"))
               if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (Debian packages; `make test` installs them as root)" if missing else None


def build(target: str) -> Path:
    """The static aarch64 driver for ``target`` (cached beside the native library builds)."""
    if target not in TARGETS:
        raise ValueError(f"unknown ARM target {target!r}; valid: {', '.join(TARGETS)}")
    if shutil.which(CROSS_CXX) is None:
        raise NativeBuildError(f"{CROSS_CXX} not found: install Debian's g++-aarch64-linux-gnu")
    sources = tuple(CSRC / s for s in SOURCES) + (DRIVER,)
    return compile_cached(shutil.which(CROSS_CXX), FLAGS + (TARGETS[target][0],), sources,
                          f"vo_driver-{target.replace('+', '_')}", "")


def run(binary: Path, cpu: str, case: bytes, timeout_s: float = 600) -> np.ndarray:
    """The float32 results of ``case`` (from the ``*_case`` writers) run by ``binary`` on qemu's ``cpu``."""
    return _run(binary, cpu, case, timeout_s)[0]


def isa(binary: Path, cpu: str) -> str:
    """The instruction-set path ``binary`` was compiled with (``native.ISA_NAMES``), as it reports it."""
    from vllm_omni.cpu.native import ISA_NAMES

    return ISA_NAMES[_paths(binary, cpu)["isa"]]


def int8_conv_path(binary: Path, cpu: str) -> str:
    """The loop of the decoder's int8 conv in ``binary`` (``conv.INT8_PATHS``), as it reports it."""
    from vllm_omni.cpu.conv import INT8_PATHS

    return INT8_PATHS[_paths(binary, cpu)["int8_conv"]]


def _paths(binary: Path, cpu: str) -> dict[str, int]:
    out = _run(binary, cpu, uniforms_case(0, 0, 1), 600)[1]
    return {name: int(code) for name, code in (line.split() for line in out.splitlines() if line.strip())}


def _run(binary: Path, cpu: str, case: bytes, timeout_s: float) -> tuple[np.ndarray, str]:
    with tempfile.TemporaryDirectory(prefix="vo-arm-") as tmp:
        src, out = Path(tmp) / "case.bin", Path(tmp) / "out.bin"
        src.write_bytes(case)
        proc = subprocess.run([QEMU, "-cpu", cpu, str(binary), str(src), str(out)], capture_output=True, text=True,
                              timeout=timeout_s)
        if proc.returncode != 0:
            what = " (SIGILL: an instruction this core lacks)" if proc.returncode == -4 else ""
            raise EmulationError(f"{binary.name} on {cpu} exited {proc.returncode}{what}: "
                                 f"{proc.stderr.strip()[-2000:]}")
        return np.fromfile(out, dtype="<f4"), proc.stdout


def matrix_case(m, x: np.ndarray) -> bytes:
    """``linear_case`` of a packed ``vllm_omni.cpu.quant.QuantMatrix``."""
    w = m.data.contiguous().numpy().tobytes()
    s = b"" if m.scale is None else m.scale.contiguous().numpy().tobytes()
    return linear_case(m.fmt, w, s, m.rows, m.cols, x)


def host_linear(variant: str, m, x: np.ndarray) -> np.ndarray:
    """The same ``vo_linear`` on this host's ``variant`` build of the kernels: what the ARM run is compared with."""
    import ctypes

    from vllm_omni.cpu import native

    lib = native.load(variant)
    mat = native.VoMat(m.data.data_ptr(), 0 if m.scale is None else m.scale.data_ptr(), m.rows, m.cols)
    xs = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1, m.cols))
    y = np.zeros((xs.shape[0], m.rows), np.float32)
    if lib.vo_linear(native.FMT_CODES[m.fmt], ctypes.byref(mat), xs.ctypes.data, xs.shape[0], y.ctypes.data, 2) != 0:
        raise ValueError(f"vo_linear refused a {m.fmt} matrix of {m.rows} x {m.cols}")
    return y


def _f32(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a, dtype="<f4")).tobytes()


def linear_case(fmt: str, w: bytes, s: bytes, rows: int, cols: int, x: np.ndarray) -> bytes:
    """``vo_linear`` of packed weights ``w`` (and scales ``s``, int8) [rows, cols] over ``x`` [M, cols]."""
    m = int(np.asarray(x).reshape(-1, cols).shape[0])
    return (struct.pack("<iiqqiqq", KIND_LINEAR, FMT_CODES[fmt], rows, cols, m, len(w), len(s)) + w + s + _f32(x))


def swiglu_case(g: np.ndarray, u: np.ndarray) -> bytes:
    return struct.pack("<ii", KIND_SWIGLU, len(g)) + _f32(g) + _f32(u)


def uniforms_case(key: int, index0: int, n: int) -> bytes:
    return struct.pack("<iQQq", KIND_UNIFORMS, key, index0, n)


def snake_case(x: np.ndarray, a: np.ndarray, inv_b: np.ndarray) -> bytes:
    c, t = np.asarray(x).shape
    return struct.pack("<iqq", KIND_SNAKE, c, t) + _f32(x) + _f32(a) + _f32(inv_b)


def conv_case(w: np.ndarray, bias: np.ndarray, hist: np.ndarray, x: np.ndarray, a: np.ndarray, inv_b: np.ndarray,
              dilation: int, precision: str = "bf16") -> bytes:
    """The decoder's conv in ``precision`` (``vo_conv_bf16`` or, "int8", ``vo_conv_i8``) of weights ``w``
    [cout, cin, k] over SnakeBeta(``x``) [cin, T] after ``hist`` [cin, (k - 1) * dilation]: the result is
    y [cout * T], then the next history."""
    kinds = {"bf16": KIND_CONV, "int8": KIND_CONV_I8}
    if precision not in kinds:
        raise ValueError(f"precision must be one of {', '.join(kinds)}, got {precision!r}")
    cout, cin, k = np.asarray(w).shape
    t = np.asarray(x).shape[1]
    return (struct.pack("<iqqqqq", kinds[precision], cout, cin, k, dilation, t) + _f32(w) + _f32(bias) + _f32(hist)
            + _f32(x) + _f32(a) + _f32(inv_b))
