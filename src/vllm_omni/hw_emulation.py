"""Hardware profiles: what an edge target allows, and the vLLM engine arguments that follow.

Why: to emulate a small device on a big one, the engine must be held to the small device's
memory budget, batch size and graph-capture policy. A profile is data (:data:`PROFILES`);
:func:`engine_args` turns it into a plain dict of vLLM engine arguments (vLLM is never
imported here) and :func:`stage_env` into per-stage environment (CPU core binding).

Profile values are settings chosen for each target, not measurements.

Choosing a profile
------------------
``deploy_profile("auto")`` looks at the CUDA device (memory, SM count, integrated or not;
torch is imported only then, and only if it is installed) or, without one, at the CPU's
ISA in ``/proc/cpuinfo``. ``deploy_profile("edge")`` gives :data:`EDGE_DEFAULT`, the
smallest Jetson target: settings that fit it fit every larger edge device.

Overrides: ``VLLM_OMNI_HW_PROFILE``
-----------------------------------
Syntax: ``[<profile>][,<key>=<value>]...``. A leading profile name replaces the one the
code asked for; each ``key=value`` then overrides one field. Examples::

    VLLM_OMNI_HW_PROFILE=jetson_orin_8g
    VLLM_OMNI_HW_PROFILE=jetson_orin_8g,kv_budget_gib=2,graph_capture=none
    VLLM_OMNI_HW_PROFILE=max_num_seqs=1          # keep the detected profile, one sequence

Keys: see :data:`OVERRIDE_KEYS`. ``enforce_eager=true`` is shorthand for
``graph_capture=none`` and ``enforce_eager=false`` for ``graph_capture=all``; giving both
keys is an error. Unknown profiles, unknown keys and bad values raise ValueError naming
the valid choices.

Graph capture
-------------
``graph_capture`` is ``all`` (CUDA graphs for every stage), ``talker+predictor`` (graphs
for the talker and its code-predictor graph only, capture sizes limited to the batch
sizes the profile allows; the vocoder stage runs eager) or ``none`` (eager everywhere).
The study found that forcing eager mode on its 8 GB profile cost more per frame than
cutting the GPU down to an Orin NX's SM count, so the small-memory profiles keep graphs for
the talker and predictor and save memory on the vocoder stage and the capture sizes instead.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

ENV_VAR = "VLLM_OMNI_HW_PROFILE"
GRAPH_CAPTURE = ("all", "talker+predictor", "none")
STAGES = ("talker", "code2wav")
GIB = 2**30
CODE2WAV_KV_BYTES = 256 * 2**20  # the vocoder's sliding-window cache is small; cap it on budgeted profiles
# Both stages share one GPU: a profile's gpu_memory_utilization is the deployment's total,
# split between the stages' engines so that the two never claim more than it together.
STAGE_MEMORY_SHARE = {"talker": 0.75, "code2wav": 0.25}


@dataclass(frozen=True)
class HwProfile:
    """One deployment target. ``kind`` is ``gpu`` or ``cpu``."""

    name: str
    kind: str
    description: str
    memory_gib: float | None = None  # device memory, or the shared pool on unified-memory parts
    unified_memory: bool = False
    sm_count: int | None = None
    kv_budget_gib: float | None = None  # absolute talker KV budget; None: size by utilisation
    graph_capture: str = "all"
    max_num_seqs: int = 64
    gpu_memory_utilization: float | None = 0.9  # total over both stages, see STAGE_MEMORY_SHARE
    max_model_len: int = 4096
    cpu_cores: int | None = None  # CPU profiles: cores for the whole engine
    source: str = ""


PROFILES: dict[str, HwProfile] = {
    p.name: p
    for p in (
        HwProfile("jetson_orin_8g", "gpu", "Jetson Orin NX/Nano 8 GB: 8 SMs, 8 GB shared with the CPU",
                  memory_gib=8, unified_memory=True, sm_count=8, kv_budget_gib=1, graph_capture="talker+predictor",
                  max_num_seqs=2, gpu_memory_utilization=0.6, max_model_len=2048,
                  source="SM count: NVIDIA Jetson Orin data sheet (1024 CUDA cores)"),
        HwProfile("jetson_orin_32g", "gpu", "Jetson AGX Orin 32 GB: 14 SMs, 32 GB shared with the CPU",
                  memory_gib=32, unified_memory=True, sm_count=14, kv_budget_gib=4, graph_capture="all",
                  max_num_seqs=8, gpu_memory_utilization=0.5,
                  source="SM count: NVIDIA Jetson AGX Orin data sheet (1792 CUDA cores)"),
        HwProfile("cuda_discrete_8g", "gpu", "a discrete CUDA card with 8 GB of its own memory",
                  memory_gib=8, kv_budget_gib=2, graph_capture="talker+predictor", max_num_seqs=4,
                  gpu_memory_utilization=0.85),
        HwProfile("cuda_default", "gpu", "any other discrete CUDA card: vLLM's own sizing",
                  graph_capture="all", max_num_seqs=64, gpu_memory_utilization=0.9),
        HwProfile("h200", "gpu", "H200: 132 SMs, 140 GiB HBM (the study's host GPU)",
                  memory_gib=140, sm_count=132, graph_capture="all", max_num_seqs=64, gpu_memory_utilization=0.9,
                  source="study summary §1"),
        HwProfile("orin_agx_64g", "gpu", "Jetson AGX Orin 64 GB: 16 SMs", memory_gib=64, unified_memory=True,
                  sm_count=16, kv_budget_gib=8, graph_capture="all", max_num_seqs=8, gpu_memory_utilization=0.5,
                  source="study summary §1"),
        HwProfile("orin_nx_16g", "gpu", "Jetson Orin NX 16 GB: 8 SMs", memory_gib=16, unified_memory=True,
                  sm_count=8, kv_budget_gib=2, graph_capture="talker+predictor", max_num_seqs=4,
                  gpu_memory_utilization=0.55, source="study summary §1"),
        HwProfile("thor", "gpu", "Jetson Thor: 20 SMs, 128 GB shared with the CPU", memory_gib=128,
                  unified_memory=True, sm_count=20, kv_budget_gib=16, graph_capture="all", max_num_seqs=16,
                  gpu_memory_utilization=0.5, source="SM count: study summary §1"),
        HwProfile("x86_cpu_avx2", "cpu", "an 8-core AVX2 x86 host, the stand-in for a small ARM box",
                  kv_budget_gib=2, graph_capture="none", max_num_seqs=4, gpu_memory_utilization=None,
                  max_model_len=2048, cpu_cores=8),
        HwProfile("x86_cpu_amx", "cpu", "a 16-core AVX-512/AMX Xeon socket half (the study's 12+4 split)",
                  kv_budget_gib=4, graph_capture="none", max_num_seqs=4, gpu_memory_utilization=None,
                  cpu_cores=16),
    )
}
EDGE_DEFAULT = "jetson_orin_8g"
CHOICES = ("auto", "edge", *PROFILES)


def get_profile(name: str) -> HwProfile:
    """A profile by name (not ``auto``/``edge``); unknown names list the valid ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown hardware profile {name!r}; valid: {', '.join(CHOICES)}") from None


