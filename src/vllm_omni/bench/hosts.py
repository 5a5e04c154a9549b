"""``vllm-omni-bench hosts``: one row per host, every measured run of the 0.6B model on it, as a computed artifact.

The CPU path and the speech pipeline were measured on several 2-core hosts (and one 16-core
one), often several times with one command. This command reads those artifacts and writes one
row per host: the fused int4 frame on 2 threads (median and range over its runs, and its RTF),
the int4 predictor pass against llama.cpp timed in the same run (the ratio's median and range),
and speech end to end (RTF and time to first audio of the 0.6B CustomVoice model, int4, 2
threads, streaming text, with the decoder ``speak`` picks). Hosts are told apart as
``targets.host_label`` labels them, so a host whose early artifacts did not record its CPU
family has those runs on a row of their own. It measures nothing itself; each row names the
artifacts it comes from.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from vllm_omni.bench.common import BenchError, add_output, computed_provenance, written
from vllm_omni.bench.targets import FRAME_MS, host_label, rows_by_name
from vllm_omni.results import store
from vllm_omni.results.schema import Artifact, validate

ARTIFACT_ID = "cpu-path/hosts"
COMMAND = "vllm-omni-bench hosts"
MODEL = "Qwen3-TTS-12Hz-0.6B"
SPEECH_ROWS = ("ours int4 t2 streaming bf16 decoder", "ours int4 t2 streaming")  # the first present: speak's default

COLUMNS = [
    {"name": "host", "unit": None, "type": "text"},
    {"name": "ISA", "unit": None, "type": "text"},
    {"name": "frame runs", "unit": None, "type": "number", "format": ".0f"},
    {"name": "int4 frame", "unit": "ms", "type": "number", "format": ".1f"},
    {"name": "frame min", "unit": "ms", "type": "number", "format": ".1f"},
    {"name": "frame max", "unit": "ms", "type": "number", "format": ".1f"},
    {"name": "frame RTF", "unit": None, "type": "number", "format": ".2f"},
    {"name": "llama.cpp runs", "unit": None, "type": "number", "format": ".0f"},
    {"name": "llama.cpp / ours", "unit": "x", "type": "number", "format": ".2f"},
    {"name": "llama.cpp / ours min", "unit": "x", "type": "number", "format": ".2f"},
    {"name": "llama.cpp / ours max", "unit": "x", "type": "number", "format": ".2f"},
    {"name": "speech runs", "unit": None, "type": "number", "format": ".0f"},
    {"name": "speech RTF", "unit": None, "type": "number", "format": ".2f"},
    {"name": "first audio", "unit": "ms", "type": "number", "format": ".0f"},
    {"name": "artifacts", "unit": None, "type": "text"},
]


def _one(art: Artifact, key: str, value: str, col: str) -> float | None:
    """The ``col`` of the row whose ``key`` is ``value``, or None where there is no such row."""
    for r in rows_by_name(art):
        if r.get(key) == value:
            if col not in r:
                raise BenchError(f"{art.path or art.id}: rows: no column {col!r}")
            return r[col]
    return None


def _measures(art_id: str, art: Artifact) -> tuple[str, float | tuple[float, float]] | None:
    """What one artifact adds to its host's row: ("frame", ms), ("llama", ratio) or ("speech", (RTF, ms))."""
    prov = art.provenance
    source = prov.get("source", "")
    if (prov.get("run") or {}).get("build", "native") != "native":  # the host running another CPU's loops
        return None
    if source == "vllm-omni-bench frame (fused)" and prov.get("model") == MODEL \
            and prov.get("quantization") == "int4" and prov.get("threads") == 2:
        total = _one(art, "component", "total", "median")
        if total is None:
            raise BenchError(f"{art.path or art.id}: rows: no 'total' row")
        return "frame", total
    if art_id.startswith("engines/llamacpp-predictor") and prov.get("model") == MODEL:
        ratio = _one(art, "case", "int4 t2", "llama.cpp / ours")
        return None if ratio is None else ("llama", ratio)
    if art_id.startswith("engines/cross-engine-t2") and prov.get("model") == MODEL:
        ratio = _one(art, "run", "llama.cpp int4", "vs this project")
        return None if ratio is None else ("llama", ratio)
    if art_id.startswith("end-to-end/speak-") and prov.get("model") == f"{MODEL}-CustomVoice":
        for setting in SPEECH_ROWS:
            rtf = _one(art, "setting", setting, "RTF")
            if rtf is not None:
                return "speech", (rtf, _one(art, "setting", setting, "first audio"))
    return None


