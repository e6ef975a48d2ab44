"""The committed NVS experiments: each report regenerates from the experiment's ``cells.jsonl`` alone.

``benchmarks/results/<experiment>/`` keeps one ``cells.jsonl`` (nvs_store.py) next to its report;
the cell cache is not committed. Re-running the report's recorded command with ``--report-only``
on an empty cache, under the code version the report recorded (its provenance: the results
version keys the cells, the source fingerprint judges them stale), must give the committed
Markdown to the byte, and the committed JSON tables.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))

import nvs_cells  # noqa: E402
import nvs_report  # noqa: E402
import nvs_rows  # noqa: E402
import nvs_table  # noqa: E402
import plane_evidence  # noqa: E402
from nvs_store import CELLS_NAME, CellStore  # noqa: E402

EXPERIMENTS = sorted(path.parent.name for path in RESULTS.glob(f"*/{CELLS_NAME}"))


def test_every_cell_report_keeps_its_cells_and_no_cache_is_committed():
    for folder in RESULTS.iterdir():
        report = folder / "nvs_table.json" if (folder / "nvs_table.json").is_file() else folder / f"{folder.name}.json"
        if report.is_file() and "datasets" in json.loads(report.read_text()):
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
    argv = shlex.split(committed["command"])[2:] + ["--report-only", "--allow-stale", "--out", str(tmp_path)]
    if table:
        monkeypatch.setattr(nvs_table, "plots", lambda report, out: committed["plots"])
        report = nvs_table.main(argv)
        render, same = nvs_report.markdown, ("tables", "fig6", "claims", "progress", "stale_cells", "obsolete_cells")
    else:
        report = plane_evidence.main(argv + ["--cache", str(tmp_path / "cache")])
        render, same = plane_evidence.markdown, ("datasets",)
    assert not (tmp_path / "cache").exists(), "a report-only run touched the cache"
    report = {**report, "command": committed["command"], "generated": committed["generated"]}
    assert render(report) == (report_path.with_suffix(".md")).read_text()
    for key in same:
        assert report[key] == committed[key], key
    assert CellStore(tmp_path / CELLS_NAME).ids() == CellStore(folder / CELLS_NAME).ids()

