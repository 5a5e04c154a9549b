"""The claims audit: the verdict rule, key recomputations, and the subcommand that writes it
(whether the committed artifacts are what it writes today: tests/test_computed_artifacts.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from vllm_omni import audit
from vllm_omni.audit import Recomputed, Stated, half_unit, tolerance, verdict
from vllm_omni.bench import cli
from vllm_omni.models import get_model, talker_frame_bytes
from vllm_omni.results import load, published_results_dir

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT.parent / "shared" / "study" / "study-summary.txt"
CLAIMS = load("audit/claims")
ROWS = {r[0]: dict(zip([c.name for c in CLAIMS.columns], r)) for r in CLAIMS.rows}


# --- the rule ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "half"), [("17.6", 0.05), ("26", 0.5), ("0.125", 0.0005), ("160", 0.5), ("6.0", 0.05)])
def test_half_unit_follows_the_written_precision(text, half):
    assert half_unit(text) == pytest.approx(half)


def test_tolerance_is_rounding_or_two_percent_whichever_is_larger():
    assert tolerance("0.33") == pytest.approx(0.0066)
    assert tolerance("3") == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("stated", "rec", "expected"),
    [
        ("17.6", Recomputed("", 17.578), "holds"),
        ("≈3", Recomputed("", 3.6), "off by +20.0 %"),
        ("1.2", Recomputed("", 0.887), "off by -26.1 %"),
        ("15", Recomputed("", lo=12, hi=17), "holds"),
        ("2–4", Recomputed("", lo=3.1, hi=4.17), "holds"),
        ("45–60", Recomputed("", lo=45.5, hi=62.5), "off by +4.2 %"),
        ("10–12", Recomputed("", 9.3), "off by -7.0 %"),
        ("> 50", Recomputed("", lo=53.3, hi=70), "holds"),
        ("> 80", Recomputed("", lo=70, hi=120), "off by -12.5 %"),
        ("< 6.0", Recomputed("", 4.75), "holds"),
        ("13", Recomputed("no way to tell"), "cannot be checked"),
    ],
)
def test_verdict(stated, rec, expected):
    assert verdict(Stated(stated), rec)[0] == expected


def test_overlap_mode_asks_only_that_two_spans_meet():
    assert verdict(Stated("133.9–147"), Recomputed("", lo=140, hi=152), overlap=True)[0] == "holds"
    assert verdict(Stated("133.9–147"), Recomputed("", lo=160, hi=170), overlap=True)[0].startswith("off by +")


def test_a_stated_figure_must_be_a_number_range_or_bound():
    with pytest.raises(ValueError, match="not a number"):
        Stated("about three")


# --- what the audit finds --------------------------------------------------------------------------

def test_talker_bytes_are_judged_against_the_published_shapes():
    row = ROWS["s4-talker-bytes"]
    spec = talker_frame_bytes(get_model("0.6B"), "bf16") / 1e9
    assert row["stated"] == "1.2 GB" and row["recomputed"] == f"{spec:.4g} GB"
    assert row["verdict"].startswith("off by -26")
    assert "vllm_omni.models" in row["inputs"]


def test_projection_arithmetic_holds_on_the_studys_own_inputs():
    for dev in ("h200", "orin-agx", "orin-nx", "thor"):
        assert ROWS[f"s4-streaming-{dev}"]["verdict"] == "holds"
        assert "from the spec's 3.310 GB" in ROWS[f"s4-streaming-{dev}"]["from the model specs"]
    assert ROWS["s53-pass-over-floor"]["verdict"] == "holds"  # 6.4 ms / 1.6 ms = 4
    assert ROWS["s53-talker-over-floor"]["recomputed"].startswith("2.1")


def test_unchecked_claims_say_why_and_have_no_figure():
    unchecked = [r for r in ROWS.values() if r["verdict"] == "cannot be checked"]
    assert {r["claim"] for r in unchecked} >= {"hdr-bandwidth-share", "s53-kernel-count"}
    for r in unchecked:
        assert r["recomputed"] is None and r["deviation"] is None and len(r["how"]) > 30


def test_every_claim_reads_existing_figures_and_has_a_verdict():
    ids = [r[0] for r in CLAIMS.rows]
    assert len(ids) == len(set(ids)) == len(audit.CLAIMS) >= 50
    for r in ROWS.values():
        assert re.fullmatch(r"holds|cannot be checked|off by [+-]\d+\.\d %", r["verdict"]), r
        for art_id in (r["inputs"] or "").split(", "):
            if art_id and art_id != audit.SPEC:
                assert load(art_id).origin == "transcribed", (r["claim"], art_id)


def test_verdict_counts_add_up():
    counts = {v: n for v, n, _ids in load("audit/verdicts").rows}
    assert counts.pop("all claims") == len(CLAIMS.rows) == sum(counts.values())
    assert counts["off"] == sum(r["verdict"].startswith("off by") for r in ROWS.values())


def test_a_corrected_transcription_changes_the_audit(tmp_path):
    """The audit reads the transcribed artifacts: fix a figure there and the verdict follows."""
    root = tmp_path / "results"
    shutil.copytree(published_results_dir(), root)
    path = root / "device-simulation" / "projection-study.json"
    data = json.loads(path.read_text())
    data["rows"][1][2] = 20.0  # Orin AGX streaming, 17.6 -> 20.0
    path.write_text(json.dumps(data))
    rows = {r.id: r for r in audit.run(root)}
    assert rows["s4-streaming-orin-agx"].verdict.startswith("off by -12")
    assert rows["s4-streaming-thor"].verdict == "holds"


@pytest.mark.skipif(not STUDY.is_file(), reason=f"the study's source text is not at {STUDY}")
def test_paraphrases_do_not_quote_the_study():
    def words(text: str) -> list[str]:
        return re.findall(r"[a-z0-9]+", text.lower())

    study = words(STUDY.read_text(encoding="utf-8"))
    runs = {" ".join(study[i:i + 7]) for i in range(len(study) - 6)}
    for r in ROWS.values():
        for field in ("what the study says (paraphrased)", "how"):
            w = words(r[field])
            quoted = [" ".join(w[i:i + 7]) for i in range(len(w) - 6) if " ".join(w[i:i + 7]) in runs]
            assert not quoted, (r["claim"], field, quoted[0])


# --- the subcommand -----------------------------------------------------------------------------------

def test_audit_is_a_registered_subcommand():
    assert "audit" in cli.SUBCOMMAND_MODULES