# --- overrides ----------------------------------------------------------------------------------

def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a finite number above 0") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("expected a finite number above 0")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a fraction in (0, 1]") from None
    if not 0 < value <= 1:
        raise ValueError("expected a fraction in (0, 1]")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("expected an integer of 1 or more") from None
    if value < 1:
        raise ValueError("expected an integer of 1 or more")
    return value


def _graph(text: str) -> str:
    if text not in GRAPH_CAPTURE:
        raise ValueError(f"expected one of {', '.join(GRAPH_CAPTURE)}")
    return text


OVERRIDE_KEYS: dict[str, Callable[[str], Any]] = {
    "kv_budget_gib": _positive_float,
    "graph_capture": _graph,
    "enforce_eager": _parse_bool,
    "max_num_seqs": _positive_int,
    "gpu_memory_utilization": _fraction,
    "max_model_len": _positive_int,
    "cpu_cores": _positive_int,
}
_NAME_RE = re.compile(r"^[a-z0-9_]+$")


def parse_override(text: str) -> tuple[str | None, dict[str, Any]]:
    """``"jetson_orin_8g,kv_budget_gib=2"`` -> ``("jetson_orin_8g", {"kv_budget_gib": 2.0})``."""
    syntax = f"{ENV_VAR} syntax: [<profile>][,<key>=<value>]... e.g. jetson_orin_8g,kv_budget_gib=2"
    name: str | None = None
    values: dict[str, Any] = {}
    parts = [p.strip() for p in text.split(",")]
    for i, part in enumerate(parts):
        if not part:
            raise ValueError(f"{ENV_VAR}={text!r}: empty item; {syntax}")
        key, eq, raw = part.partition("=")
        key = key.strip()
        if not eq:
            if i != 0:
                raise ValueError(f"{ENV_VAR}={text!r}: {part!r} is not key=value; only the first item may "
                                 f"name a profile; {syntax}")
            if part not in CHOICES:
                raise ValueError(f"{ENV_VAR}={text!r}: unknown hardware profile {part!r}; "
                                 f"valid: {', '.join(CHOICES)}")
            name = part
            continue
        if key not in OVERRIDE_KEYS:
            raise ValueError(f"{ENV_VAR}={text!r}: unknown key {key!r}; valid keys: {', '.join(OVERRIDE_KEYS)}")
        if key in values:
            raise ValueError(f"{ENV_VAR}={text!r}: {key} given twice; keep one")
        try:
            values[key] = OVERRIDE_KEYS[key](raw.strip())
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}={text!r}: bad value {raw.strip()!r} for {key}: {exc}") from None
    if "enforce_eager" in values and "graph_capture" in values:
        raise ValueError(f"{ENV_VAR}={text!r}: give graph_capture or enforce_eager, not both "
                         "(enforce_eager=true means graph_capture=none)")
    return name, values


