"""``vllm-omni-bench env``: this host's environment as a measured artifact."""

from __future__ import annotations

import argparse
import re

from vllm_omni.bench.common import add_name, add_output, write_measured
from vllm_omni.results import provenance


def host_slug() -> str:
    """A stable name for this kind of host: CPU model, x86 family and model where known (a VM's
    "AMD EPYC" covers several generations), and usable core count."""
    info = provenance.cpuinfo()
    model = re.sub(r"\(r\)|\(tm\)|processor|cpu @.*|\d+-core", "", (info["model"] or "unknown-cpu").lower())
    slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-")
    ident = re.match(r"family (\d+), model (\d+)", info["cpu_id"] or "")
    if ident:
        slug += f"-f{ident[1]}m{ident[2]}"
    return f"{slug}-{provenance.usable_cpus()}c"


def _size(nbytes: int | None) -> str | None:
    """A cache size in MiB or KiB; a VM reports its host's cache, of which its vCPUs may get a share."""
    if nbytes is None:
        return None
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:g} KiB"


def gpu() -> str | None:
    """The CUDA device torch sees, loading torch to ask if it is installed: this command's
    artifact says what the host has. (Other provenance never loads torch just to look.)"""
    try:
        import torch  # noqa: F401 - provenance.gpu_name asks the loaded module
    except ImportError:
        return None
    return provenance.gpu_name()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="record this host's CPU, memory, ISA and package versions")
    add_name(p, "environment", "CPU model, x86 family and model, cores")
    add_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = provenance.cpuinfo()
    pkgs = provenance.package_versions()
    rows: list[list] = [
        ["CPU model", info["model"]],
        ["CPU identity (x86 family, model, stepping)", info["cpu_id"]],
        ["logical CPUs on the machine", str(info["logical_cpus"])],
        ["CPUs this process may use", str(provenance.usable_cpus())],
        ["ISA features", ", ".join(provenance.isa()) or None],
        ["memory (GiB, /proc/meminfo)", None if provenance.memory_gib() is None else f"{provenance.memory_gib():g}"],
        ["L2 cache per core (as Linux reports it)", _size(provenance.cache_bytes(2))],
        ["L3 cache (as Linux reports it)", _size(provenance.cache_bytes(3))],
        ["GPU", gpu()],
    ]
    rows += [[f"package {name}", version] for name, version in sorted(pkgs.items())]
    write_measured(
        args,
        artifact_id=f"environment/{host_slug()}",
        title=f"This project's environment: {info['model'] or 'unknown CPU'}",
        columns=[{"name": "item", "unit": None, "type": "text"}, {"name": "value", "unit": None, "type": "text"}],
        rows=rows,
        model=None, weights=None, quantization=None, threads=provenance.usable_cpus(),
        source="vllm-omni-bench env",
        notes=("Read from /proc/cpuinfo, /proc/meminfo, os.sched_getaffinity, the cache sizes under "
               "/sys/devices/system/cpu/cpu0/cache and installed package metadata."),
    )
    return 0
