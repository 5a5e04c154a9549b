"""The study's arithmetic, recomputed: one claim at a time, with a verdict.

Why: the study's text states derived figures (bytes per frame, bandwidth floors, "4× the
floor", projections, shares of the frame). Each one can be redone from the figures the study
itself gives (transcribed under ``results/``) and, where shapes decide it, from the model
specs in :mod:`vllm_omni.models`. A claim here is an id, a paraphrase, the figure the study
states, and a recomputation that says how it was done.

The verdict rule, the same for every claim:

* A stated figure covers the values that round to it at the precision it is written with
  (half a unit in its last digit: ``17.6`` covers 17.55–17.65, ``26`` covers 25.5–26.5),
  widened to ±2 % of the figure when that is larger, to allow for the study rounding its
  own intermediate figures. The recomputation **holds** when it falls inside.
* A stated range (``2–4``) holds when every recomputed value lies inside it, each end
  widened the same way (for a claim marked *overlap*, when the recomputed span and the stated
  range share a value); a bound (``> 50``) must hold strictly.
* Otherwise the claim is **off by** the signed relative distance from the stated figure
  to the recomputation (``off by +19.0 %``: the recomputation is 19 % larger).
* **Cannot be checked** when the study does not give what the recomputation needs.

Nothing here measures anything; importing it is cheap (no torch, no pandas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

from vllm_omni.models import (
    frame_breakdown,
    get_model,
    predictor_pass_bytes,
    stack_params,
    talker_frame_bytes,
)
from vllm_omni.results import store
from vllm_omni.results.schema import Artifact

#: The figures the study states and the audit reads, by artifact (all transcribed).
GPU = "environment/study-gpu"
SMS = "device-simulation/sm-share-study"
GSPLIT = "device-simulation/gpu-frame-split-study"
PROJ = "device-simulation/projection-study"
INPUTS = "device-simulation/study-frame-inputs"
CSPLIT = "cpu-path/frame-split-xeon"
LLAMA = "cpu-path/llamacpp-xeon"
FIG = "cpu-path/study-figures"
THREADS = "cpu-path/threads-study"
HOST = "environment/study-cpu-host"

SPEC = "vllm_omni.models"  # named in a claim's inputs when the model specs were used
FRAME_MS = 80.0  # one 12.5 Hz frame
SLACK = 0.02  # the ±2 % allowance for the study's own rounding

VERDICT_HOLDS = "holds"
VERDICT_UNCHECKED = "cannot be checked"

_NUM = r"[-−]?\d+(?:\.\d+)?"
_RANGE_RE = re.compile(rf"^({_NUM})\s*[–…-]\s*({_NUM})$")
_BOUND_RE = re.compile(rf"^([<>])\s*({_NUM})$")


# --- stated figures ------------------------------------------------------------------------

def _number(text: str) -> Decimal:
    return Decimal(text.replace("−", "-"))


def half_unit(text: str) -> float:
    """Half a unit in the last written digit: '17.6' -> 0.05, '26' -> 0.5, '0.125' -> 0.0005."""
    exp = _number(text).as_tuple().exponent
    return 0.5 * 10.0 ** min(int(exp), 0)


def tolerance(text: str) -> float:
    """What a stated figure covers either side: its rounding, or ±2 % when larger."""
    return max(half_unit(text), SLACK * abs(float(_number(text))))


@dataclass(frozen=True)
class Stated:
    """A figure as the study writes it: a number, a range ``a–b`` or a bound ``> a``."""

    text: str

    def __post_init__(self) -> None:
        t = self.core
        if not (_RANGE_RE.match(t) or _BOUND_RE.match(t) or re.fullmatch(_NUM, t)):
            raise ValueError(f"stated figure {self.text!r} is not a number, a range 'a–b' or a bound '> a'")

    @property
    def core(self) -> str:
        return self.text.lstrip("≈~ ").strip()

    @property
    def kind(self) -> str:
        if _RANGE_RE.match(self.core):
            return "range"
        if _BOUND_RE.match(self.core):
            return "bound"
        return "number"


def _fmt_num(x: float) -> str:
    if x == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.4g}"


def stated_from(value: float | int) -> str:
    """A figure read from a transcribed artifact, as text with the precision it was written with."""
    return repr(value) if isinstance(value, float) else str(value)


# --- recomputations --------------------------------------------------------------------------

@dataclass(frozen=True)
class Recomputed:
    """A recomputation: a value or an interval (None: cannot be checked) and how it was done."""

    how: str
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    spec: str | None = None  # the same quantity from the model specs, when it differs in kind

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.value is not None:
            return self.value, self.value
        if self.lo is not None and self.hi is not None:
            return min(self.lo, self.hi), max(self.lo, self.hi)
        return None

    def text(self, unit: str | None) -> str | None:
        iv = self.interval
        if iv is None:
            return None
        body = _fmt_num(iv[0]) if iv[0] == iv[1] else f"{_fmt_num(iv[0])}–{_fmt_num(iv[1])}"
        return body + _unit_suffix(unit)


def _unit_suffix(unit: str | None) -> str:
    if not unit:
        return ""
    return unit if unit in ("%", "×") else f" {unit}"



def verdict(stated: Stated, rec: Recomputed, overlap: bool = False) -> tuple[str, float | None]:
    """(verdict, signed relative deviation) by the module's rule; None when unchecked or a bound holds."""
    iv = rec.interval
    if iv is None:
        return VERDICT_UNCHECKED, None
    lo, hi = iv
    core = stated.core
    if stated.kind == "bound":
        op, a_text = _BOUND_RE.match(core).groups()
        a = float(_number(a_text))
        ok = lo > a if op == ">" else hi < a
        edge = lo if op == ">" else hi
        return (VERDICT_HOLDS, None) if ok else (_off((edge - a) / a), (edge - a) / a)
    if stated.kind == "range":
        a_text, b_text = _RANGE_RE.match(core).groups()
        (a, ta), (b, tb) = sorted(((float(_number(a_text)), tolerance(a_text)), (float(_number(b_text)), tolerance(b_text))))
        if overlap:  # the two spans share some value
            ok = lo <= b + tb and hi >= a - ta
            dev = 0.0 if (lo <= b and hi >= a) else ((lo - b) / b if lo > b else (hi - a) / a)
            return (VERDICT_HOLDS if ok else _off(dev)), dev
        above = (hi - b) / b if hi > b else 0.0
        below = (lo - a) / a if lo < a else 0.0
        dev = above if abs(above) >= abs(below) else below
        ok = lo >= a - ta and hi <= b + tb
        return (VERDICT_HOLDS if ok else _off(dev)), dev
    s = float(_number(core))
    tol = tolerance(core)
    if lo == hi:
        dev = (lo - s) / s
        return (VERDICT_HOLDS if abs(lo - s) <= tol else _off(dev)), dev
    if lo <= s <= hi:
        return VERDICT_HOLDS, 0.0
    nearest = lo if s < lo else hi
    dev = (nearest - s) / s
    return (VERDICT_HOLDS if abs(nearest - s) <= tol else _off(dev)), dev


