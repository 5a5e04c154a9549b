"""No measured run beats its own floor: a floor that a pass (ours or another engine's) beats is
a wrong floor, and every committed measurement is checked against that, not only the quoted ones."""

from __future__ import annotations

import pytest

from vllm_omni.results import load_all

# time over floor: at least 1; share of the floor's bandwidth: at most 1
OVER_FLOOR = ("pass / floor", "frame pass / floor", "measured / floor")
SHARE_OF_FLOOR = ("share of read bandwidth", "llama.cpp bandwidth fraction", "ours bandwidth fraction")
MEASURED = {art_id: art for art_id, art in load_all().items() if art.origin == "measured"}


def _checked(art):
    names = [c.name for c in art.columns]
    return [n for n in names if n in OVER_FLOOR + SHARE_OF_FLOOR]


CHECKED = sorted(art_id for art_id, art in MEASURED.items() if _checked(art))


def test_the_floors_of_both_areas_are_checked():
    assert {a.split("/")[0] for a in CHECKED} == {"cpu-path", "engines"}
    assert len(CHECKED) >= 20


@pytest.mark.parametrize("art_id", CHECKED)
def test_no_run_beats_its_floor(art_id):
    art = MEASURED[art_id]
    for name in _checked(art):
        i = art.column_index(name)
        for row in art.rows:
            value = row[i]
            if value is None:
                continue
            if name in OVER_FLOOR:
                assert value >= 1, f"{art.path}: {row[0]!r}: {name} = {value} < 1, faster than its floor"
            else:
                assert value <= 1, f"{art.path}: {row[0]!r}: {name} = {value} > 1, faster than its floor"