def apply_overrides(profile: HwProfile, values: Mapping[str, Any]) -> HwProfile:
    """A copy of ``profile`` with ``values`` (already parsed) applied and checked."""
    values = dict(values)
    if "enforce_eager" in values:
        values["graph_capture"] = "none" if values.pop("enforce_eager") else "all"
    if profile.kind == "cpu":
        if values.get("graph_capture", "none") != "none":
            raise ValueError(f"{ENV_VAR}: profile {profile.name!r} is a CPU profile: CUDA graphs do not apply; "
                             "use graph_capture=none or a GPU profile")
        if "gpu_memory_utilization" in values:
            raise ValueError(f"{ENV_VAR}: profile {profile.name!r} is a CPU profile: "
                             "gpu_memory_utilization does not apply; "
                             "size the KV cache with kv_budget_gib")
    elif "cpu_cores" in values:
        raise ValueError(f"{ENV_VAR}: profile {profile.name!r} is a GPU profile: "
                         "cpu_cores applies to CPU profiles only; "
                         "pin a GPU engine's host threads with taskset instead")
    if profile.kind == "cpu" and values.get("cpu_cores", profile.cpu_cores or 2) < 2:
        raise ValueError(f"{ENV_VAR}: cpu_cores must be 2 or more: one core at least for each of the two stages")
    return dataclasses.replace(profile, **values)


# --- detection ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CudaInfo:
    """What ``auto`` needs to know about CUDA device 0."""

    name: str
    total_memory_bytes: int
    sm_count: int
    integrated: bool = False

    @property
    def memory_gib(self) -> float:
        return self.total_memory_bytes / GIB