def _off(dev: float) -> str:
    return f"off by {dev * 100:+.1f} %"


# --- reading the study's figures ---------------------------------------------------------------

class Figures:
    """The study's transcribed figures, read from ``results/`` and remembered per claim."""

    def __init__(self, root: str | Path | None = None, cache: dict[str, Artifact] | None = None):
        self.root = root
        self._cache: dict[str, Artifact] = {} if cache is None else cache
        self.used: list[str] = []

    def artifact(self, art_id: str) -> Artifact:
        if art_id not in self._cache:
            self._cache[art_id] = store.load(art_id, self.root)
        return self._cache[art_id]

    def __call__(self, art_id: str, row: str | int, col: str) -> float:
        value = self.artifact(art_id).value(row, col)
        if value is None:
            raise ValueError(f"{art_id}: the cell ({row!r}, {col!r}) is null; the audit cannot use it")
        if art_id not in self.used:
            self.used.append(art_id)
        return value

    def spec(self) -> None:
        if SPEC not in self.used:
            self.used.append(SPEC)


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    says: str  # a paraphrase, never the study's sentence
    unit: str | None
    stated: Callable[[Figures], str] | str
    recompute: Callable[[Figures], Recomputed]
    overlap: bool = False


CLAIMS: list[Claim] = []


def claim(id: str, section: str, says: str, unit: str | None, stated: Callable[[Figures], str] | str,
          *, overlap: bool = False):
    def register(fn: Callable[[Figures], Recomputed]) -> Callable[[Figures], Recomputed]:
        if any(c.id == id for c in CLAIMS):
            raise ValueError(f"duplicate claim id {id!r}")
        CLAIMS.append(Claim(id, section, says, unit, stated, fn, overlap))
        return fn
    return register


def at(art_id: str, row: str | int, col: str) -> Callable[[Figures], str]:
    """A stated figure read from a transcribed artifact."""
    return lambda f: stated_from(f(art_id, row, col))


_M06 = "0.6B"


def _spec_frame(fmt: str = "bf16"):
    return frame_breakdown(get_model(_M06), fmt)


# === §1: the GPU and what can be emulated ==========================================================

@claim("s1-mps-cap-ratio", "§1", "A 12 % MPS cap leaves an eighth of the uncapped matmul throughput", None,
       at(GPU, "ratio of the 12 % cap to uncapped", "value"))
def _(f):
    capped = f(GPU, "bf16 matmul under a 12 % MPS cap", "value")
    full = f(GPU, "dense bf16 matmul throughput (8192³, 20 iterations)", "value")
    return Recomputed(f"{capped:g} TFLOPS / {full:g} TFLOPS", capped / full)


def _sm_share(f: Figures, row: str) -> Recomputed:
    sms = f(SMS, row, "SMs")
    total = f(GPU, "streaming multiprocessors", "value")
    return Recomputed(f"{sms:g} SMs / {total:g} SMs", 100 * sms / total)


@claim("s1-orin-agx-sm-share", "§1–2", "Orin AGX's SM count is about 12 % of the H200's", "%",
       at(SMS, "12 %", "SM share"))
def _(f):
    return _sm_share(f, "12 %")


@claim("s1-orin-nx-sm-share", "§1–2", "Orin NX's SM count is about 6 % of the H200's", "%",
       at(SMS, "6 %", "SM share"))
def _(f):
    return _sm_share(f, "6 %")


