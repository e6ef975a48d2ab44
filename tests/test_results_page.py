"""docs/results.md's generated tables (experiments/results_page.py) and the planned / cap benchmark sets."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest


import experiments.plane_evidence as plane_evidence
import experiments.results_cells as results_cells
import experiments.results_page as results_page
import experiments.results_page_real as results_page_real
from experiments.intervals import hierarchical_bootstrap
from experiments.real_captures_sets import SETS
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
    monkeypatch.setattr(results_cells, "RESULTS", tmp_path)
    write_cells(tmp_path / "exp", {"a": [[21.0, 22.0, 23.0], [21.5, 22.5, 23.5]], "b": [[20.0, 21.0, 22.0]]})
    a, b, missing = (results_cells.Ref("exp", row, row) for row in ("a", "b", "c"))
    records = results_cells.row_records(a, "room")
    assert sorted(records) == [0, 1] and results_cells.psnr_text(records) == "22.25 ± 0.35"
    assert results_cells.delta_text(records, results_cells.row_records(b, "room")) == ("**+1.00 [+1.00, +1.00]**", 1)
    assert results_cells.psnr_text(results_cells.row_records(missing, "room")) == "not run"
    assert results_cells.delta_text(records, {}) == ("not run", 0)
    assert results_cells.row_records(results_cells.Ref("absent", "a", "a"), "room") == {}


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


CAPTURES = {"capA": (4, 8), "capB": (3, 8), "capC": (5, 4)}  # name: (scored scenes, test_every)


def real_record(arm, seed: int, steps: int, gains: dict[str, float], split: str = "eval") -> dict:
    """A real-capture cell of ``arm``: per-scene PSNR = scene difficulty + the arm's gain on the
    scene's capture + seed-and-scene noise (deterministic), with the facts experiments/real_captures.py keeps."""
    noise = random.Random(f"{arm.label}/{seed}/{steps}")
    captures = [name for name, (scenes, _) in CAPTURES.items() for _ in range(scenes)]
    psnr = [17.0 + 0.4 * (i % 5) + gains[c] + noise.gauss(0.0, 0.3) for i, c in enumerate(captures)]
    data = {
        "split": split,
        "protocol": "views",
        "held_out": [],
        "captures": {name: {"scenes": n, "test_every": every} for name, (n, every) in CAPTURES.items()},
    }
    return {
        "dataset": arm.data.name,
        "row": arm.row.label,
        "seed": seed,
        "steps": steps,
        "metrics": {"psnr": statistics.fmean(psnr)},
        "per_scene": {"psnr": psnr},
        "scene_captures": captures,
        "data": data,
        "provenance": {"commit": "ab" * 20, "dirty": False},
    }


def write_real_cells(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"cell": f"{r['dataset']}/{r['row']}/{r['steps']}/seed{r['seed']}", "record": r}) for r in records
    ]
    (folder / CELLS_NAME).write_text("\n".join(sorted(lines)) + "\n")