def detect_cuda() -> CudaInfo | None:
    """CUDA device 0 through torch, only if torch is installed; None without a GPU."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch  # lazy on purpose: importing this module must stay light

    try:
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
    except Exception:  # noqa: BLE001 - a broken CUDA setup means "no GPU here"
        return None
    return CudaInfo(props.name, int(props.total_memory), int(props.multi_processor_count),
                    bool(getattr(props, "is_integrated", False)))


def detect_cpu_flags() -> set[str]:
    from vllm_omni.results.provenance import cpuinfo

    return set(cpuinfo()["flags"])


def pick_gpu_profile(info: CudaInfo) -> str:
    """Match a CUDA device to a profile by integration, memory and SM count."""
    mem = info.memory_gib
    jetson = info.integrated or bool(re.search(r"orin|thor|tegra", info.name, re.I))
    if jetson:
        if info.sm_count >= 20 and mem > 70:
            return "thor"
        if mem <= 10:
            return "jetson_orin_8g"
        if mem <= 20:
            return "orin_nx_16g"
        if mem <= 40:
            return "jetson_orin_32g"
        return "orin_agx_64g"
    if mem >= 100 and info.sm_count >= 100:
        return "h200"
    if mem <= 10:
        return "cuda_discrete_8g"
    return "cuda_default"


def pick_cpu_profile(flags: Iterable[str]) -> str:
    flags = set(flags)
    if "amx_tile" in flags and "avx512f" in flags:
        return "x86_cpu_amx"
    if "avx2" in flags:
        return "x86_cpu_avx2"
    raise ValueError(f"no hardware profile matches this CPU (no AVX2 flag); set {ENV_VAR} to one of: "
                     f"{', '.join(PROFILES)}")


def deploy_profile(
    name: str = "auto",
    *,
    env: Mapping[str, str] | None = None,
    cuda: CudaInfo | None | str = "detect",
    cpu_flags: Iterable[str] | None = None,
) -> HwProfile:
    """The profile to deploy with: ``auto``, ``edge`` or a profile name, then env overrides.

    ``cuda`` and ``cpu_flags`` replace detection (tests, or a caller that already knows);
    ``cuda=None`` means "no GPU". ``env`` defaults to ``os.environ``.
    """
    env = os.environ if env is None else env
    override = env.get(ENV_VAR, "").strip()
    env_name, values = parse_override(override) if override else (None, {})
    chosen = env_name or name
    if chosen == "auto":
        info = detect_cuda() if cuda == "detect" else cuda
        if info is not None:
            chosen = pick_gpu_profile(info)  # type: ignore[arg-type]
        else:
            chosen = pick_cpu_profile(detect_cpu_flags() if cpu_flags is None else cpu_flags)
    elif chosen == "edge":
        chosen = EDGE_DEFAULT
    return apply_overrides(get_profile(chosen), values)


# --- translation to vLLM -------------------------------------------------------------------------

def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: powers of two up to ``max_num_seqs``, and ``max_num_seqs`` itself."""
    sizes, n = [], 1
    while n < max_num_seqs:
        sizes.append(n)
        n *= 2
    return sizes + [max_num_seqs]


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")


def engine_args(profile: HwProfile, stage: str = "talker") -> dict[str, Any]:
    """vLLM engine arguments for one stage, as a plain dict (``EngineArgs(**d)``-shaped)."""
    _check_stage(stage)
    graphs = profile.graph_capture == "all" or (profile.graph_capture == "talker+predictor" and stage == "talker")
    args: dict[str, Any] = {
        "max_num_seqs": profile.max_num_seqs,
        "max_model_len": profile.max_model_len,
        "enforce_eager": not graphs or profile.kind == "cpu",
    }
    if profile.kind == "gpu" and profile.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = round(profile.gpu_memory_utilization * STAGE_MEMORY_SHARE[stage], 4)
    if profile.kv_budget_gib is not None:
        args["kv_cache_memory_bytes"] = int(profile.kv_budget_gib * GIB) if stage == "talker" else CODE2WAV_KV_BYTES
    if graphs and profile.kind == "gpu" and profile.graph_capture == "talker+predictor":
        # capture only the batch sizes this profile can run: graph pools stay small
        args["compilation_config"] = {"cudagraph_capture_sizes": capture_sizes(profile.max_num_seqs)}
    return args


def stage_cores(profile: HwProfile) -> dict[str, list[int]]:
    """CPU profiles: three quarters of the cores to the talker, the rest to the vocoder."""
    if profile.kind != "cpu" or not profile.cpu_cores:
        return {}
    n = profile.cpu_cores
    talker = max(1, min(n - 1, round(n * 3 / 4)))
    return {"talker": list(range(talker)), "code2wav": list(range(talker, n))}


def _cpu_list(cores: list[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])


def stage_env(profile: HwProfile, stage: str = "talker") -> dict[str, str]:
    """Environment for one stage's process: OpenMP core binding on CPU profiles.

    ``VLLM_CPU_KVCACHE_SPACE`` is deliberately not set: when present it silently replaces
    ``kv_cache_memory_bytes`` on vLLM's CPU platform.
    """
    _check_stage(stage)
    cores = stage_cores(profile).get(stage)
    if not cores:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": _cpu_list(cores), "OMP_NUM_THREADS": str(len(cores))}


def deploy_args(profile: HwProfile) -> dict[str, dict[str, Any]]:
    """Both stages: ``{"talker": {"engine_args": ..., "env": ...}, "code2wav": {...}}``."""
    return {s: {"engine_args": engine_args(profile, s), "env": stage_env(profile, s)} for s in STAGES}