@claim("s1-device-memory", "§1", "The driver's memory figure in MiB is the 140 GiB measured", "GiB",
       at(GPU, "device memory (measured)", "value"))
def _(f):
    mib = f(GPU, "device memory (driver label)", "value")
    return Recomputed(f"{mib:,} MiB / 1024", mib / 1024)


@claim("s1-lpddr5-span", "§1", "The Jetson-class devices' memory bandwidth spans 102 to 273 GB/s", "GB/s", "102–273")
def _(f):
    bw = [f(PROJ, name, "bandwidth") for name in ("Jetson AGX Orin 64 GB", "Jetson Orin NX 16 GB", "Jetson Thor")]
    return Recomputed("lowest and highest datasheet bandwidth of the three Jetson rows in §4", lo=min(bw), hi=max(bw))


# === §2: sensitivity to SM count ==================================================================

@claim("s2-quarter-sms", "§2", "A 25 % share of the SMs is 33 of them", "SMs", at(SMS, "25 %", "SMs"))
def _(f):
    share = f(SMS, "25 %", "SM share")
    total = f(GPU, "streaming multiprocessors", "value")
    return Recomputed(f"{share:g} % of {total:g} SMs", share / 100 * total)


@claim("s2-talker-slowdown", "§2", "At 6 % of the SMs vLLM-Omni's talker step takes 55 % longer than uncapped", "%", "55")
def _(f):
    full, capped = f(SMS, "100 %", "vLLM-Omni talker low"), f(SMS, "6 %", "vLLM-Omni talker low")
    return Recomputed(f"({capped:g} ms / {full:g} ms − 1) × 100", 100 * (capped / full - 1))


@claim("s2-ttfa-increase", "§2", "The same cap adds about 15 ms to the time to first audio", "ms", "15")
def _(f):
    lo, hi = f(SMS, "100 %", "TTFA p50 low"), f(SMS, "100 %", "TTFA p50 high")
    capped = f(SMS, "6 %", "TTFA p50 low")
    return Recomputed(f"p50 at 6 % ({capped:g} ms) minus p50 uncapped ({lo:g}–{hi:g} ms)", lo=capped - hi, hi=capped - lo)


@claim("s2-llamacpp-slowdown", "§2", "llama.cpp's talker is 2.8 times slower at the 6 % cap than uncapped", "×", "2.8")
def _(f):
    full, capped = f(SMS, "100 %", "llama.cpp talker"), f(SMS, "6 %", "llama.cpp talker")
    return Recomputed(f"{capped:g} ms / {full:g} ms", capped / full)


@claim("s2-jetson-like-talker", "§2", "The Jetson-like combined run's talker step, derived from its RTF, is about 13 ms", "ms",
       at(SMS, "12 % + 6 host cores + 8 GB profile", "vLLM-Omni talker low"))
def _(f):
    rtf = f(SMS, "12 % + 6 host cores + 8 GB profile", "vLLM-Omni RTF low")
    return Recomputed(
        f"the study does not say how the talker step follows from the RTF; RTF {rtf:g} × 80 ms is "
        f"{rtf * FRAME_MS:g} ms per frame for the whole pipeline, not the talker step"
    )


# === §3: where a GPU frame goes ===================================================================

@claim("s3-sync-overhead", "§3", "Synchronized timers add about 3 ms to each step", "ms", "≈3")
def _(f):
    synced = f(GSPLIT, "engine-core step with synchronized timers", "ms low")
    free = f(GSPLIT, "engine-core step without sync", "ms low")
    return Recomputed(f"{synced:g} ms synchronized − {free:g} ms without sync", synced - free)


def _timed(f: Figures) -> tuple[float, float, float]:
    return (f(GSPLIT, "model forward (28-layer talker, CUDA graph), incl. sampling hook", "ms low"),
            f(GSPLIT, "sampler", "ms low"), f(GSPLIT, "scheduler (schedule + update_from_output)", "ms low"))


@claim("s3-remainder", "§3", "What the timers do not cover (input preparation, copies, Python) is 3–4 ms", "ms",
       lambda f: f"{stated_from(f(GSPLIT, 'remainder: input preparation, device-to-host copies, Python bookkeeping', 'ms low'))}–"
                 f"{stated_from(f(GSPLIT, 'remainder: input preparation, device-to-host copies, Python bookkeeping', 'ms high'))}")
def _(f):
    fwd, smp, sch = _timed(f)
    step = f(GSPLIT, "engine-core step without sync", "ms low")
    return Recomputed(f"{step:g} ms step − forward {fwd:g} − sampler {smp:g} − scheduler {sch:g}", step - fwd - smp - sch)


@claim("s3-gpu-compute", "§3", "The GPU's own work per frame is a couple of milliseconds", "ms", "≈2")
def _(f):
    fwd, smp, _sch = _timed(f)
    return Recomputed(f"the forward alone ({fwd:g} ms) up to forward plus sampler ({fwd + smp:g} ms)", lo=fwd, hi=fwd + smp)


