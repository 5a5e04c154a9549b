"""``vllm-omni-bench targets``: where the CPU path's targets stand, run by run, as a computed artifact.

The CPU path set three targets (docs/edge/cpu-path.md): a fused predictor pass within 1.3x of
its read floor at 1 and 2 threads, an int4 frame on 2 threads at a real-time factor of at most
0.5, and a sampler taking at most 1 % of that frame, all for the 0.6B model. This command reads
every measured 0.6B predictor and frame artifact under ``results/cpu-path`` and writes one row
per run and target, so that no run is left out and a new run shows up once the command is
rerun (a test fails while the committed scoreboard is stale). Beside it goes a summary, one row
per host, kernels, target, weight format and thread count: how many runs there are, how many
met, and the best, median and worst figure among them. It measures nothing itself.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from vllm_omni.bench.common import BenchError, add_output, computed_provenance, written
from vllm_omni.results import store
from vllm_omni.results.schema import Artifact, leaves, validate

AREA = "cpu-path"
NAME = "targets"
SUMMARY_NAME = "targets-summary"
COMMAND = "vllm-omni-bench targets"

PASS_LIMIT = 1.3  # fused pass / floor, at 1 and 2 threads
PASS_THREADS = (1, 2)
RTF_LIMIT = 0.5  # int4 frame, 2 threads
SAMPLER_LIMIT_PCT = 1.0  # sampler's share of that frame
FRAME_WEIGHTS, FRAME_THREADS = "int4", 2
FRAME_MS = 80.0
MODEL = "Qwen3-TTS-12Hz-0.6B"  # the model the targets were set for; other sizes are not judged
CLOCK_MAX_GHZ = 6.5
"""A clock reading above this is no x86 core's clock: the row keeps it, marked invalid in *clock note*."""
CLOCK_INVALID = (
    f"invalid: clock readings above {CLOCK_MAX_GHZ:g} GHz, which no x86 core runs at; the probe before "
    "6fff3d4 timed chained adds of an immediate, which this core folds and runs about four at a time "
    "(the run's other figures are not affected)"
)

PASS_TARGET = f"pass / floor ≤ {PASS_LIMIT}"
RTF_TARGET = f"frame RTF ≤ {RTF_LIMIT}"
SAMPLER_TARGET = f"sampler ≤ {SAMPLER_LIMIT_PCT:g} % of the frame"
TARGETS = (PASS_TARGET, RTF_TARGET, SAMPLER_TARGET)
WEIGHT_ORDER = ("fp32", "bf16", "int8", "int4")

COLUMNS = [
    {"name": "host", "unit": None, "type": "text"},
    {"name": "kernels", "unit": None, "type": "text"},
    {"name": "target", "unit": None, "type": "text"},
    {"name": "weights", "unit": None, "type": "text"},
    {"name": "threads", "unit": None, "type": "number"},
    {"name": "measured", "unit": None, "type": "number", "format": ".2f"},
    {"name": "limit", "unit": None, "type": "number", "format": "g"},
    {"name": "met", "unit": None, "type": "text"},
    {"name": "pass / reads alone", "unit": None, "type": "number", "format": ".2f"},
    {"name": "eager / fused", "unit": None, "type": "number", "format": ".1f"},
    {"name": "peak memory", "unit": "MiB", "type": "number", "format": ".0f"},
    {"name": "steal", "unit": "%", "type": "number", "format": ".1f"},
    {"name": "other load", "unit": "%", "type": "number", "format": ".1f"},
    {"name": "clock at start", "unit": "GHz", "type": "number", "format": ".2f"},
    {"name": "clock at end", "unit": "GHz", "type": "number", "format": ".2f"},
    {"name": "clock note", "unit": None, "type": "text"},
    {"name": "round trip min", "unit": "ns", "type": "number", "format": ".0f"},
    {"name": "round trip max", "unit": "ns", "type": "number", "format": ".0f"},
    {"name": "artifact", "unit": None, "type": "text"},
    {"name": "commit", "unit": None, "type": "text"},
]
NAMES = [c["name"] for c in COLUMNS]
GROUP = ("host", "kernels", "target", "weights", "threads")  # what one summary row stands for
SUMMARY_COLUMNS = [c for c in COLUMNS if c["name"] in GROUP] + [
    {"name": "runs", "unit": None, "type": "number", "format": ".0f"},
    {"name": "runs met", "unit": None, "type": "number", "format": ".0f"},
    {"name": "best", "unit": None, "type": "number", "format": ".2f"},
    {"name": "median", "unit": None, "type": "number", "format": ".2f"},
    {"name": "worst", "unit": None, "type": "number", "format": ".2f"},
    {"name": "limit", "unit": None, "type": "number", "format": "g"},
]