def table_row(lines: list[str], name: str, column: int = 1) -> list[str]:
    """The cells of the markdown table row whose ``column`` is ``name``."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    return next(row for row in rows if row[column : column + 1] == [name])


def expected_delta(a: list[dict], b: list[dict]) -> str:
    result = hierarchical_bootstrap(
        [r["per_scene"]["psnr"] for r in a], [r["per_scene"]["psnr"] for r in b], a[0]["scene_captures"]
    )
    text = f"{result['mean']:+.2f} [{result['low']:+.2f}, {result['high']:+.2f}]"
    return f"**{text}**" if result["excludes_zero"] else text


def test_real_columns_read_the_committed_planned_cells(tmp_path, monkeypatch):
    monkeypatch.setattr(results_cells, "RESULTS", tmp_path)
    gains = {"prope": 0.0, "world": 0.05, "urope": 1.0, "learned": -1.0, "lift": 0.3, "anchored": 1.2, "uv-camera": 1.1}
    records = {
        key: [real_record(results_page_real.ARMS[key], seed, 600, dict.fromkeys(CAPTURES, g)) for seed in (0, 1, 2)]
        for key, g in gains.items()  # rayrope known depth not run yet
    }
    records["urope"] = [  # urope ahead on one capture only
        real_record(results_page_real.ARMS["urope"], seed, 600, {"capA": 2.0, "capB": 0.0, "capC": 0.0})
        for seed in (0, 1, 2)
    ]
    write_real_cells(tmp_path / "real_captures" / "planned_pretrained", [r for rs in records.values() for r in rs])
    scratch = {  # the same rows from scratch: anchored at the token's depth gains less
        key: [real_record(results_page_real.SCRATCH_ARMS[key], s, 600, dict.fromkeys(CAPTURES, g)) for s in (0, 1, 2)]
        for key, g in (("urope", 0.5), ("anchored", 0.6))
    }
    write_real_cells(tmp_path / "real_captures" / "planned", [r for rs in scratch.values() for r in rs])
    lines = results_page._choices_table()
    prope = table_row(lines, "`prope`")
    values = [r["metrics"]["psnr"] for r in records["prope"]]
    assert prope[6:8] == [f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}", "—"]
    assert prope[8] == "3" and "`real_captures/planned_pretrained`" in prope[9]
    for key, name in (("world", "`prope`, world rays"), ("urope", "`urope` (no depth)")):
        assert table_row(lines, name)[7] == expected_delta(records[key], records["prope"])
    assert table_row(lines, "`prope`, world rays")[7].startswith("+")  # within noise: not bold
    assert table_row(lines, "`urope` anchored at each token's depth")[7].startswith("**+")
    assert table_row(lines, "`hrope-lift`, learned planes, camera rays")[7].startswith("**-")
    assert table_row(lines, "`rayrope` known depth (RGB-D mode)")[6:8] == ["pending", "pending"]
    assert table_row(lines, "`worldrope` with that depth")[6:8] == ["—", "—"]
    note = next(line for line in lines if line.startswith("Real captures"))
    assert "600 steps" in note and "12 test scenes" in note and "3 captures, `capA` (4), `capB` (3), `capC` (5)" in note
    assert "index % 8 == 0, `capC` % 4;" in note and "SfM points" in note and "pre-trained" in note
    planned = results_page._real_planned_table().splitlines()
    assert table_row(planned, "P5", column=0)[2:5] == [
        expected_delta(records["anchored"], records["urope"]),
        "3",
        expected_delta(scratch["anchored"], scratch["urope"]),
    ]
    assert table_row(planned, "P7", column=0)[2] == "pending" and table_row(planned, "P6", column=0)[4] == "pending"
    pretraining = results_page_real.pretraining_table().splitlines()  # pre-trained − from scratch, per row
    assert table_row(pretraining, "urope", column=0)[3:5] == [expected_delta(records["urope"], scratch["urope"]), "3"]
    assert table_row(pretraining, "prope", column=0)[2:5] == ["pending", "pending", "0"]


def test_real_columns_say_pending_before_the_cells_are_committed(tmp_path, monkeypatch):
    monkeypatch.setattr(results_cells, "RESULTS", tmp_path)
    lines = results_page._choices_table()
    assert table_row(lines, "`prope`")[6:8] == ["pending", "pending"]
    assert table_row(lines, "`hrope-lift-uv` + context depth, camera rays")[6:8] == ["pending", "pending"]
    assert table_row(lines, "`worldrope` (learned depth)")[6:8] == ["—", "—"]
    assert any(line.startswith("Real captures (`real_captures/planned_pretrained`): pending") for line in lines)
    planned = results_page._real_planned_table().splitlines()
    assert [table_row(planned, p, column=0)[2] for p in ("P1", "P4", "P5", "P6", "P7", "P8")] == ["pending"] * 6
    assert results_page_real.curve_table().startswith("Pending")
    assert results_page_real.pretraining_table().startswith("Pending")


@pytest.mark.parametrize("early_gain, supported", [(1.0, 600), (-1.0, 3000)])
def test_the_learning_curve_gives_the_budget_its_rule_supports(tmp_path, monkeypatch, early_gain, supported):
    """At 3000 steps urope leads prope by 1 dB; at 600 it leads by ``early_gain``: the same order
    (the 600-step budget suffices) or the reverse (the rule falls back to 3000)."""
    monkeypatch.setattr(results_cells, "RESULTS", tmp_path)
    arms = SETS["curve"].arms
    gains = {600: [0.0, early_gain, -0.5, 1.5], 3000: [0.0, 1.0, -0.5, 1.5]}
    records = [
        real_record(arm, seed, steps, dict.fromkeys(CAPTURES, gain), split="val")
        for steps, row_gains in gains.items()
        for arm, gain in zip(arms, row_gains)
        for seed in (0, 1, 2)
    ]
    write_real_cells(tmp_path / "real_captures" / "curve", records[:-1])
    assert "waits for every row" in results_page_real.curve_table()
    write_real_cells(tmp_path / "real_captures" / "curve", records)
    table = results_page_real.curve_table()
    assert f"The curve supports **{supported} steps**." in table
    assert "12 validation scenes" in table
    urope = [r for r in records if r["row"] == "urope"]
    prope = [r for r in records if r["row"] == "prope"]
    row = table_row(table.splitlines(), arms[1].label, column=0)
    assert row[2] == expected_delta(urope[:3], prope[:3]) and row[4] == expected_delta(urope[3:], prope[3:])