@claim("s3-host-majority", "§3", "Runner work on the host takes the larger part of the uncapped step", "%", "> 50")
def _(f):
    _fwd, _smp, sch = _timed(f)
    rlo = f(GSPLIT, "remainder: input preparation, device-to-host copies, Python bookkeeping", "ms low")
    rhi = f(GSPLIT, "remainder: input preparation, device-to-host copies, Python bookkeeping", "ms high")
    step = f(GSPLIT, "engine-core step without sync", "ms low")
    return Recomputed(f"(scheduler {sch:g} ms + remainder {rlo:g}–{rhi:g} ms) / {step:g} ms",
                      lo=100 * (sch + rlo) / step, hi=100 * (sch + rhi) / step)


# === §4: the analytic projection ==================================================================

@claim("s4-talker-bytes", "§4", "One 0.6B talker step streams 1.2 GB of bf16 weights", "GB",
       at(INPUTS, "talker, once per frame", "bytes"))
def _(f):
    f.spec()
    m = get_model(_M06)
    step = talker_frame_bytes(m, "bf16")
    return Recomputed(
        f"from the published shapes: 28 blocks + final norm + codec_head at 2 B per weight = {step:,} B; "
        f"the 28 blocks alone hold {stack_params(m.talker):,} parameters. 1.2 GB is 0.6e9 × 2 B, the size "
        "in the model's name, which also counts the code predictor and the text embedding that a talker "
        "step does not read", step / 1e9)


@claim("s4-predictor-pass-bytes", "§4", "One code-predictor pass (5 layers, hidden 1024) reads about 160 MB", "MB", "≈160")
def _(f):
    f.spec()
    b = predictor_pass_bytes(get_model(_M06), "bf16")
    return Recomputed(f"from the published shapes: 5 blocks + final norm + one 2048-row lm_head at 2 B = {b:,} B", b / 1e6)


@claim("s4-predictor-frame-bytes", "§4", "Fifteen predictor passes read 2.4 GB per frame", "GB",
       at(INPUTS, "predictor, 15 passes", "bytes"))
def _(f):
    f.spec()
    fb = _spec_frame()
    return Recomputed(f"{fb.predictor_passes} × {fb.predictor_pass:,} B from the published shapes", fb.predictor / 1e9)


_DEVICES = (("h200", "H200"), ("orin-agx", "Jetson AGX Orin 64 GB"), ("orin-nx", "Jetson Orin NX 16 GB"), ("thor", "Jetson Thor"))


def _study_bytes(f: Figures) -> float:
    return (f(INPUTS, "talker, once per frame", "bytes") + f(INPUTS, "predictor, 15 passes", "bytes")) * 1e9


def _stream_ms(f: Figures, name: str) -> tuple[float, float]:
    """(ms from the study's bytes, ms from the spec's bytes) at the device's bandwidth."""
    bw = f(PROJ, name, "bandwidth")
    f.spec()
    return _study_bytes(f) / (bw * 1e9) * 1e3, _spec_frame().total / (bw * 1e9) * 1e3


def _register_projection() -> None:
    for key, name in _DEVICES:
        def stream(f, name=name):
            ms, spec_ms = _stream_ms(f, name)
            bw = f(PROJ, name, "bandwidth")
            return Recomputed(f"{_study_bytes(f) / 1e9:g} GB (the study's talker + predictor bytes) / {bw:g} GB/s", ms,
                              spec=f"{spec_ms:.4g} ms from the spec's {_spec_frame().total / 1e9:.3f} GB")
        claim(f"s4-streaming-{key}", "§4", f"Streaming one frame's weights on the {name} takes this long", "ms",
              at(PROJ, name, "weight streaming"))(stream)
    for key, name in _DEVICES[1:]:
        def total(f, name=name):
            ms, spec_ms = _stream_ms(f, name)
            host = f(PROJ, name, "host work")
            return Recomputed(f"streaming {ms:.4g} ms + host work {host:g} ms", ms + host,
                              spec=f"{spec_ms + host:.4g} ms with the spec's bytes")

        def rtf(f, name=name):
            ms, spec_ms = _stream_ms(f, name)
            host = f(PROJ, name, "host work")
            stated_ms = f(PROJ, name, "ms/frame")
            return Recomputed(f"({ms:.4g} + {host:g}) ms / 80 ms; from the study's rounded {stated_ms:g} ms it is "
                              f"{stated_ms / FRAME_MS:.4g}", (ms + host) / FRAME_MS,
                              spec=f"{(spec_ms + host) / FRAME_MS:.3f} with the spec's bytes")
        claim(f"s4-frame-ms-{key}", "§4", f"Projected time per frame on the {name}", "ms",
              at(PROJ, name, "ms/frame"))(total)
        claim(f"s4-rtf-{key}", "§4", f"Projected real-time factor on the {name}", None, at(PROJ, name, "RTF"))(rtf)


_register_projection()


@claim("s4-h200-floor", "§4", "On the H200 the bandwidth-plus-host model stays below the measured 6.0 ms frame", "ms",
       lambda f: f"< {stated_from(f(PROJ, 'H200', 'ms/frame'))}")
def _(f):
    ms, _spec_ms = _stream_ms(f, "H200")
    host = f(PROJ, "H200", "host work")
    return Recomputed(f"streaming {ms:.4g} ms + host work {host:g} ms", ms + host)


@claim("s4-host-orin", "§4", "Orin's host work is the Xeon's 4 ms stretched by its slower cores", "ms",
       at(PROJ, "Jetson AGX Orin 64 GB", "host work"))
