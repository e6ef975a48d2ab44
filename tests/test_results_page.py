"""docs/results.md's generated tables (experiments/results_page.py) and the planned / cap benchmark sets."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest


import experiments.plane_evidence as plane_evidence
import experiments.results_page as results_page
from experiments.rows import BUDGETS, Cell, Row, cell_config, cell_settings, config_hash
from experiments.store import CELLS_NAME


def test_the_page_matches_the_committed_cells():
    assert results_page.main(["--check"]) == 0


def write_cells(folder: Path, rows: dict[str, list[list[float]]]) -> None:
    folder.mkdir(parents=True)
    lines = []
    for row, per_seed in rows.items():
        for seed, scenes in enumerate(per_seed):
            record = {
                "dataset": "room",
                "row": row,
                "seed": seed,
                "metrics": {"psnr": sum(scenes) / len(scenes)},
                "per_scene": {"psnr": scenes},
            }
            lines.append(json.dumps({"cell": f"room/{row}/seed{seed}-0", "record": record}))
    (folder / CELLS_NAME).write_text("\n".join(sorted(lines)) + "\n")


def test_rows_are_paired_by_seed_and_missing_rows_say_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(results_page, "RESULTS", tmp_path)
    write_cells(tmp_path / "exp", {"a": [[21.0, 22.0, 23.0], [21.5, 22.5, 23.5]], "b": [[20.0, 21.0, 22.0]]})
    a, b, missing = (results_page.Ref("exp", row, row) for row in ("a", "b", "c"))
    records = results_page.row_records(a, "room")
    assert sorted(records) == [0, 1] and results_page._psnr(records) == "22.25 ± 0.35"
    assert results_page._delta(records, results_page.row_records(b, "room")) == ("**+1.00 [+1.00, +1.00]**", 1)
    assert results_page._psnr(results_page.row_records(missing, "room")) == "not run"
    assert results_page._delta(records, {}) == ("not run", 0)
    assert results_page.row_records(results_page.Ref("absent", "a", "a"), "room") == {}


def test_unknown_block_names_are_errors():
    with pytest.raises(ValueError, match="unknown results_page block 'nope'"):
        results_page.render_page("<!-- results_page: nope -->\nx\n<!-- /results_page -->")


def test_validation_scoring_keeps_the_test_cells_keys():
    budget = replace(BUDGETS["quick"], seeds=(0,))
    cell = Cell("room", Row("prope"), 0)
    assert cell_settings(budget, cell) == cell_settings(budget, cell, split="eval")
    assert "split" not in cell_settings(budget, cell)["eval"]
    assert cell_settings(budget, cell, split="val")["eval"]["split"] == "val"
    assert config_hash(cell_settings(budget, cell, split="val")) != config_hash(cell_settings(budget, cell))
    assert cell_config(budget, cell, Path("out"), split="val").eval.split == "val"
    assert cell_config(budget, cell, Path("out")).eval.split == "eval"


def test_planned_rows_give_every_rival_the_same_depth():
    depth = [row for row in plane_evidence.PLANNED_ROWS if row.predictor != "learned"]
    assert {row.options for row in depth} == {plane_evidence.TRANSFER}
    assert {row.predictor for row in depth} == {"external"}
    assert [row.encoding for row in depth] == [
        "hrope-lift",
        "prope",
        "worldrope",
        "worldrope",
        "rayrope",
        "hrope-lift-ape",
        "hrope-lift-uv",
        "hrope-lift-uv",
    ]
    assert plane_evidence.REFERENCES["planned"].label == "prope"
    caps = [dict(row.options)["max_inverse_distance"] for row in plane_evidence.CAP_ROWS]
    assert caps == [2.0, 1.0, 5.0, None]
    labels = {row.label for row in plane_evidence.PLANNED_ROWS}
    assert {label for _, label in results_page.PLANNED_ROWS.values()} == labels  # the page shows every row
    for _, first, second in results_page.PLANNED:
        for dataset in results_page.DATASETS:
            assert results_page.planned_ref(first, dataset).experiment == results_page.PLANNED_EXPERIMENTS[dataset]
            assert results_page.planned_ref(second, dataset).experiment == results_page.PLANNED_EXPERIMENTS[dataset]


def test_a_cell_whose_training_stopped_early_gets_no_record(tmp_path, monkeypatch):
    """SIGTERM ends hrope.nvs.running.train.train early (checkpoint saved): the runner must not evaluate
    and record that model as the finished cell."""
    import experiments.cells as nvs_cells

    class Stopped:
        step, skipped_steps, last_loss = 3, 0, 1.0

    budget = replace(BUDGETS["quick"], seeds=(0,), train_scenes=2, eval_scenes=2)
    runner = nvs_cells.CellRunner(budget, tmp_path / "cache", store=tmp_path / CELLS_NAME)
    monkeypatch.setattr(runner, "_train", lambda folder, config: (Stopped(), 0, 1.0))
    cell = Cell("room", Row("prope"), 0)
    with pytest.raises(nvs_cells.StoppedCellError, match="stopped at step 3 of 150"):
        runner.run(cell)
    assert runner.cached(cell) is None and not (tmp_path / CELLS_NAME).exists()
