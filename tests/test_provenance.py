"""Provenance of runs and benchmark results (hrope.nvs.running.provenance) and
the NVS cell cache's refusal of cells trained on an earlier code version (experiments/cells.py,
``--allow-stale``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hrope.nvs.running.provenance import code_provenance

from experiments.cells import METRICS_NAME, CellRunner, StaleCellsError
from experiments.rows import BUDGETS, Cell, Row
from experiments.store import CELLS_NAME, CellStore
from experiments.nvs_table import main
from hrope.nvs.running.provenance import describe, provenance, source_fingerprint

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO_ROOT / "benchmarks"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_commit_is_head_of_this_checkout():
    record = provenance()
    assert record["commit"] == _git(REPO_ROOT, "rev-parse", "HEAD")
    assert isinstance(record["dirty"], bool) and record["torch"] == torch.__version__
    assert describe(record).startswith(record["commit"])


def test_dirty_flag_tracks_tracked_files_only(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    clean = code_provenance(repo / "a.txt")
    assert clean["commit"] == _git(repo, "rev-parse", "HEAD") and clean["dirty"] is False
    (repo / "untracked.txt").write_text("new\n")
    assert code_provenance(repo / "a.txt")["dirty"] is False  # untracked files do not count
    (repo / "a.txt").write_text("two\n")
    dirty = code_provenance(repo / "a.txt")
    assert dirty["dirty"] is True and describe(dirty) == dirty["commit"] + " + uncommitted changes"
    # A file the checkout does not track: no commit (not the enclosing repository's).
    (repo / "sub").mkdir()
    (repo / "sub" / "b.py").write_text("")
    assert (
        code_provenance(repo / "untracked.txt")
        == code_provenance(repo / "sub" / "b.py")
        == {"commit": None, "dirty": None}
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "c.py").write_text("")
    assert describe(code_provenance(plain / "c.py")) == "unknown (not a git checkout)"
    assert describe(None) == describe({}) == "not recorded"


MODULE = '''"""Module docstring."""
import math


def area(r):
    """Area of a disc."""
    return math.pi * r ** 2  # pi r squared


class Disc:
    """A disc."""

    radius = 1.0
'''


def test_fingerprint_ignores_comments_and_docstrings_not_code(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "b.py").write_text("X = 1\n")
    (package / "a.py").write_text(MODULE)
    base = source_fingerprint(package)
    assert len(base) == 16 and source_fingerprint(package) == base
    edited = (
        MODULE.replace("Area of a disc.", "The area.")
        .replace("# pi r squared", "# note")
        .replace('"""A disc."""', '"""A disc,\n    reflowed."""')
        .replace("r ** 2", "(r ** 2)")
    )
    assert edited != MODULE
    (package / "a.py").write_text(edited)
    assert source_fingerprint(package) == base
    (package / "a.py").write_text(MODULE.replace("radius = 1.0", "radius = 2.0"))
    assert source_fingerprint(package) != base
    (package / "a.py").write_text(MODULE)
    (package / "sub" / "b.py").rename(package / "sub" / "c.py")  # a renamed module changes it too
    assert source_fingerprint(package) != base
    assert len(source_fingerprint()) == 16  # the installed hrope package


def _fake_record(cell: Cell, provenance_record: dict | None) -> dict:
    record = {
        "dataset": cell.dataset,
        "row": cell.row.label,
        "encoding": cell.row.encoding,
        "predictor": cell.row.predictor,
        "num_context": cell.row.num_context,
        "seed": cell.seed,
        "steps": 150,
        "final_loss": 0.02,
        "parameters": 1000,
        "train_seconds": 1.0,
        "metrics": {"psnr": 20.0 + cell.seed, "ssim": 0.5, "lpips": "unavailable"},
    }
    return record if provenance_record is None else {**record, "provenance": provenance_record}


def test_stale_cells_are_refused_by_default_and_reused_marked_with_allow_stale(tmp_path):
    """Cells as committed before provenance existed (none recorded) or trained by other code
    (another fingerprint): refused unless --allow-stale, then reused, marked and only read."""
    runner = CellRunner(BUDGETS["quick"], tmp_path / "cache")
    old, current = Cell("room", Row("none"), 0), Cell("room", Row("none"), 1)
    earlier = {**runner.provenance, "commit": "a" * 40, "dirty": False, "source_fingerprint": "0" * 16}
    for cell, record in ((old, earlier), (current, runner.provenance)):
        runner.folder(cell).mkdir(parents=True)
        (runner.folder(cell) / METRICS_NAME).write_text(json.dumps(_fake_record(cell, record)))

    assert runner.run(current)["metrics"]["psnr"] == 21.0 and runner.trained == []
    with pytest.raises(StaleCellsError, match="1 of 1 finished cells .* earlier code version .*commit aaaaaaaaaa"):
        runner.run(old)
    allowing = CellRunner(BUDGETS["quick"], tmp_path / "cache", allow_stale=True)
    assert allowing.run(old)["metrics"]["psnr"] == 20.0 and allowing.trained == []
    assert allowing.protocol(old, "baseline") is None  # nothing is computed from a stale cell
    assert not (allowing.folder(old) / "protocols.json").exists()

    argv = ["--quick", "--report-only", "--out", str(tmp_path), "--tables", "table1", "--rows", "none"]
    with pytest.raises(SystemExit, match=r"1 of 2 finished cells .*--allow-stale") as error:
        main(argv)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "nvs_table.json").exists()
    report = main([*argv, "--allow-stale"])
    assert report["stale_cells"] == {"count": 1, "trained_at": {"commit aaaaaaaaaa": 1}}
    row = report["tables"]["table1"]["datasets"]["room"][0]
    assert row["seeds"] == [0, 1]
    assert row["stale"] == {"seeds": [0], "note": "trained on an earlier code version (commit aaaaaaaaaa)"}
    assert report["tables"]["table1"]["datasets"]["object"][0]["stale"] is None
    assert report["provenance"]["source_fingerprint"] == runner.provenance["source_fingerprint"]
    markdown = (tmp_path / "nvs_table.md").read_text()
    assert "| none † |" in markdown and "Trained on an earlier code version** (commit aaaaaaaaaa: 1)" in markdown
    assert f"Commit: `{describe(runner.provenance)}`" in markdown


def test_committed_cells_need_allow_stale_and_cells_of_dropped_encodings_are_skipped(tmp_path, monkeypatch):
    """The committed quick-budget cells predate provenance and RESULTS_VERSION 1: under version 0
    they are found (no retraining needed), refused without the option; the two cells of the dropped
    hrope-pf-ape are skipped with a note. Under the current version only the cells of encodings
    with their own results version (retrained after it) are reused."""
    import experiments.rows as nvs_rows

    shutil.copy(BENCHMARKS / "results" / "nvs_quick" / CELLS_NAME, tmp_path / CELLS_NAME)
    current = main(["--quick", "--report-only", "--allow-stale", "--out", str(tmp_path)])["progress"]
    retrained = sum(
        f"/{e}." in cell for cell in CellStore(tmp_path / CELLS_NAME).ids() for e in nvs_rows.ENCODING_RESULTS_VERSIONS
    )
    assert nvs_rows.RESULTS_VERSION >= 1 and retrained and current["finished"] == retrained
    monkeypatch.setattr(nvs_rows, "RESULTS_VERSION", 0)
    with pytest.raises(SystemExit, match="commit not recorded"):
        main(["--quick", "--report-only", "--out", str(tmp_path)])
    report = main(["--quick", "--report-only", "--allow-stale", "--out", str(tmp_path)])
    progress = report["progress"]
    store = CellStore(tmp_path / CELLS_NAME)
    committed = len(store.ids()) - 2  # less the hrope-pf-ape cells
    assert progress["finished"] == committed, (
        "a committed cell is no longer found: did a change alter cell_settings or RESULTS_VERSION?"
    )
    current = sum(
        (store.record(cell).get("provenance") or {}).get("source_fingerprint") == source_fingerprint()
        for cell in store.ids()
    )
    assert report["stale_cells"]["count"] == committed - current
    # pending: Table 3's context-only plane sources, added after these cells (2 encodings x 3 sources x 2 seeds)
    assert progress["planned"] - progress["finished"] == 12
    assert report["obsolete_cells"] == {"room/hrope-pf-ape.learned.ctx2": 2}
    assert all(cell["encoding"] != "hrope-pf-ape" for cell in report["cells"])
    assert "`room/hrope-pf-ape.learned.ctx2` (2)" in (tmp_path / "nvs_table.md").read_text()