def _(f):
    xeon = f(PROJ, "H200", "host work")
    return Recomputed(f"{xeon:g} ms × 2 (§1: an x86 core is about twice as fast as an Orin core)", xeon * 2)


@claim("s4-host-thor", "§4", "Thor's host work is about 6 ms", "ms", at(PROJ, "Jetson Thor", "host work"))
def _(f):
    xeon = f(PROJ, "H200", "host work")
    thor = f(PROJ, "Jetson Thor", "host work")
    return Recomputed(f"the study gives no per-core speed for Thor's host CPU; {thor:g} ms implies "
                      f"{thor / xeon:g}× the Xeon's {xeon:g} ms")


@claim("s4-int4-cut", "§4", "Four-bit talker weights would shrink every row's streaming term about threefold", "×", "≈3")
def _(f):
    f.spec()
    bf16, int4 = _spec_frame("bf16"), _spec_frame("int4")
    talker_only = (bf16.total) / (int4.talker + bf16.predictor)
    return Recomputed(
        f"frame bytes bf16 / int4 from the published shapes ({bf16.total / 1e9:.3f} / {int4.total / 1e9:.3f} GB); "
        f"Q4_0 stores 4.5 bits per weight against 16, a factor of {16 / 4.5:.3g}. Were only the talker 4-bit, "
        f"the cut would be {talker_only:.2f}×", bf16.total / int4.total)


@claim("s4-headroom", "§4", "Orin AGX and Thor keep 2–4× headroom over real time", "×", "2–4")
def _(f):
    agx, _ = _stream_ms(f, "Jetson AGX Orin 64 GB")
    thor, _ = _stream_ms(f, "Jetson Thor")
    a = FRAME_MS / (agx + f(PROJ, "Jetson AGX Orin 64 GB", "host work"))
    t = FRAME_MS / (thor + f(PROJ, "Jetson Thor", "host work"))
    return Recomputed(f"80 ms over the projected frame: Orin AGX {a:.3g}×, Thor {t:.3g}×", lo=a, hi=t)


# === §5.1: the CPU frame ==========================================================================

@claim("s51-predictor-loop", "§5.1", "The predictor loop is fifteen passes of 6.4 ms", "ms",
       at(CSPLIT, "code predictor loop (15 passes)", "ms"))
def _(f):
    per = f(FIG, "measured predictor pass", "value")
    f.spec()
    n = get_model(_M06).residual_codebooks
    return Recomputed(f"{n} × {per:g} ms", n * per)


for _key, _row, _what in (("predictor", "code predictor loop (15 passes)", "the predictor loop's"),
                          ("talker", "talker forward (28 layers)", "the talker forward's"),
                          ("sampler", "sampler", "the sampler's"), ("step", "engine-core step (total)", "the whole step's")):
    def _share(f, row=_row):
        ms = f(CSPLIT, row, "ms")
        return Recomputed(f"{ms:g} ms / 80 ms", 100 * ms / FRAME_MS)
    claim(f"s51-share-{_key}", "§5.1", f"On the CPU, {_what} time as a percentage of one frame", "%",
          at(CSPLIT, _row, "share of the 80 ms frame"))(_share)


def _bookkeeping(f: Figures) -> tuple[float, float]:
    ms = f(CSPLIT, "scheduler and bookkeeping", "ms")
    h = half_unit(stated_from(ms))
    return ms - h, ms + h


@claim("s51-share-bookkeeping", "§5.1", "On the CPU, scheduling and bookkeeping (≈2 ms) as a percentage of one frame", "%",
       at(CSPLIT, "scheduler and bookkeeping", "share of the 80 ms frame"))
def _(f):
    lo, hi = _bookkeeping(f)
    return Recomputed(f"≈2 ms read as {lo:g}–{hi:g} ms, over 80 ms", lo=100 * lo / FRAME_MS, hi=100 * hi / FRAME_MS)


@claim("s51-step-sum", "§5.1", "The parts add up to the engine-core step", "ms", at(CSPLIT, "engine-core step (total)", "ms"))
def _(f):
    parts = sum(f(CSPLIT, r, "ms") for r in ("code predictor loop (15 passes)", "talker forward (28 layers)", "sampler"))
    lo, hi = _bookkeeping(f)
    return Recomputed(f"predictor + talker + sampler = {parts:.4g} ms, plus bookkeeping {lo:g}–{hi:g} ms",
                      lo=parts + lo, hi=parts + hi)


@claim("s51-talker-params", "§5.1", "The talker forward covers 28 layers, 0.45 B parameters", "B parameters", "0.45")
def _(f):
    f.spec()
    m = get_model(_M06)
    per_step = talker_frame_bytes(m, "bf16") // 2
    return Recomputed(f"28 blocks + final norm + codec_head from the published shapes ({per_step:,}); the 28 blocks "
                      f"alone are {stack_params(m.talker) / 1e9:.4f} B", per_step / 1e9)


@claim("s51-sampler-vocab", "§5.1", "The talker samples from a 3072-way vocabulary", "ids", "3072")
def _(f):
    f.spec()
    return Recomputed("codec_vocab of the published config", get_model(_M06).codec_vocab)


