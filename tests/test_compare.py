"""`vllm-omni-bench compare`: pass, fail, bad input and exit codes; and the artifact pages'
"Check this yourself" section that tells a reader how to use it."""

from __future__ import annotations

import ast
import copy
import json
import shlex
from pathlib import Path

import pytest

from vllm_omni.bench import cli
from vllm_omni.bench.compare import DEFAULT_TOLERANCE, compare, compare_cell, default_keys, resolve
from vllm_omni.results import load_all, site, validate

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = load_all()


def measured(**over) -> dict:
    """A small measured artifact: keyed by impl and threads, one median, one min, one ratio."""
    data = {
        "schema": 1,
        "id": "bench/kernel",
        "title": "A kernel",
        "origin": "measured",
        "provenance": {
            "source": "test", "date": "2026-09-09",
            "host": {"cpu": "test cpu", "cores_used": 2, "isa": None, "gpu": None, "memory_gib": None},
            "model": None, "weights": None, "quantization": None, "threads": 2, "builds": {},
            "command": "vllm-omni-bench kernel --threads 2",
            "repo": {"sha": None, "dirty": None}, "packages": {},
            "argv": [".venv/bin/vllm-omni-bench", "kernel", "--threads", "2", "--output", "/tmp/x"],
            "run": {"peak_rss_mib": 100.0},
        },
        "columns": [
            {"name": "impl", "unit": None, "type": "text"},
            {"name": "threads", "unit": None, "type": "number"},
            {"name": "median", "unit": "ms", "type": "number"},
            {"name": "min", "unit": "ms", "type": "number"},
            {"name": "measured / floor", "unit": None, "type": "number"},
        ],
        "rows": [["reference", 1, 10.0, 9.0, 4.0], ["fused", 1, 5.0, 4.5, 2.0], ["fused", 2, 3.0, 2.9, 1.2]],
    }
    data.update(over)
    validate(data)
    return data


def write(root: Path, data: dict) -> Path:
    path = root / f"{data['id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def dirs(tmp_path):
    pub, new = tmp_path / "published" / "results", tmp_path / "new"
    pub.mkdir(parents=True)
    new.mkdir()
    return pub, new