def host_label(host: dict[str, Any]) -> str:
    """The CPU as its artifact records it: name, family/model where recorded, vector ISA, cores."""
    name = " ".join(str(host.get("cpu") or "unknown CPU").replace("(R)", "").split())
    ident = host.get("cpu_id")
    family = f" ({ident.split(', stepping')[0]})" if ident else ""
    isa = "AVX-512" if "avx512f" in (host.get("isa") or []) else "AVX2"
    cores = host.get("cores_total")
    return f"{name}{family}, {isa}" + (f", {cores} cores" if cores else "")


def _commit(prov: dict[str, Any]) -> str | None:
    repo = prov.get("repo") or {}
    sha = repo.get("sha") or (prov.get("builds") or {}).get("vllm_omni")
    if not sha:
        return None
    return sha[:7] + (" (dirty)" if repo.get("dirty") else "")


def _peak(art: Artifact) -> float:
    return art.provenance["run"]["peak_rss_mib"]


def _conditions(art: Artifact) -> list[Any]:
    """What the host was doing during the run: steal and other processes' load (% of all CPU time),
    then the core's clock at the start and end (GHz), null where the run did not record them, and
    a note marking the clock readings invalid where one is above :data:`CLOCK_MAX_GHZ`."""
    run = art.provenance["run"]  # the schema requires it of a measured artifact
    clock = run.get("core_clock_ghz") or {}
    ghz = [None if clock.get(k) is None else round(clock[k], 2) for k in ("start", "end")]
    note = CLOCK_INVALID if any(v is not None and v > CLOCK_MAX_GHZ for v in ghz) else None
    return [None if run.get(k) is None else round(100 * run[k], 1)
            for k in ("host_steal_share", "host_other_busy_share")] + ghz + [note]


def _round_trips(art: Artifact, threads: int | None = None) -> list[float | None]:
    """The shortest and longest round trip between two cores that the run recorded (a predictor
    run per round at ``threads``, a frame run around its frames): on a VM, whether the cores shared
    an L3 throughout, never, or in part (vllm_omni.cpu.placement); null where none was recorded."""
    trips = art.provenance["run"].get("core_round_trip_ns") or {}
    values = [v for _, v in leaves(trips if threads is None else trips.get(str(threads))) if v is not None]
    return [min(values), max(values)] if values else [None, None]


def _kernels(art: Artifact) -> str | None:
    run = art.provenance["run"]  # the schema requires it of a measured artifact
    isa = run.get("native_isa")
    variant = run.get("variant")
    if isa and variant and variant != "native":
        return f"{isa} ({variant} build)"
    return isa


def rows_by_name(art: Artifact) -> list[dict[str, Any]]:
    """Each row of ``art`` as a dict keyed by column name."""
    names = [c.name for c in art.columns]
    return [dict(zip(names, row)) for row in art.rows]


def _pass_rows(art: Artifact) -> list[list[Any]]:
    rows = rows_by_name(art)
    eager = {r["threads"]: r["pass median"] for r in rows if r["impl"] == "reference"}
    out = []
    for r in rows:
        if r["impl"] != "fused" or r["threads"] not in PASS_THREADS:
            continue
        ratio = r["pass / floor"]
        ref = eager.get(r["threads"])
        out.append([
            host_label(art.provenance["host"]), _kernels(art), PASS_TARGET, r["weights"], r["threads"],
            ratio, PASS_LIMIT, "yes" if ratio <= PASS_LIMIT else "no", r.get("pass / reads alone"),
            round(ref / r["pass median"], 2) if ref else None, _peak(art), *_conditions(art),
            *_round_trips(art, r["threads"]), art.id, _commit(art.provenance),
        ])
    return out