# === §5.2: the same split in llama.cpp ============================================================

@claim("s52-f16-per-token", "§5.2", "126.7 tokens/s of the f16 backbone is 7.9 ms per token", "ms",
       at(LLAMA, "talker backbone decode, f16, per token", "value"))
def _(f):
    tps = f(LLAMA, "talker backbone decode, f16 (llama-bench)", "value")
    return Recomputed(f"1000 / {tps:g}", 1000 / tps)


@claim("s52-q4-per-token", "§5.2", "325.8 tokens/s of the Q4_0 backbone is 3.1 ms per token", "ms",
       at(LLAMA, "talker backbone decode, Q4_0, per token", "value"))
def _(f):
    tps = f(LLAMA, "talker backbone decode, Q4_0 (llama-bench)", "value")
    return Recomputed(f"1000 / {tps:g}", 1000 / tps)


@claim("s52-predictor-passes", "§5.2", "About 80 ms of llama-tts's frame is fifteen predictor passes plus sampling", "ms",
       at(LLAMA, "fifteen predictor passes plus sampling, per frame (approximate)", "value"))
def _(f):
    per = f(LLAMA, "one predictor pass (approximate)", "value")
    f.spec()
    n = get_model(_M06).residual_codebooks
    return Recomputed(f"{n} × {per:g} ms for the passes alone; sampling comes on top", n * per)


@claim("s52-frame-consistency", "§5.2", "A llama-tts frame takes between 85 and 97 ms", "ms",
       lambda f: f"{stated_from(f(LLAMA, 'llama-tts time per frame', 'value'))}–"
                 f"{stated_from(f(LLAMA, 'llama-tts time per frame', 'value (upper end)'))}")
def _(f):
    talker = f(LLAMA, "talker backbone decode, f16, per token", "value")
    rest = f(LLAMA, "fifteen predictor passes plus sampling, per frame (approximate)", "value")
    return Recomputed(f"one f16 talker token ({talker:g} ms) + predictor passes and sampling (≈{rest:g} ms)", talker + rest)


@claim("s52-pass-cheaper", "§5.2", "llama.cpp's predictor pass is about 20 % cheaper than vLLM-Omni's", "%", "≈20")
def _(f):
    ours = f(FIG, "measured predictor pass", "value")
    theirs = f(LLAMA, "one predictor pass (approximate)", "value")
    return Recomputed(f"(1 − {theirs:g} ms / {ours:g} ms) × 100", 100 * (1 - theirs / ours))


# === §5.3: root causes ============================================================================

@claim("s53-pass-budget", "§5.3", "Real time allows under 5 ms per pass: sixteen sequential passes share 80 ms", "ms",
       at(FIG, "real-time budget per pass (16 sequential passes in 80 ms)", "value"))
def _(f):
    f.spec()
    passes = get_model(_M06).num_code_groups
    return Recomputed(f"80 ms / {passes} passes (one talker + {passes - 1} residual codebooks)", FRAME_MS / passes)


@claim("s53-pass-floor", "§5.3", "A predictor pass's bf16 weights take about 1.6 ms to read at one socket-half's bandwidth", "ms",
       at(FIG, "predictor pass bandwidth floor (approximate)", "value"))
def _(f):
    mb = f(FIG, "bf16 weights read by one predictor pass (approximate)", "value")
    bw = f(FIG, "read bandwidth of one socket-half (approximate)", "value")
    f.spec()
    spec_mb = predictor_pass_bytes(get_model(_M06), "bf16") / 1e6
    return Recomputed(f"{mb:g} MB / {bw:g} GB/s", mb / bw, spec=f"{spec_mb / bw:.4g} ms from the spec's {spec_mb:.1f} MB")


@claim("s53-pass-over-floor", "§5.3", "The measured predictor pass is four times its bandwidth floor", "×",
       at(FIG, "measured pass over its floor (approximate)", "value"))
def _(f):
    meas = f(FIG, "measured predictor pass", "value")
    mb = f(FIG, "bf16 weights read by one predictor pass (approximate)", "value")
    bw = f(FIG, "read bandwidth of one socket-half (approximate)", "value")
    f.spec()
    spec_floor = predictor_pass_bytes(get_model(_M06), "bf16") / 1e6 / bw
    return Recomputed(f"{meas:g} ms / ({mb:g} MB / {bw:g} GB/s)", meas / (mb / bw),
                      spec=f"{meas / spec_floor:.3g}× over the spec's floor")


@claim("s53-kernel-count", "§5.3", "A predictor pass launches about a hundred small kernels", "kernels",
       at(FIG, "small kernels per predictor pass (approximate)", "value"))
def _(f):
    return Recomputed("the study does not list the operators; the count depends on how an engine splits a block")


@claim("s53-talker-floor", "§5.3", "The talker pass's bandwidth floor is about 12 ms", "ms",
       at(FIG, "talker pass, bandwidth floor (approximate)", "value"))
def _(f):
    gb = f(INPUTS, "talker, once per frame", "bytes")
    bw = f(FIG, "read bandwidth of one socket-half (approximate)", "value")
    f.spec()
    spec_gb = talker_frame_bytes(get_model(_M06), "bf16") / 1e9
    return Recomputed(f"{gb:g} GB / {bw:g} GB/s", gb / bw * 1e3,
                      spec=f"{spec_gb / bw * 1e3:.4g} ms from the spec's {spec_gb:.3f} GB")


