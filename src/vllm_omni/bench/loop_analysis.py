"""``vllm-omni-bench loop-analysis``: the int4 and int8 loops' speed per core from their compiled code,
checked on this host, and what it makes of the ARM edge boards (computed artifacts under ``arm/``).

Two artifacts, both derived, neither a device measurement:

- ``arm/loop-analysis``: for each x86 build of this host and each ARM core, the cycles llvm-mca
  gives one pass of the int4 and int8 tile loops and the weight bytes per cycle that makes. The
  x86 rows set beside them the same loops measured here (``vllm-omni-bench gemv --sets 'in L2'``,
  one thread, artifacts ``cpu-path/gemv-speed-l2-t1-f6m167*``) at the core clock that run
  recorded: the ratio is the method's error on this host.
  The decoder's int8 convolution loop is modelled too (multiply-adds per cycle), and set beside
  the fastest block of this host's int8 decoder at one thread
  (``end-to-end/decoder-split-0.6b-f6m167``).
- ``arm/projection``: for each board, floors of one 80 ms frame of the 0.6B at int4 with every
  core: the talker's and predictor's weight bytes over the memory bandwidth, or over the cores'
  loop rate, whichever is slower, plus the decoder's multiply-adds: all at the cores' fp32 peak
  (as llvm-mca models a loop of independent NEON FMAs), or, as the int8 decoder runs on a
  dot-product core, the DecoderBlocks' at the int8 convolution loop's rate and the rest at the
  fp32 peak. A floor says what cannot be beaten; a board whose floor is above 80 ms cannot speak
  in real time this way, one below it might.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from vllm_omni.bench.common import BenchError, add_output, computed_provenance, show_and_write
from vllm_omni.results.schema import validate

GEMV_ARTIFACTS = {  # this host's build -> the measured loops (gemv --sets 'in L2', one thread)
    "AVX-512 VNNI": "cpu-path/gemv-speed-l2-t1-f6m167",
    "AVX2": "cpu-path/gemv-speed-l2-t1-f6m167-avx2",
    "generic C": "cpu-path/gemv-speed-l2-t1-f6m167-generic",
}
DECODER_ARTIFACT = "end-to-end/decoder-split-0.6b-zen4"  # the decoder's multiply-adds per frame
INT8_DECODER_ARTIFACT = "end-to-end/decoder-split-0.6b-f6m167"  # this host's int8 decoder, stage by stage
CONV_LOOPS = {"AVX-512 VNNI": "i8_conv_vnni", "cortex-a76": "i8_conv_sdot", "neoverse-n1": "i8_conv_sdot",
              "neoverse-v1": "i8_conv_i8mm"}  # V1 has i8mm: its build runs SMMLA
FRAME_MS = 80.0

# Boards: (name, llvm-mca model of its cores, cores, GHz, memory bandwidth GB/s, source). The Cortex-A76
# and A78AE are modelled as Neoverse-N1 (LLVM 19's model of the A76's server sibling; its own A76 entry
# reuses the older Cortex-A57 model, which the loop-analysis table shows beside it).
BOARDS = (
    ("Raspberry Pi 5", "neoverse-n1", 4, 2.4, 17.1,
     "Raspberry Pi 5 launch announcement: 4 Cortex-A76 at 2.4 GHz, 32-bit LPDDR4X at 4267 MT/s (17.1 GB/s "
     "computed from the bus)"),
    ("Jetson Orin NX 16 GB", "neoverse-n1", 8, 2.0, 102.4,
     "8 Cortex-A78AE: the study's bandwidth (NVIDIA data sheet); cores and clock from the project's ARM "
     "reference notes"),
    ("Jetson AGX Orin 64 GB", "neoverse-n1", 12, 2.2, 204.8,
     "12 Cortex-A78AE: the study's bandwidth (NVIDIA data sheet); cores and clock from the project's ARM "
     "reference notes"),
)
COMMAND = "vllm-omni-bench loop-analysis"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("loop-analysis", help="the int4/int8 loops' speed per core from llvm-mca, checked on this "
                                             "host, and floors of a frame on ARM edge boards")
    add_output(p)
    p.add_argument("--no-write", action="store_true", help="print the tables, write nothing")
    p.set_defaults(func=run)


def _measured(artifact_id: str, fmt: str) -> tuple[float, float, float]:
    """(median GB/s, best GB/s, core GHz) of the committed one-thread in-L2 run of ``fmt``."""
    from vllm_omni.results import load

    art = load(artifact_id)
    names = [c.name for c in art.columns]
    row = next(r for r in art.rows if r[names.index("weights")] == fmt and r[names.index("weight set")] == "in L2")
    clock = art.provenance["run"]["core_clock_ghz"]
    return row[names.index("GEMVs median")], row[names.index("GEMVs best")], statistics.mean(clock.values())


def _int8_blocks_measured() -> tuple[float, float, str]:
    """(GMAC/s, core GHz, stage) of the fastest DecoderBlock of this host's int8 decoder at one thread."""
    from vllm_omni.results import load

    art = load(INT8_DECODER_ARTIFACT)
    n = [c.name for c in art.columns]
    rows = [r for r in art.rows if r[n.index("precision")] == "int8" and r[n.index("threads")] == 1
            and r[n.index("stage")].startswith("block")]
    if not rows:
        raise BenchError(f"{INT8_DECODER_ARTIFACT} has no int8 rows at one thread: rerun vllm-omni-bench decoder-split")
    best = max(rows, key=lambda r: r[n.index("rate")])
    clock = art.provenance["run"]["core_clock_ghz"]
    return best[n.index("rate")], statistics.mean(clock.values()), best[n.index("stage")]


