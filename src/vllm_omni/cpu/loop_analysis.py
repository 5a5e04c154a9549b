"""How fast a core can run the kernels' int4 and int8 loops, from their compiled code alone.

Why: no ARM machine is at hand, and an emulator's time says nothing about a core's. What can be
said is what the core's pipeline makes of the instructions the compiler emits for it. LLVM's
``llvm-mca`` simulates a marked stretch of assembly on a model of a given core (its ports,
latencies and issue width) and reports the cycles one pass over it takes when it repeats. It
assumes every load hits the first-level cache, so the figure is the loop's own ceiling,
before any memory, cache or thread effect.

How: the kernels are compiled to assembly for the core (``-DVO_MCA_MARKERS`` marks the body
of each tile loop: one int4 or int8 group of 32 inputs for a tile of 32 rows in the SIMD
builds, one row's group in the plain C; and the decoder's int8 convolution, four inputs of a
tap for a block of channels and samples), and ``llvm-mca`` runs each marked region on that
core's model. A region inlined into several callers is analysed in each, and the median is
kept. Bytes per cycle are the weight bytes one pass reads (``REGION_BYTES``) over its cycles;
for the convolution, multiply-adds per cycle (``REGION_MACS``), since its weights stay in cache.

The method is checked on this host first: ``vllm-omni-bench loop-analysis`` sets the x86
loops' predicted rates beside the same loops' measured rates from ``vllm-omni-bench gemv``
(weights in L2, one thread), so that its error is stated before any ARM figure is read.
"""

from __future__ import annotations

import functools
import re
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.cpu.native import CSRC, SOURCES

# weight bytes one pass over a marked region reads: an int4 group of a 32-row tile is 16 x 32 nibble
# bytes and 32 fp16 scales (576); an int8 group is 32 x 32 bytes (its row scales are read per tile);
# the plain C walks one row of a group at a time (16 + 2 and 32 bytes)
REGION_BYTES = {"q4_group": 576, "q4_row": 18, "q8_group": 1024, "q8_row": 32}
# multiply-adds one pass over a marked convolution region makes: 4 inputs (one byte quad) for 8
# channels by 32 samples (AVX-512 VNNI), or for 4 channels by 16 samples (ARM's SDOT); 8 inputs
# for 8 channels by 8 samples (ARM's SMMLA, i8mm)
REGION_MACS = {"i8_conv_vnni": 1024, "i8_conv_sdot": 256, "i8_conv_i8mm": 512}
MCA_CANDIDATES = ("llvm-mca-19", "llvm-mca")


@dataclass(frozen=True)
class Build:
    """How the kernels are compiled for one core, and the llvm-mca model they run on."""

    name: str  # what the row is called
    compiler: str  # g++ or the aarch64 cross compiler
    flags: tuple[str, ...]
    triple: str
    mcpu: str
    mattr: str = ""


X86_BUILDS = {  # this host's builds (vllm_omni.cpu.native), modelled as Sapphire Rapids cores
    "AVX-512 VNNI": Build("AVX-512 VNNI", "g++", ("-march=sapphirerapids",), "x86_64", "sapphirerapids"),
    "AVX2": Build("AVX2", "g++", ("-march=x86-64", "-mavx2", "-mfma", "-mf16c"), "x86_64", "sapphirerapids"),
    "generic C": Build("generic C", "g++", ("-march=x86-64",), "x86_64", "sapphirerapids"),
}
ARM_CORES = {  # the NEON dot-product build as each core would run it
    # LLVM 19 models the Cortex-A76 and A78 with its Cortex-A57 model (one 128-bit FMA a cycle);
    # the Neoverse-N1, the A76's server sibling, has a model of its own (two)
    "cortex-a76": Build("Cortex-A76 (LLVM's A57 model)", "aarch64-linux-gnu-g++",
                        ("-mcpu=cortex-a76", "-ffp-contract=off"), "aarch64", "cortex-a76", "+dotprod"),
    "neoverse-n1": Build("Neoverse-N1", "aarch64-linux-gnu-g++", ("-mcpu=neoverse-n1", "-ffp-contract=off"),
                         "aarch64", "neoverse-n1", "+dotprod"),
    "neoverse-v1": Build("Neoverse-V1", "aarch64-linux-gnu-g++", ("-mcpu=neoverse-v1", "-ffp-contract=off"),
                         "aarch64", "neoverse-v1", "+dotprod"),
}