@claim("s53-talker-over-floor", "§5.3", "The talker pass runs at twice its bandwidth floor", "×", "2")
def _(f):
    meas = f(CSPLIT, "talker forward (28 layers)", "ms")
    gb = f(INPUTS, "talker, once per frame", "bytes")
    bw = f(FIG, "read bandwidth of one socket-half (approximate)", "value")
    f.spec()
    spec_floor = talker_frame_bytes(get_model(_M06), "bf16") / 1e9 / bw * 1e3
    return Recomputed(f"{meas:g} ms / ({gb:g} GB / {bw:g} GB/s)", meas / (gb / bw * 1e3),
                      spec=f"{meas / spec_floor:.3g}× over the spec's {spec_floor:.3g} ms floor")


@claim("s53-thread-scaling", "§5.3", "Doubling the threads from 16 to 32 shortened the frame by 8 %", "%", "8")
def _(f):
    t16, t32 = f(THREADS, 0, "frame ms"), f(THREADS, 1, "frame ms")
    return Recomputed(f"({t16:g} − {t32:g}) / {t16:g} ms; relative to the {t32:g} ms after, it is "
                      f"{100 * (t16 - t32) / t32:.3g} %", 100 * (t16 - t32) / t16)


def _q4_speedup(f: Figures) -> float:
    return f(LLAMA, "talker backbone decode, Q4_0 (llama-bench)", "value") / f(LLAMA, "talker backbone decode, f16 (llama-bench)", "value")


@claim("s53-q4-shrink", "§5.3", "Quantizing the llama.cpp backbone to Q4_0 makes its bandwidth-bound part 2.5 times smaller", "×",
       at(FIG, "bandwidth term shrink from Q4_0 (approximate)", "value"))
def _(f):
    f16ms, q4ms = f(LLAMA, "talker backbone decode, f16, per token", "value"), f(LLAMA, "talker backbone decode, Q4_0, per token", "value")
    q4 = f(LLAMA, "talker backbone decode, Q4_0 (llama-bench)", "value")
    f16 = f(LLAMA, "talker backbone decode, f16 (llama-bench)", "value")
    return Recomputed(f"{q4:g} / {f16:g} tokens/s; from the rounded per-token times {f16ms:g} / {q4ms:g} ms it is "
                      f"{f16ms / q4ms:.3g}", _q4_speedup(f))


@claim("s53-talker-q4", "§5.3", "With Q4_0 weights the talker pass would drop from about 25 to about 12 ms", "ms", "≈12")
def _(f):
    meas = f(CSPLIT, "talker forward (28 layers)", "ms")
    gb = f(INPUTS, "talker, once per frame", "bytes")
    bw = f(FIG, "read bandwidth of one socket-half (approximate)", "value")
    s = _q4_speedup(f)
    return Recomputed(f"{meas:g} ms / {s:.3g} (the Q4_0 speed-up); 12 ms is the bf16 floor {gb:g} GB / {bw:g} GB/s, "
                      "not a quarter-size talker's time", meas / s)


@claim("s53-end-to-end", "§5.3", "With its serial vocoder, llama.cpp's frame is as slow as vLLM-Omni's engine step", "ms",
       lambda f: f"{stated_from(f(CSPLIT, 'engine-core step (total)', 'ms'))}–{stated_from(f(THREADS, 0, 'frame ms'))}",
       overlap=True)
def _(f):
    lo, hi = f(LLAMA, "llama-tts time per frame", "value"), f(LLAMA, "llama-tts time per frame", "value (upper end)")
    voc = f(LLAMA, "BigVGAN vocoder, serial, per frame", "value")
    step, earlier = f(CSPLIT, "engine-core step (total)", "ms"), f(THREADS, 0, "frame ms")
    return Recomputed(f"llama-tts {lo:g}–{hi:g} ms + vocoder {voc:g} ms, against vLLM-Omni's {step:g}–{earlier:g} ms "
                      "step (the two spans must overlap)", lo=lo + voc, hi=hi + voc)


# === §5.4: what would make the CPU real-time =======================================================

# §5.4's expected effects per remedy, as the study states them (ms per frame, or ms per pass).
FUSED_PASS_MS = (2.0, 3.0)
FUSION_SAVES_MS = (50.0, 65.0)
SAMPLER_SAVES_MS = 8.0
INT4_TALKER_MS = (10.0, 12.0)


def _three_levers(f: Figures) -> tuple[float, float, str]:
    step = f(CSPLIT, "engine-core step (total)", "ms")
    talker = f(CSPLIT, "talker forward (28 layers)", "ms")
    lo = step - FUSION_SAVES_MS[1] - SAMPLER_SAVES_MS - (talker - INT4_TALKER_MS[0])
    hi = step - FUSION_SAVES_MS[0] - SAMPLER_SAVES_MS - (talker - INT4_TALKER_MS[1])
    how = (f"{step:g} ms − fusion {FUSION_SAVES_MS[0]:g}–{FUSION_SAVES_MS[1]:g} ms − sampler {SAMPLER_SAVES_MS:g} ms "
           f"− talker {talker:g} → {INT4_TALKER_MS[0]:g}–{INT4_TALKER_MS[1]:g} ms (the study's own per-row effects)")
    return lo, hi, how