def fma_lanes_per_cycle(core: str) -> float:
    """fp32 FMA lanes per cycle of a loop of 8 independent 128-bit NEON FMAs on ``core``'s llvm-mca model."""
    import subprocess

    from vllm_omni.cpu.loop_analysis import mca, parse_regions

    body = "".join(f"fmla v{i}.4s, v30.4s, v31.4s\n" for i in range(8))
    asm = f"# LLVM-MCA-BEGIN fma\n{body}# LLVM-MCA-END\n"
    out = subprocess.run([mca(), "-mtriple=aarch64", f"-mcpu={core}", "-iterations=200"], input=asm,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return 8 * 4 / parse_regions(out)["fma"][0]


def build(command: str) -> list[dict[str, Any]]:
    from vllm_omni.cpu import loop_analysis as L
    from vllm_omni.models import get_model
    from vllm_omni.models.counts import frame_breakdown
    from vllm_omni.results import load

    tool = L.mca()
    if tool is None:
        raise BenchError("llvm-mca not found: install Debian's llvm-19 (make arm-tools does)")
    version = L.mca_version(tool)
    rows, rates, macs = [], {}, {}
    for key, b in list(L.X86_BUILDS.items()) + list(L.ARM_CORES.items()):
        try:
            regions = L.analyse(b)
        except L.AnalysisError as exc:
            raise BenchError(str(exc)) from None
        for fmt, names in (("int4", ("q4_group", "q4_row")), ("int8", ("q8_group", "q8_row"))):
            name = next(n for n in names if n in regions)
            r = regions[name]
            rates[(key, fmt)] = r["bytes_per_cycle"]
            measured = predicted = ratio = clock = None
            if key in GEMV_ARTIFACTS:
                med, _best, clock = _measured(GEMV_ARTIFACTS[key], fmt)
                predicted = r["bytes_per_cycle"] * clock
                measured, ratio = med, med / predicted
            rows.append([b.name, "x86 (this host)" if key in GEMV_ARTIFACTS else "ARM", fmt, name,
                         round(r["cycles"], 2), L.REGION_BYTES[name], round(r["bytes_per_cycle"], 3), None,
                         None if clock is None else round(clock, 3), None if predicted is None else round(predicted, 1),
                         measured, None if ratio is None else round(ratio, 3)])
    for key, b in list(L.X86_BUILDS.items()) + list(L.ARM_CORES.items()):  # the decoder's int8 convolution
        name = CONV_LOOPS.get(key)
        if name is None:
            continue
        r = L.analyse(b)[name]
        macs[key] = r["macs_per_cycle"]
        measured = predicted = ratio = clock = None
        if key in GEMV_ARTIFACTS:
            measured, clock, _stage = _int8_blocks_measured()
            predicted = r["macs_per_cycle"] * clock
            ratio = measured / predicted
        rows.append([b.name, "x86 (this host)" if key in GEMV_ARTIFACTS else "ARM", "int8 conv", name,
                     round(r["cycles"], 2), None, None, round(r["macs_per_cycle"], 1),
                     None if clock is None else round(clock, 3), None if predicted is None else round(predicted, 1),
                     measured, None if ratio is None else round(ratio, 3)])
    loops = {
        "schema": 1, "id": "arm/loop-analysis", "origin": "computed",
        "title": "The int4 and int8 tile loops per core from their compiled code (llvm-mca), against this host's "
                 "measured loops",
        "provenance": computed_provenance(command, source=f"llvm-mca {version} on the kernels compiled by g++ and "
                                                          "aarch64-linux-gnu-g++ (vllm_omni.cpu.loop_analysis); "
                                                          "measured rates from " + ", ".join(GEMV_ARTIFACTS.values()),
                                          model=None, weights="none: compiled code", quantization="int4,int8"),
        "columns": [
            {"name": "core or build", "unit": None, "type": "text"},
            {"name": "where", "unit": None, "type": "text"},
            {"name": "weights", "unit": None, "type": "text"},
            {"name": "loop", "unit": None, "type": "text"},
            {"name": "cycles per pass", "unit": None, "type": "number", "format": ".1f"},
            {"name": "bytes per pass", "unit": "B", "type": "number", "format": ".0f"},
            {"name": "bytes per cycle", "unit": "B", "type": "number", "format": ".2f"},
            {"name": "multiply-adds per cycle", "unit": None, "type": "number", "format": ".0f"},
            {"name": "core clock", "unit": "GHz", "type": "number", "format": ".2f"},
            {"name": "predicted", "unit": None, "type": "number", "format": ".1f"},
            {"name": "measured", "unit": None, "type": "number", "format": ".1f"},
            {"name": "measured / predicted", "unit": None, "type": "number", "format": ".2f"},
        ],
        "rows": rows,
        "notes": ("A pass: the body of one tile loop, one group of 32 inputs for a tile of 32 rows (SIMD builds) or "
                  "one row's group (plain C), as llvm-mca models the core with every load in the first-level cache; "
                  "the median over the copies the compiler inlined. x86 rows model this host's builds as Sapphire "
                  "Rapids cores; 'measured' is the median one-thread GEMV rate with the weights in L2, and 'core "
                  "clock' the mean of that run's clock readings. The ARM rows are the NEON dot-product build "
                  "(-mcpu of each core); no ARM figure is a measurement. Predicted and measured are GB/s of weights "
                  "for the GEMV loops, GMAC/s for the int8 conv ('int8 conv' rows: one pass is four inputs of a tap "
                  "for a block of channels and samples, its weights in cache; measured is the fastest DecoderBlock "
                  f"of the int8 decoder at one thread in {INT8_DECODER_ARTIFACT}, its SnakeBeta, packing and "
                  "scaling included)."),
    }
    validate(loops)

    decoder = load(DECODER_ARTIFACT)
    names = [c.name for c in decoder.columns]
    dec_mmac = next(r[names.index("multiply-adds per frame")] for r in decoder.rows if r[names.index("stage")] == "whole decoder")
    first = next(r[names.index("precision")] for r in decoder.rows)  # one precision's stages: the products' count
    blocks_mmac = sum(r[names.index("multiply-adds per frame")] for r in decoder.rows
                      if r[names.index("precision")] == first and r[names.index("threads")] == decoder.rows[0][2]
                      and r[names.index("stage")].startswith("block"))
    fb = frame_breakdown(get_model("0.6B"), "int4")
    frame_gb = (fb.talker + fb.predictor_pass * fb.predictor_passes) / 1e9
    proj_rows = []
    for name, core, cores, ghz, bw, source in BOARDS:
        loop_gbs = rates[(core, "int4")] * ghz * cores
        read_ms = frame_gb / bw * 1e3
        loop_ms = frame_gb / loop_gbs * 1e3
        lanes = fma_lanes_per_cycle(core)
        dec_ms = dec_mmac * 1e6 / (lanes * ghz * 1e9 * cores) * 1e3
        i8_ms = (blocks_mmac * 1e6 / (macs[core] * ghz * 1e9 * cores)
                 + (dec_mmac - blocks_mmac) * 1e6 / (lanes * ghz * 1e9 * cores)) * 1e3
        floor, floor32 = max(read_ms, loop_ms) + i8_ms, max(read_ms, loop_ms) + dec_ms
        proj_rows.append([name, L.ARM_CORES[core].name, cores, ghz, bw, round(frame_gb, 4), round(read_ms, 2),
                          round(loop_ms, 2), round(lanes, 2), round(dec_ms, 2), round(macs[core], 1), round(i8_ms, 2),
                          round(floor, 2), round(floor / FRAME_MS, 3), round(floor32, 2), round(floor32 / FRAME_MS, 3),
                          source])
    projection = {
        "schema": 1, "id": "arm/projection", "origin": "computed",
        "title": "Floors of one frame on ARM edge boards (0.6B, int4 talker and predictor, every core)",
        "provenance": computed_provenance(command, source=f"arm/loop-analysis (llvm-mca {version}), the 0.6B's "
                                                          f"published shapes, the decoder's multiply-adds from "
                                                          f"{DECODER_ARTIFACT}, and each board's source column",
                                          model="Qwen3-TTS-12Hz-0.6B", weights="none: analytic, from the published "
                                                                              "shapes", quantization="int4"),
        "columns": [
            {"name": "board", "unit": None, "type": "text"},
            {"name": "core model", "unit": None, "type": "text"},
            {"name": "cores", "unit": None, "type": "number", "format": ".0f"},
            {"name": "clock", "unit": "GHz", "type": "number", "format": ".1f"},
            {"name": "bandwidth", "unit": "GB/s", "type": "number", "format": ".1f"},
            {"name": "weights per frame", "unit": "GB", "type": "number", "format": ".3f"},
            {"name": "weights over bandwidth", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "weights over the loops", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "fp32 FMA lanes per cycle", "unit": None, "type": "number", "format": ".1f"},
            {"name": "decoder at peak", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "int8 multiply-adds per cycle", "unit": None, "type": "number", "format": ".0f"},
            {"name": "int8 decoder at peak", "unit": "ms", "type": "number", "format": ".1f"},
            {"name": "frame floor", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF floor", "unit": None, "type": "number", "format": ".2f"},
            {"name": "frame floor, fp32 decoder", "unit": "ms", "type": "number", "format": ".0f"},
            {"name": "RTF floor, fp32 decoder", "unit": None, "type": "number", "format": ".2f"},
            {"name": "source", "unit": None, "type": "text"},
        ],
        "rows": proj_rows,
        "notes": ("Weights per frame: the talker's int4 bytes once and the code predictor's fifteen times (the "
                  "published 0.6B shapes). Weights over the loops: those bytes at the int4 loop's bytes per cycle "
                  "(arm/loop-analysis) on every core at the board's clock; the frame takes the slower of the two "
                  "weight terms. Decoder at peak: its fp32 multiply-adds per frame at every core's FMA rate as "
                  "llvm-mca models it, the decoder doing nothing else. int8 decoder at peak: the DecoderBlocks' "
                  "multiply-adds (their convolutions, in int8 where the CPU has the dot product: what --decoder auto "
                  "runs there with int4 weights) at the int8 convolution loop's rate (arm/loop-analysis) and the "
                  "rest at the FMA rate. Frame floor and RTF floor: with the int8 decoder; the fp32 decoder's beside "
                  "them. Everything else (attention, norms, sampling, "
                  "the calls, threads that do not scale) is left out, so these are floors, not predictions. The "
                  "boards' Cortex-A76 and A78AE cores are modelled as Neoverse-N1 (see BOARDS in "
                  "vllm_omni/bench/loop_analysis.py). Measured on this host the loops ran at 0.45 to 1.0 of what "
                  "llvm-mca gives them "
                  "(arm/loop-analysis), and a real decoder is slower than its peak."),
    }
    validate(projection)
    return [loops, projection]


def run(args: argparse.Namespace) -> int:
    return show_and_write(build(COMMAND), args)
