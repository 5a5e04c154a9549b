"""``vllm-omni-bench audit``: the study's arithmetic recomputed, as computed artifacts.

Writes ``results/audit/claims.json`` (one row per claim of :mod:`vllm_omni.audit`) and
``results/audit/verdicts.json`` (how many claims hold, are off, or cannot be checked). The
inputs are the study's transcribed figures under the checkout's ``results/`` and the model
specs; a test reruns this command and fails when the committed files are stale.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_omni.bench.common import add_output, computed_provenance, written
from vllm_omni.results import store
from vllm_omni.results.schema import validate

AREA = "audit"
COMMAND = "vllm-omni-bench audit"

CLAIM_COLUMNS = [
    {"name": "claim", "unit": None, "type": "text"},
    {"name": "section", "unit": None, "type": "text"},
    {"name": "what the study says (paraphrased)", "unit": None, "type": "text"},
    {"name": "stated", "unit": None, "type": "text"},
    {"name": "recomputed", "unit": None, "type": "text"},
    {"name": "deviation", "unit": "%", "type": "number", "format": "+.1f"},
    {"name": "verdict", "unit": None, "type": "text"},
    {"name": "from the model specs", "unit": None, "type": "text"},
    {"name": "how", "unit": None, "type": "text"},
    {"name": "inputs", "unit": None, "type": "text"},
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="recompute every arithmetic claim of the study and write the claims audit",
        description=(
            "Recompute each derived figure of the study's text from the figures it states "
            f"(results/, transcribed) and the model specs; write results/{AREA}/claims.json and "
            f"results/{AREA}/verdicts.json as computed artifacts."
        ),
    )
    p.add_argument("--no-write", action="store_true", help="print the verdicts only")
    add_output(p)
    p.set_defaults(func=run)


def _provenance() -> dict[str, Any]:
    return computed_provenance(
        COMMAND, model="Qwen3-TTS-12Hz-0.6B", weights="none: arithmetic on stated figures and published shapes",
        source="vllm-omni-bench audit: the study summary's arithmetic, recomputed from its transcribed "
               "figures under results/ and the model specs in vllm_omni.models",
    )


def build(root: str | Path | None = None) -> list[dict[str, Any]]:
    """The two artifacts (validated, not written); ``root`` is where the study's figures are read."""
    from vllm_omni import audit

    rows = audit.run(root)
    groups = audit.summary(rows)
    claims = {
        "schema": 1,
        "id": f"{AREA}/claims",
        "title": "The study's arithmetic, recomputed claim by claim",
        "origin": "computed",
        "provenance": _provenance(),
        "columns": CLAIM_COLUMNS,
        "rows": [r.cells() for r in rows],
        "notes": (
            "A stated figure covers what rounds to it at the precision it is written with, widened to ±2 % "
            "when that is larger; a range must contain every recomputed value, each end widened the same "
            "way; a bound must hold strictly. Deviation: recomputed minus stated, relative to the stated "
            "figure (0 when the stated figure lies inside a recomputed span). 'From the model specs' "
            "repeats a recomputation with the byte counts of vllm_omni.models where the study's own "
            "inputs differ from them; the verdict judges the study's arithmetic on its own inputs, except "
            "for claims about the model's bytes and parameters, which are judged against the specs."
        ),
        "compare": {"tolerance": 1e-9, "key_columns": ["claim"],
                    "columns": ["stated", "recomputed", "deviation", "verdict"]},
    }
    verdicts = {
        "schema": 1,
        "id": f"{AREA}/verdicts",
        "title": "How many of the study's arithmetic claims hold",
        "origin": "computed",
        "provenance": _provenance(),
        "columns": [
            {"name": "verdict", "unit": None, "type": "text"},
            {"name": "claims", "unit": None, "type": "number"},
            {"name": "ids", "unit": None, "type": "text"},
        ],
        "rows": [[kind, len(ids), ", ".join(ids) or None] for kind, ids in groups.items()]
        + [["all claims", len(rows), None]],
        "notes": f"Counts over the claims of {AREA}/claims; the last row is their total.",
        "compare": {"tolerance": 1e-9, "key_columns": ["verdict"], "columns": ["claims", "ids"]},
    }
    for data in (claims, verdicts):
        validate(data)
    return [claims, verdicts]


def run(args: argparse.Namespace) -> int:
    claims, verdicts = build()
    for kind, count, ids in verdicts["rows"]:
        print(f"{kind}: {count}" + (f" ({ids})" if ids and kind != "holds" else ""))
    if not args.no_write:
        for path in store.write_all([claims, verdicts], args.output):
            print(written(path, args.output))
    return 0
