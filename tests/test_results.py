"""The committed NVS experiments: each report regenerates from the experiment's ``cells.jsonl`` alone.

``benchmarks/results/<experiment>/`` keeps one ``cells.jsonl`` (nvs_store.py) next to its report;
the cell cache is not committed. Re-running the report's recorded command with ``--report-only``
on an empty cache, under the code version the report recorded (its provenance: the results
version keys the cells, the source fingerprint judges them stale), must give the committed
Markdown to the byte, and the committed JSON tables. The learning curves keep their curves in the
report JSON itself, from which the report's command rebuilds the report without training.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import experiments.learning_curve as learning_curve
import experiments.cells as nvs_cells
import experiments.report as nvs_report
import experiments.rows as nvs_rows
import experiments.nvs_table as nvs_table
import experiments.plane_evidence as plane_evidence
import experiments.real_stereo_check as real_stereo_check
from experiments.store import CELLS_NAME, CellStore

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"


EXPERIMENTS = sorted(path.parent.name for path in RESULTS.glob(f"*/{CELLS_NAME}"))


CELL_REPORTERS = ("nvs_table", "plane_evidence", "real_stereo_check")


def _command(report: dict) -> tuple[str | None, list[str]]:
    """The experiment and the arguments of a report's recorded command: ``python -m experiments.NAME ...``,
    or ``python benchmarks/NAME.py ...`` as reports made before the harness was a package record it."""
    words = shlex.split(report.get("command", ""))
    if words[1:2] == ["-m"] and len(words) > 2:
        return words[2].removeprefix("experiments."), words[3:]
    if len(words) > 1:
        return Path(words[1]).stem, words[2:]
    return None, []


def _script(report: dict) -> str | None:
    """The experiment of a report's recorded command, None without one."""
    return _command(report)[0]


def test_every_cell_report_keeps_its_cells_and_no_cache_is_committed():
    for folder in RESULTS.iterdir():
        report = folder / "nvs_table.json" if (folder / "nvs_table.json").is_file() else folder / f"{folder.name}.json"
        if report.is_file() and _script(json.loads(report.read_text())) in CELL_REPORTERS:
            assert folder.name in EXPERIMENTS, f"{folder} has a cell report but no {CELLS_NAME}"
    assert len(EXPERIMENTS) >= 15
    listed = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode or not listed.stdout:
        pytest.skip("not a git checkout")
    assert not [path for path in listed.stdout.split() if "/cache/" in path or "/runs/" in path]
    for name in ("metrics.json", "checkpoint.safetensors"):
        probe = f"benchmarks/results/{EXPERIMENTS[0]}/cache/room/none.learned.ctx2/seed0-0/{name}"
        assert subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT).returncode == 0, probe


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_committed_report_regenerates_from_its_cells_alone(name, tmp_path, monkeypatch, capsys):
    folder = RESULTS / name
    table = (folder / "nvs_table.json").is_file()
    report_path = folder / ("nvs_table.json" if table else f"{name}.json")
    committed = json.loads(report_path.read_text())
    shutil.copy(folder / CELLS_NAME, tmp_path / CELLS_NAME)
    monkeypatch.setattr(nvs_cells, "code_provenance", lambda: committed["provenance"])
    monkeypatch.setattr(nvs_rows, "RESULTS_VERSION", committed["provenance"]["results_version"])
    argv = _command(committed)[1] + ["--report-only", "--allow-stale", "--out", str(tmp_path)]
    if table:
        monkeypatch.setattr(nvs_table, "plots", lambda report, out: committed["plots"])
        report = nvs_table.main(argv)
        render, same = nvs_report.markdown, ("tables", "fig6", "claims", "progress", "stale_cells", "obsolete_cells")
    elif _script(committed) == "real_stereo_check":
        report = real_stereo_check.main(argv)
        render, same = real_stereo_check.markdown, ("rows", "ordering", "verdict")
    else:
        report = plane_evidence.main(argv + ["--cache", str(tmp_path / "cache")])
        render, same = plane_evidence.markdown, ("datasets",)
    assert not (tmp_path / "cache").exists(), "a report-only run touched the cache"
    report = {**report, "command": committed["command"], "generated": committed["generated"]}
    assert render(report) == (report_path.with_suffix(".md")).read_text()
    for key in same:
        assert report[key] == committed[key], key
    assert CellStore(tmp_path / CELLS_NAME).ids() == CellStore(folder / CELLS_NAME).ids()


# The learning curves keep every (row, seed) curve, per-scene PSNR at each point included, in the
# report JSON itself. `learning_curve/` predates per-seed curves (one seed, mean PSNR only, another
# report layout): its Markdown is the record and is not regenerated.
LEARNING_CURVES = sorted(path.parent.name for path in RESULTS.glob("learning_curve*/learning_curve.json"))
ONE_SEED_LAYOUT = {"learning_curve"}


def _trains_nothing(*args, **kwargs):
    raise AssertionError("a committed learning curve was trained again")


@pytest.mark.parametrize("name", sorted(set(LEARNING_CURVES) - ONE_SEED_LAYOUT))
def test_committed_learning_curve_regenerates_from_its_report_alone(name, tmp_path, monkeypatch):
    folder = RESULTS / name
    committed = json.loads((folder / learning_curve.REPORT_NAME).read_text())
    shutil.copy(folder / learning_curve.REPORT_NAME, tmp_path / learning_curve.REPORT_NAME)
    monkeypatch.setattr(learning_curve, "train_curve", _trains_nothing)
    monkeypatch.setattr(learning_curve, "write", lambda report, out: None)
    report = learning_curve.main(_command(committed)[1] + ["--out", str(tmp_path)])
    assert report["curves"] == committed["curves"] and report["summary"] == committed["summary"]
    monkeypatch.undo()
    learning_curve.write({**report, "command": committed["command"]}, tmp_path)
    assert (tmp_path / "learning_curve.md").read_text() == (folder / "learning_curve.md").read_text()