def _frame_rows(art: Artifact) -> list[list[Any]]:
    prov = art.provenance
    if prov.get("quantization") != FRAME_WEIGHTS or prov.get("threads") != FRAME_THREADS:
        return []
    median = {r["component"]: r["median"] for r in rows_by_name(art)}
    try:
        total, sampler = median["total"], median["sampler"]
    except KeyError as exc:
        raise BenchError(f"{art.path or art.id}: rows: no {exc.args[0]!r} row") from None
    rtf = round(total / FRAME_MS, 3)
    share = round(100 * sampler / total, 2)
    common = [host_label(prov["host"]), None]
    tail = [None, None, _peak(art), *_conditions(art), *_round_trips(art), art.id, _commit(prov)]
    return [
        common + [RTF_TARGET, FRAME_WEIGHTS, FRAME_THREADS, rtf, RTF_LIMIT,
                  "yes" if rtf <= RTF_LIMIT else "no"] + tail,
        common + [SAMPLER_TARGET, FRAME_WEIGHTS, FRAME_THREADS, share, SAMPLER_LIMIT_PCT,
                  "yes" if share <= SAMPLER_LIMIT_PCT else "no"] + tail,
    ]


def scoreboard(root: str | Path | None = None) -> list[list[Any]]:
    """One row per measured fused run and target under ``root``'s cpu-path area, in a fixed order."""
    rows: list[list[Any]] = []
    for art_id, art in store.load_all(root).items():
        if not art_id.startswith(f"{AREA}/") or art.origin != "measured" or art.provenance.get("model") != MODEL:
            continue
        source = art.provenance.get("source", "")
        if source.startswith("vllm-omni-bench predictor"):
            rows += _pass_rows(art)
        elif source == "vllm-omni-bench frame (fused)":
            rows += _frame_rows(art)
    host, target, weights, threads, artifact = (NAMES.index(n) for n in ("host", "target", "weights", "threads",
                                                                        "artifact"))
    rows.sort(key=lambda r: (r[host], TARGETS.index(r[target]), WEIGHT_ORDER.index(r[weights]), r[threads],
                             r[artifact]))
    return rows


def summary(board: list[list[Any]]) -> list[list[Any]]:
    """One row per host, kernels, target, weights and threads of the scoreboard ``board``: the
    runs, how many met, and the best, median and worst figure (every target is an upper limit, so
    the best is the smallest). Rows go by host, then target, then each build's kernels."""
    at = [NAMES.index(n) for n in GROUP]
    measured, met, limit = (NAMES.index(n) for n in ("measured", "met", "limit"))
    groups: dict[tuple[Any, ...], list[list[Any]]] = {}
    for row in board:
        groups.setdefault(tuple(row[i] for i in at), []).append(row)

    def order(key: tuple[Any, ...]) -> tuple[Any, ...]:
        host, kernels, target, weights, threads = key
        return (host, TARGETS.index(target), kernels or "", WEIGHT_ORDER.index(weights), threads)

    out = []
    for key, runs in sorted(groups.items(), key=lambda kv: order(kv[0])):
        figures = [r[measured] for r in runs]
        out.append([*key, len(runs), sum(r[met] == "yes" for r in runs), min(figures),
                    round(statistics.median(figures), 3), max(figures), runs[0][limit]])
    return out


def _provenance() -> dict[str, Any]:
    return computed_provenance(
        COMMAND, model=MODEL,
        weights="as in each source artifact (random, seed 0, published shapes)",
        source="vllm-omni-bench targets: every measured 0.6B predictor and fused frame artifact "
               f"under results/{AREA}, checked against the CPU path's targets",
    )


