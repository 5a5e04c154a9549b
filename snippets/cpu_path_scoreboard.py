"""Helpers shared by the pages on the fused CPU path: the scoreboard's runs, its host labels and targets,
and one fused row of a predictor artifact."""
import re

from vllm_omni.bench import targets
from vllm_omni.results import load, load_all

board = load("cpu-path/targets")
names = [c.name for c in board.columns]
runs = [dict(zip(names, r)) for r in board.rows]
brief = load("cpu-path/targets-summary")
groups = [dict(zip((c.name for c in brief.columns), r)) for r in brief.rows]


def verdicts(host_start, target, weights=None, threads=None):
    return [r["met"] == "yes" for r in runs if r["host"].startswith(host_start) and r["target"] == target
            and weights in (None, r["weights"]) and threads in (None, r["threads"])]


ZEN4, ZEN4_ID = "AMD EPYC, AVX-512", "AMD EPYC (family 25, model 17), AVX-512"  # before and since cpu_id
ZEN1, XEON = "AMD EPYC (family 23, model 1)", "Intel Xeon Processor (family 6, model 207)"
XEON2 = "Intel Xeon Processor (family 6, model 167)"  # 2 cores
P, RTF, SAMPLER = targets.PASS_TARGET, targets.RTF_TARGET, targets.SAMPLER_TARGET
P_LIMIT = targets.PASS_LIMIT


def fused_row(name, threads):
    a = load(f"cpu-path/{name}")
    (row,) = [dict(zip((c.name for c in a.columns), r)) for r in a.rows
              if r[a.column_index("impl")] == "fused" and r[a.column_index("threads")] == threads]
    return row


def board_row(name, target, threads):
    (row,) = [r for r in runs if r["artifact"] == f"cpu-path/{name}" and r["target"] == target
              and r["threads"] == threads]
    return row


ZEN4_RUN = re.compile(r"cpu-path/predictor-both-(fp32|int8|int4)-t1-2(-run\d+)?")  # the Zen 4 host's runs
published = load_all()
zen4_runs = {i: a for i, a in published.items() if ZEN4_RUN.fullmatch(i)}
assert runs and groups and zen4_runs