class AnalysisError(RuntimeError):
    """The loops could not be compiled or analysed here."""


def tools_missing() -> str | None:
    """Why the analysis cannot run here (the Debian packages to install), or None."""
    missing = [pkg for found, pkg in ((mca() is not None and "19" in Path(mca()).name, "llvm-19"),
                                      (shutil.which("aarch64-linux-gnu-g++") is not None, "g++-aarch64-linux-gnu"),
                                      (shutil.which("g++") is not None, "g++")) if not found]
    return f"needs {', '.join(missing)} (Debian packages; `make test` installs them as root)" if missing else None


def mca() -> str | None:
    """The newest llvm-mca found (Debian's llvm-19 package has models of the Neoverse cores), or None."""
    for name in MCA_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def mca_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"LLVM version (\S+)", out)
    return found.group(1) if found else out.strip().splitlines()[0]


def assembly(build: Build, source: str = SOURCES[0]) -> str:
    """One source of the kernels (``native.SOURCES``) compiled to assembly for ``build``, its loop regions marked."""
    if shutil.which(build.compiler) is None:
        raise AnalysisError(f"{build.compiler} not found (Debian: g++ or g++-aarch64-linux-gnu)")
    with tempfile.TemporaryDirectory(prefix="vo-mca-") as tmp:
        out = Path(tmp) / "kernels.s"
        cmd = [build.compiler, "-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-DVO_MCA_MARKERS", *build.flags,
               "-S", str(CSRC / source), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise AnalysisError(f"compiling for {build.name} failed:\n$ {' '.join(cmd)}\n{proc.stderr[-3000:]}")
        return _llvm_syntax(out.read_text())


def _llvm_syntax(asm: str) -> str:
    """GNU assembly as LLVM's parser reads it: GCC writes a byte-vector MOVI of a negative byte
    sign-extended to 64 bits (``movi v0.16b, 0xffffffffffffff80``), where LLVM wants the byte."""
    return re.sub(r"(movi\s+v\d+\.(?:16|8)b,\s*)0xffffffffffffff([0-9a-f]{2})\b", r"\g<1>0x\2", asm)


def parse_regions(report: str) -> dict[str, list[float]]:
    """Cycles per iteration of each code region in an llvm-mca report, by region name."""
    cycles: dict[str, list[float]] = {}
    for block in re.split(r"\n(?=\[\d+\] Code Region)", "\n" + report):
        head = re.search(r"\[\d+\] Code Region - (\S+)", block)
        its = re.search(r"Iterations:\s+(\d+)", block)
        total = re.search(r"Total Cycles:\s+(\d+)", block)
        if head and its and total and int(its.group(1)):
            cycles.setdefault(head.group(1), []).append(int(total.group(1)) / int(its.group(1)))
    return cycles


def analyse(build: Build, iterations: int = 200) -> dict[str, dict[str, float]]:
    """{region: {"cycles": median cycles per iteration, "bytes_per_cycle" (or, for a convolution,
    "macs_per_cycle"): ..., "copies": n}} for ``build``, over every source (computed once per process: a
    build's compile and model take seconds, and the sources do not change)."""
    return {name: dict(values) for name, values in _analyse(build, iterations)}


@functools.lru_cache(maxsize=None)
def _analyse(build: Build, iterations: int) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    tool = mca()
    if tool is None:
        raise AnalysisError("llvm-mca not found (Debian: llvm-19, or llvm)")
    cmd = [tool, f"-mtriple={build.triple}", f"-mcpu={build.mcpu}", f"-iterations={iterations}"]
    if build.mattr:
        cmd.append(f"-mattr={build.mattr}")
    out = []
    for source in SOURCES:
        proc = subprocess.run(cmd, input=assembly(build, source), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise AnalysisError(f"llvm-mca for {build.name} ({source}) failed: {proc.stderr.strip()[-2000:]}")
        for name, values in parse_regions(proc.stdout).items():
            cycles = statistics.median(values)
            if name in REGION_BYTES:
                out.append((name, (("cycles", cycles), ("bytes_per_cycle", REGION_BYTES[name] / cycles),
                                   ("copies", len(values)))))
            elif name in REGION_MACS:
                out.append((name, (("cycles", cycles), ("macs_per_cycle", REGION_MACS[name] / cycles),
                                   ("copies", len(values)))))
    return tuple(out)