def build_summary(board: list[list[Any]]) -> dict[str, Any]:
    """The summary artifact of the scoreboard rows ``board`` (validated, not written)."""
    data = {
        "schema": 1,
        "id": f"{AREA}/{SUMMARY_NAME}",
        "title": "Where the CPU path's targets stand: runs met, per host, format and thread count",
        "origin": "computed",
        "provenance": _provenance(),
        "columns": SUMMARY_COLUMNS,
        "rows": summary(board),
        "notes": (
            f"The scoreboard ({AREA}/{NAME}) grouped by {', '.join(GROUP)}: 'runs' is how many of its "
            "rows the group has, 'runs met' how many of them met the target, and 'best', 'median' and "
            "'worst' are the smallest, middle and largest of their 'measured' figures (pass / floor, "
            "frame RTF, or the sampler's percentage of the frame), each against the same 'limit'. A host "
            "whose early artifacts did not record its CPU family and model has those runs under a "
            "label of their own."
        ),
        "compare": {"tolerance": 1e-9, "key_columns": list(GROUP), "columns": ["runs", "runs met"]},
    }
    validate(data)
    return data


def build(root: str | Path | None = None) -> dict[str, Any]:
    """The scoreboard artifact (validated, not written); ``root`` is the results tree it reads."""
    data = {
        "schema": 1,
        "id": f"{AREA}/{NAME}",
        "title": "Where the CPU path's targets stand, run by run",
        "origin": "computed",
        "provenance": _provenance(),
        "columns": COLUMNS,
        "rows": scoreboard(root),
        "notes": (
            f"One row per run of the {MODEL.rsplit('-', 1)[1]} model (the one the targets were set for): the "
            f"fused rows at {' and '.join(map(str, PASS_THREADS))} threads of every predictor artifact, and "
            f"every fused {FRAME_WEIGHTS} frame on {FRAME_THREADS} threads. "
            "'measured' is pass / floor (the median pass over the time its bytes take at the best read "
            "rate of the run), the frame's median total over 80 ms, or the sampler's median as a "
            "percentage of the frame's. 'pass / reads alone' is the kernel's share of pass / floor, "
            "'eager / fused' the eager reference's median pass over the fused one in the same run "
            "(empty where the run timed the fused kernel only). 'peak memory' is the benchmark "
            "process's; 'steal' and 'other load' are the shares of all CPU time taken by the "
            "hypervisor and by other processes during the run, and 'clock at start' and 'clock at end' "
            "the clock of the benchmark's core as the run began and ended (each empty for runs made "
            "before the benchmarks recorded it); 'clock note' marks those two readings invalid where "
            f"either is above {CLOCK_MAX_GHZ:g} GHz, a probe error (the row's other figures stand); "
            "'commit' is the revision measured. Host, kernels and "
            "figures are copied from each artifact's provenance and rows."
        ),
        "compare": {"tolerance": 1e-9, "key_columns": ["artifact", "target", "threads"],
                    "columns": ["measured", "met"]},
    }
    validate(data)
    return data


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "targets",
        help="check every measured 0.6B CPU-path run against the targets and write the scoreboard and its summary",
        description=(
            f"Read the measured 0.6B predictor and fused frame artifacts under results/{AREA} and write "
            f"results/{AREA}/{NAME}.json, one row per run and target, met or not, and "
            f"results/{AREA}/{SUMMARY_NAME}.json, the runs met per host, format and thread count. "
            "Measures nothing."
        ),
    )
    p.add_argument("--no-write", action="store_true", help="print the counts only")
    add_output(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data = build()
    brief = build_summary(data["rows"])
    counts: dict[tuple[str, str], list[int]] = {}
    for row in brief["rows"]:
        r = dict(zip((c["name"] for c in SUMMARY_COLUMNS), row))
        met_total = counts.setdefault((r["host"], r["target"]), [0, 0])
        met_total[0] += r["runs met"]
        met_total[1] += r["runs"]
    for (host, target), (met, total) in counts.items():
        print(f"{host} | {target}: {met} of {total} runs met")
    if not args.no_write:
        for path in store.write_all([data, brief], args.output):
            print(written(path, args.output))
    return 0