def _spread(values: list[float]) -> list[float | None]:
    if not values:
        return [None, None, None]
    return [round(statistics.median(values), 3), min(values), max(values)]


def rows(root: str | Path | None = None) -> list[list[Any]]:
    """One row per host (``COLUMNS``), hosts in order of their label."""
    hosts: dict[str, dict[str, Any]] = {}
    for art_id, art in sorted(store.load_all(root).items()):
        if art.origin != "measured":
            continue
        found = _measures(art_id, art)
        if found is None:
            continue
        host = art.provenance["host"]
        label = host_label(host)
        isa = "AVX-512" if "avx512f" in (host.get("isa") or []) else "AVX2"
        h = hosts.setdefault(label, {"isa": isa, "frame": [], "llama": [], "speech": [], "ids": []})
        h[found[0]].append(found[1])
        h["ids"].append(art_id)
    out = []
    for label, h in sorted(hosts.items()):
        frame = _spread(h["frame"])
        llama = _spread(h["llama"])
        speech_rtf = [s[0] for s in h["speech"]]
        first = [s[1] for s in h["speech"] if s[1] is not None]
        out.append([
            label, h["isa"],
            len(h["frame"]), *frame, None if frame[0] is None else round(frame[0] / FRAME_MS, 3),
            len(h["llama"]), *llama,
            len(h["speech"]), round(statistics.median(speech_rtf), 3) if speech_rtf else None,
            round(statistics.median(first), 1) if first else None,
            ", ".join(h["ids"]),
        ])
    return out


def build(root: str | Path | None = None) -> dict[str, Any]:
    """The artifact (validated, not written); ``root`` is the results tree it reads."""
    data = {
        "schema": 1,
        "id": ARTIFACT_ID,
        "title": "Every host in one table: the int4 frame, the pass against llama.cpp, and speech end to end",
        "origin": "computed",
        "provenance": computed_provenance(
            COMMAND, model=MODEL, weights="as in each source artifact (random, seed 0, published shapes)",
            source="vllm-omni-bench hosts: the measured 0.6B fused int4 frames on 2 threads, the int4 predictor "
                   "passes of llama.cpp and this project timed in one run on 2 threads, and the 0.6B speak runs, "
                   "grouped by host"),
        "columns": COLUMNS,
        "rows": rows(root),
        "notes": (
            "One row per host as the artifacts' provenance records it (CPU, family and model where recorded, "
            "vector ISA, cores): a host whose early artifacts did not record its family has them on a row of "
            "their own. Int4 frame: the median total of the fused int4 frames on 2 threads (vllm-omni-bench "
            "frame), with the smallest and largest run; frame RTF: that median over 80 ms (talker, predictor "
            "and sampling only, no decoder). Llama.cpp / ours: one int4 predictor pass on 2 threads, "
            "llama.cpp's median over this project's, both timed in the same run (vllm-omni-bench llamacpp "
            "and engines); median, smallest and largest over runs. Speech RTF and first audio: the 0.6B "
            "CustomVoice model end to end (vllm-omni-bench speak), int4 weights, 2 threads, streaming text, "
            "with the decoder speak picks on that host (bf16 where the CPU multiplies it); medians over "
            "speech runs. Empty where a host has no such run. Runs on another build of the kernels (run.build, the "
            "loops of a CPU the host is not) are left out. Artifacts: every source of the row."
        ),
        "compare": {"tolerance": 1e-9, "key_columns": ["host"], "columns": ["frame runs", "int4 frame"]},
    }
    validate(data)
    return data


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help="one row per host: the int4 frame, the pass against llama.cpp, speech (computed)",
                       description=f"Read the measured artifacts and write results/{ARTIFACT_ID}.json. Measures nothing.")
    add_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data = build()
    for row in data["rows"]:
        print(f"{row[0]}: {row[2]} frame, {row[7]} llama.cpp and {row[11]} speech runs")
    for path in store.write_all([data], args.output):
        print(written(path, args.output))
    return 0