@claim("s54-fusion", "§5.4", "Fusing each predictor pass (6.4 → 2–3 ms) saves 50–65 ms per frame", "ms", "50–65")
def _(f):
    per = f(FIG, "measured predictor pass", "value")
    f.spec()
    n = get_model(_M06).residual_codebooks
    lo_ms, hi_ms = FUSED_PASS_MS
    return Recomputed(f"{n} × ({per:g} − {hi_ms:g}) to {n} × ({per:g} − {lo_ms:g}) ms",
                      lo=n * (per - hi_ms), hi=n * (per - lo_ms))


@claim("s54-sampler", "§5.4", "A cheaper sampler saves about 8 ms per frame", "ms", "8")
def _(f):
    cpu = f(CSPLIT, "sampler", "ms")
    gpu = f(FIG, "sampler on the GPU, same work", "value")
    return Recomputed(f"the study does not state what the cheaper sampler would cost; reaching the GPU's {gpu:g} ms "
                      f"would save {cpu - gpu:.3g} ms of the {cpu:g} ms")


@claim("s54-int4-talker", "§5.4", "Int8/int4 talker weights take the talker pass from 25 to 10–12 ms", "ms", "10–12")
def _(f):
    meas = f(CSPLIT, "talker forward (28 layers)", "ms")
    s = _q4_speedup(f)
    return Recomputed(f"{meas:g} ms / {s:.3g} (llama-bench's Q4_0 over f16 speed-up)", meas / s)


@claim("s54-three-levers", "§5.4", "The first three changes together bring the ≈134 ms step to 45–60 ms", "ms", "45–60")
def _(f):
    lo, hi, how = _three_levers(f)
    return Recomputed(how, lo=lo, hi=hi)


@claim("s54-arm-host", "§5.4", "On an ARM host 2–3× slower per core, those three changes still miss real time", "ms", "> 80")
def _(f):
    lo, hi, _how = _three_levers(f)
    return Recomputed(f"({lo:.3g}–{hi:.3g} ms) × 2 to × 3", lo=2 * lo, hi=3 * hi)


# === the change description ahead of the summary ====================================================

@claim("hdr-bandwidth-share", "header", "The faster engine reaches at most 39 % of the 222 GB/s the host can read", "%", "39")
def _(f):
    ceiling = f(HOST, "measured memory-bandwidth ceiling", "value")
    f.spec()
    m = get_model(_M06)
    f16_tps = f(LLAMA, "talker backbone decode, f16 (llama-bench)", "value")
    q4_tps = f(LLAMA, "talker backbone decode, Q4_0 (llama-bench)", "value")
    f16_gbs = talker_frame_bytes(m, "bf16") / 1e9 * f16_tps
    q4_gbs = talker_frame_bytes(m, "int4") / 1e9 * q4_tps
    return Recomputed(
        f"39 % of {ceiling:g} GB/s is {0.39 * ceiling:.3g} GB/s, but the study does not give the engines' own "
        f"bandwidths. For scale only: were llama-bench to read exactly the spec's talker step per token, f16 at "
        f"{f16_tps:g} tokens/s would draw {f16_gbs:.0f} GB/s ({100 * f16_gbs / ceiling:.0f} %) and Q4_0 at {q4_tps:g} "
        f"tokens/s {q4_gbs:.0f} GB/s ({100 * q4_gbs / ceiling:.0f} %)")


@claim("hdr-prefill", "header", "This fork's prefill is about twice llama.cpp's", "×", "≈2")
def _(f):
    return Recomputed("the study's text gives no prefill figures")


# --- the audit ----------------------------------------------------------------------------------

@dataclass
class Row:
    id: str
    section: str
    says: str
    stated: str
    recomputed: str | None
    deviation: float | None
    verdict: str
    spec: str | None
    how: str
    inputs: list[str] = field(default_factory=list)

    def cells(self) -> list[Any]:
        return [self.id, self.section, self.says, self.stated, self.recomputed,
                None if self.deviation is None else round(self.deviation * 100, 1),
                self.verdict, self.spec, self.how, ", ".join(self.inputs) or None]


def run(root: str | Path | None = None) -> list[Row]:
    """Every claim recomputed against the transcribed figures under ``root`` (default: results/)."""
    cache: dict[str, Artifact] = {}
    rows = []
    for c in CLAIMS:
        figs = Figures(root, cache)
        stated_text = c.stated(figs) if callable(c.stated) else c.stated
        rec = c.recompute(figs)
        v, dev = verdict(Stated(stated_text), rec, c.overlap)
        rows.append(Row(c.id, c.section, c.says, stated_text + _unit_suffix(c.unit), rec.text(c.unit), dev, v,
                        rec.spec, rec.how, figs.used))
    return rows


def summary(rows: list[Row]) -> dict[str, list[str]]:
    """Claim ids by verdict kind: holds, off, cannot be checked."""
    out: dict[str, list[str]] = {"holds": [], "off": [], "cannot be checked": []}
    for r in rows:
        key = "off" if r.verdict.startswith("off by") else r.verdict
        out[key].append(r.id)
    return out