def run(capsys, new_path, art_id, pub, *extra) -> tuple[int, str, str]:
    rc = cli.main(["compare", str(new_path), art_id, "--published", str(pub), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def scaled(data: dict, factor: float, *, row: int | None = None, col: int = 2) -> dict:
    data = copy.deepcopy(data)
    for i, r in enumerate(data["rows"]):
        if row is None or i == row:
            r[col] = r[col] * factor
    return data


# --- pass and fail -------------------------------------------------------------------------------

def test_within_tolerance_passes_and_shows_both_values_with_their_ratio(dirs, capsys):
    pub, new = dirs
    base = measured()
    write(pub, base)
    path = write(new, scaled(scaled(base, 1.10), 0.95, col=4))
    rc, out, _ = run(capsys, path, "bench/kernel", pub)
    assert rc == 0, out
    assert "rows matched by: impl, threads (default" in out
    assert "columns compared: median, measured / floor (default" in out  # min is left out: not a median
    assert "tolerance: ±15 %" in out and "default for measured artifacts" in out
    line = next(l for l in out.splitlines() if l.startswith("fused, 2") and "median" in l)
    assert "3" in line and "3.3" in line and "1.100" in line and line.rstrip().endswith("pass")
    assert out.rstrip().splitlines()[-1] == "PASS: 6 cells compared, 6 pass, 0 fail"


def test_one_cell_outside_tolerance_fails_with_exit_1(dirs, capsys):
    pub, new = dirs
    base = measured()
    write(pub, base)
    path = write(new, scaled(base, 1.2, row=1))  # fused, 1 thread: 20 % slower
    rc, out, _ = run(capsys, path, "bench/kernel", pub)
    assert rc == 1
    failing = [l for l in out.splitlines() if "FAIL (" in l]
    assert len(failing) == 1 and failing[0].startswith("fused, 1") and "1.200" in failing[0]
    assert out.rstrip().splitlines()[-1] == "FAIL: 6 cells compared, 5 pass, 1 fail"


def test_artifact_compare_block_sets_keys_columns_and_tolerance(dirs, capsys):
    pub, new = dirs
    base = measured(compare={"tolerance": 0.5, "key_columns": ["impl", "threads"], "columns": ["min"]})
    write(pub, base)
    path = write(new, scaled(scaled(base, 3.0), 1.4, col=3))  # medians tripled (not compared), mins +40 %
    rc, out, _ = run(capsys, path, "bench/kernel", pub)
    assert rc == 0, out
    assert "columns compared: min (from the artifact's compare block)" in out
    assert "tolerance: ±50 % relative to the published value (from the artifact's compare block)" in out
    rc, out, _ = run(capsys, path, "bench/kernel", pub, "--tolerance", "0.3")
    assert rc == 1 and "given with --tolerance" in out


def test_published_row_missing_from_new_run_fails(dirs, capsys):
    pub, new = dirs
    base = measured()
    write(pub, base)
    partial = copy.deepcopy(base)
    partial["rows"] = partial["rows"][:2] + [["fused", 4, 2.0, 1.9, 0.9]]
    path = write(new, partial)
    rc, out, _ = run(capsys, path, "bench/kernel", pub)
    assert rc == 1
    assert "FAIL: published row fused, 2 has no counterpart in the new run" in out
    assert "note: new row fused, 4 is not in the published artifact" in out


def test_results_folder_stands_for_the_file(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    write(new, measured())
    rc, out, _ = run(capsys, new, "bench/kernel", pub)
    assert rc == 0 and "PASS" in out


@pytest.mark.parametrize(
    ("published", "new", "ok"),
    [(10.0, 11.4, True), (10.0, 11.6, False), (10.0, 8.6, True), (10.0, 8.4, False), (None, None, True),
     (None, 1.0, False), (1.0, None, False), (0, 0, True), (0, 0.1, False), ("x", "x", True), ("x", "y", False),
     (True, True, True), (True, False, False)],
)
def test_cell_rule(published, new, ok):
    assert compare_cell(published, new, 0.15)[1] is ok


def test_rows_without_keys_match_by_position():
    data = measured(columns=[{"name": "layers", "unit": None, "type": "number"},
                             {"name": "median", "unit": "ms", "type": "number"}],
                    rows=[[28, 10.0]])
    art = validate(data)
    settings = resolve(art)
    assert settings.key_columns == () and settings.columns == ("median",)
    assert compare(validate(scaled(data, 1.1, col=1)), art, settings).ok


# --- bad input: exit 2, one line naming the file and the field ------------------------------------

def _one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2
    err = err.strip()
    assert err.startswith("vllm-omni-bench compare: error:") and "\n" not in err
    for n in needles:
        assert n in err, err


def test_unknown_id(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    rc, _, err = run(capsys, write(new, measured()), "bench/nope", pub)
    _one_line_error(rc, err, "no artifact 'bench/nope'", "known: bench/kernel")


def test_malformed_new_file(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    bad = new / "bench" / "kernel.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1,')
    rc, _, err = run(capsys, bad, "bench/kernel", pub)
    _one_line_error(rc, err, str(bad), "(json)", "invalid JSON")


def test_invalid_new_artifact_names_the_field(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    broken = measured()
    broken["rows"][0][2] = "fast"
    path = write(new, broken)
    rc, _, err = run(capsys, path, "bench/kernel", pub)
    _one_line_error(rc, err, str(path), "rows[0][2] (median)")


def test_missing_new_file(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    rc, _, err = run(capsys, new / "absent.json", "bench/kernel", pub)
    _one_line_error(rc, err, "absent.json", "cannot read")


def test_new_artifact_lacks_a_compared_column(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    other = measured(columns=[{"name": "impl", "unit": None, "type": "text"},
                              {"name": "threads", "unit": None, "type": "number"},
                              {"name": "mean", "unit": "ms", "type": "number"}],
                     rows=[["fused", 1, 5.0]])
    rc, _, err = run(capsys, write(new, other), "bench/kernel", pub)
    _one_line_error(rc, err, "no column 'median'")


def test_no_matching_rows(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    other = measured(rows=[["eager", 8, 1.0, 1.0, 1.0]])
    rc, _, err = run(capsys, write(new, other), "bench/kernel", pub)
    _one_line_error(rc, err, "no row matches", "impl, threads")


def test_other_id_is_refused_unless_allowed(dirs, capsys):
    pub, new = dirs
    write(pub, measured())
    path = write(new, measured(id="bench/other"))
    rc, _, err = run(capsys, path, "bench/kernel", pub)
    _one_line_error(rc, err, "'bench/other', not 'bench/kernel'", "--allow-other-id")
    rc, out, _ = run(capsys, path, "bench/kernel", pub, "--allow-other-id")
    assert rc == 0 and "PASS" in out


def test_compare_block_naming_an_unknown_column(dirs, capsys):
    pub, new = dirs
    path = write(pub, measured(compare={"columns": ["p50"]}))
    rc, _, err = run(capsys, write(new, measured()), "bench/kernel", pub)
    _one_line_error(rc, err, str(path), "compare.columns", "no column 'p50'")


def test_duplicate_keys_are_ambiguous(dirs, capsys):
    pub, new = dirs
    path = write(pub, measured(rows=[["fused", 1, 5.0, 4.5, 2.0], ["fused", 1, 6.0, 5.5, 2.2]],
                               compare={"key_columns": ["impl", "threads"]}))
    rc, _, err = run(capsys, write(new, measured()), "bench/kernel", pub)
    _one_line_error(rc, err, str(path), "two rows share the key")


@pytest.mark.parametrize("value", ["0", "-0.1", "nan"])
def test_bad_tolerance(dirs, capsys, value):
    pub, new = dirs
    write(pub, measured())
    rc, _, err = run(capsys, write(new, measured()), "bench/kernel", pub, "--tolerance", value)
    _one_line_error(rc, err, "--tolerance must be a positive number")


# --- the published artifacts ------------------------------------------------------------------------

def test_compare_is_a_registered_subcommand():
    assert "compare" in cli.SUBCOMMAND_MODULES


def test_a_published_artifact_compares_equal_to_itself():
    """A smoke case: an unchanged copy passes, every published row matched."""
    art = PUBLISHED["cpu-path/predictor-both-int8-t1-2"]
    result = compare(art, art, resolve(art))
    assert result.ok and result.cells and not result.missing


def _moved(art, settings, factor: float):
    """A copy of ``art`` with one compared cell moved: a nonzero number scaled by ``factor``, or
    (no such cell) a text or boolean changed; and the (row, column) of that cell."""
    for r, row in enumerate(art.rows):
        for name in settings.columns:
            v = row[art.column_index(name)]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0:
                new = v * factor
                break
        else:
            continue
        break
    else:
        if factor < 1 + settings.tolerance:  # within tolerance: only a number can move and still pass
            return None, None
        for r, row in enumerate(art.rows):
            for name in settings.columns:
                v = row[art.column_index(name)]
                if isinstance(v, (str, bool)):
                    new = (not v) if isinstance(v, bool) else v + " (changed)"
                    break
            else:
                continue
            break
        else:
            raise AssertionError(f"{art.id}: no compared cell holds a value to move")
    moved = copy.copy(art)
    moved.rows = [list(x) for x in art.rows]
    moved.rows[r][art.column_index(name)] = new
    return moved, (r, name)


def _published_with_settings():
    """Every published artifact with its own settings, and every benchmark's artifact with the
    compare block its rerun will carry."""
    for art_id, art in sorted(PUBLISHED.items()):
        yield art_id, art, resolve(art)
        argv = art.provenance.get("argv") or []
        if art.origin == "measured" and len(argv) > 1 and argv[1] in BLOCKS and _block_for(argv[1], art_id):
            rerun = copy.copy(art)
            rerun.compare = _block_for(argv[1], art_id)
            settings = resolve(rerun)
            assert settings.tolerance == rerun.compare["tolerance"], art_id
            yield f"{art_id} (as rerun by {argv[1]})", rerun, settings


def test_every_published_artifact_reports_a_cell_moved_beyond_its_tolerance():
    """One compared cell of each artifact moved to three times its tolerance must be the one
    failing cell; the rest of the copy still matches."""
    checked = 0
    for name, art, settings in _published_with_settings():
        moved, (r, col) = _moved(art, settings, 1 + 3 * settings.tolerance)
        result = compare(moved, art, settings)
        assert not result.ok and not result.missing, name
        assert [(c.column, c.published) for c in result.failed] == [(col, art.rows[r][art.column_index(col)])], name
        checked += 1
    assert checked > len(PUBLISHED)


def test_every_published_artifact_passes_a_cell_moved_within_its_tolerance():
    """The same cell moved to half the tolerance passes (artifacts with no nonzero number to
    move are covered by the test above only)."""
    checked = 0
    for name, art, settings in _published_with_settings():
        moved, where = _moved(art, settings, 1 + 0.5 * settings.tolerance)
        if moved is None:
            continue
        result = compare(moved, art, settings)
        assert result.ok and result.cells and not result.missing, name
        assert any(c.published != c.new for c in result.cells), name  # the moved cell was compared
        checked += 1
    assert checked > len(PUBLISHED) // 2


def test_default_keys_skip_notes_and_host_specific_text():
    assert default_keys(PUBLISHED["vllm/two-engines"]) == ("stage",)  # not 'worker cpus'
    assert default_keys(PUBLISHED["cpu-path/frame-split-xeon"]) == ("component",)  # not 'note'
    assert default_keys(PUBLISHED["cpu-path/predictor-both-int8-t1-2"]) == ("impl", "weights", "threads")
    assert resolve(PUBLISHED["cpu-path/sampler-t2"]).columns == ("median",)
    assert DEFAULT_TOLERANCE["computed"] < 1e-6


def _id_prefix(node: ast.AST | None) -> str:
    """The literal start of a write_measured call's artifact_id ("" when it has none)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return ""


def _compare_blocks() -> dict[str, list[tuple[str, dict]]]:
    """The compare= literal of each benchmark module's write_measured calls, by subcommand, each with
    the literal start of the artifact id it writes (a module that writes two kinds of artifact
    has a block for each)."""
    blocks: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted((ROOT / "src" / "vllm_omni" / "bench").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "write_measured":
                kws = {kw.arg: kw.value for kw in node.keywords}
                if "compare" in kws:
                    blocks.setdefault(path.stem.replace("_", "-"), []).append(
                        (_id_prefix(kws.get("artifact_id")), ast.literal_eval(kws["compare"])))
    return blocks


def _block_for(name: str, art_id: str) -> dict | None:
    """The block a rerun of ``art_id`` by subcommand ``name`` carries: the one whose id prefix fits best."""
    fits = [(len(prefix), block) for prefix, block in BLOCKS[name] if art_id.startswith(prefix)]
    return max(fits, key=lambda f: f[0])[1] if fits else None


BLOCKS = _compare_blocks()


def test_benchmarks_state_a_tolerance():
    expected = {"bandwidth", "frame", "gpu-matmul", "predictor", "quality", "sampler", "talker", "vllm-two-engines"}
    assert expected <= set(BLOCKS)
    for name, blocks in BLOCKS.items():
        for _, block in blocks:
            assert 0 < block["tolerance"] <= 0.25, name


def test_benchmark_compare_blocks_fit_the_artifacts_they_write():
    """A rerun's compare block must name columns the artifact has (checked on the committed
    files); the two tests above then move a cell of each under that block."""
    reruns = [name for name, _, _ in _published_with_settings() if "(as rerun by" in name]  # resolve() raises on a bad block
    assert len(reruns) >= len(BLOCKS) // 2, reruns


# --- the "Check this yourself" section -------------------------------------------------------------

def test_measured_page_reruns_into_a_scratch_folder_then_compares():
    art = validate(measured())
    assert site.rerun_command(art) == "vllm-omni-bench kernel --threads 2"  # --output dropped
    text = "\n".join(site.check_yourself(art))
    assert 'export VLLM_OMNI_RESULTS_DIR="$(mktemp -d)"' in text
    assert 'vllm-omni-bench compare "$VLLM_OMNI_RESULTS_DIR/bench/kernel.json" bench/kernel' in text
    assert "within ±15 % (default for measured artifacts)" in text


@pytest.mark.parametrize("art_id", ["environment/amd-epyc-2c", "environment/amd-epyc-f25m17-2c",
                                    "environment/amd-epyc-zen1-2c"])
def test_an_env_rerun_writes_the_file_its_compare_reads(art_id):
    """env names its file after the host (and its naming once left out the CPU family), so the
    rerun pins the artifact's own name, once."""
    command = shlex.split(site.rerun_command(PUBLISHED[art_id]))
    assert command[:2] == ["vllm-omni-bench", "env"] and command.count("--name") == 1
    assert command[command.index("--name") + 1] == art_id.split("/")[1]


def test_computed_page_uses_the_recorded_command():
    text = "\n".join(site.check_yourself(PUBLISHED["audit/claims"]))
    assert "\nvllm-omni-bench audit\n" in text
    assert 'compare "$VLLM_OMNI_RESULTS_DIR/audit/claims.json" audit/claims' in text


def test_transcribed_page_points_at_the_source_and_the_audit():
    art = PUBLISHED["cpu-path/frame-split-xeon"]
    text = "\n".join(site.check_yourself(art))
    assert "no run to repeat" in text and "study summary §5.1" in text
    assert "vllm-omni-bench audit --no-write" in text and "compare" not in text


def test_artifact_page_has_the_section():
    page = site.artifact_page(PUBLISHED["cpu-path/sampler-t2"], [])
    assert "## Check this yourself" in page
    assert "vllm-omni-bench sampler --threads 2" in page


def test_default_keys_fall_back_when_labels_repeat():
    data = measured(rows=[["fused", 1, 5.0, 4.5, 2.0], ["fused", 1, 6.0, 5.5, 2.2]])
    art = validate(data)
    assert default_keys(art) == ()  # by position
    assert compare(art, art, resolve(art)).ok
