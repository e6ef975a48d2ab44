"""The real-image check (experiments/real_stereo_check.py): its verdict on made-up per-window PSNRs,
and one cell trained for a few steps on the stereo windows."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import yaml

from experiments.real_stereo_check import (
    DATASET,
    REFERENCE,
    STEREO,
    SYNTHETIC_ORDER,
    StereoCellRunner,
    ordering,
    verdict,
)
from experiments.rows import BUDGETS, Cell, cell_settings, config_hash
from experiments.store import CELLS_NAME, CellStore
from hrope.nvs.data.real.stereo import StereoScenes, motorcycle_from_skimage, stereo_windows


def _records(offsets: list[float], noise: float = 0.01) -> dict:
    """Per row of SYNTHETIC_ORDER, 3 seeds x 20 windows of PSNR = window difficulty + row offset."""
    g = torch.Generator().manual_seed(0)
    windows = 20 + 3 * torch.rand(20, generator=g)
    records = {}
    for row, offset in zip(SYNTHETIC_ORDER, offsets):
        records[row] = []
        for seed in range(3):
            values = (windows + offset + noise * torch.randn(20, generator=g)).tolist()
            records[row].append({"seed": seed, "per_scene": {"psnr": values}, "metrics": {"psnr": sum(values) / 20}})
    return records


def test_the_ordering_holds_when_each_row_beats_the_next():
    order = ordering(_records([0.4, 0.3, 0.2, 0.1, 0.0]))
    assert order["holds"] and order["significant"]
    assert order["observed_order"] == [row.label for row in SYNTHETIC_ORDER]
    assert "holds on the real pair" in verdict(order)


def test_a_reversed_step_is_named():
    order = ordering(_records([0.4, 0.3, 0.2, 0.0, 0.1]))  # prope (rays world) below prope
    assert not order["holds"]
    assert [p["mean"] < 0 for p in order["pairs"]] == [False, False, False, True]
    assert f"reversed `{SYNTHETIC_ORDER[3].label}` vs `{SYNTHETIC_ORDER[4].label}`" in verdict(order)


def test_differences_within_noise_hold_only_in_the_means():
    order = ordering(_records([0.004, 0.003, 0.002, 0.001, 0.0], noise=0.5))
    assert not order["significant"]


def test_a_cell_trains_and_scores_on_the_windows(tmp_path):
    settings = {**STEREO, "size": 32, "shift": 16}  # the quick budget's 32-pixel model
    pair = motorcycle_from_skimage().downscale(settings["downscale"])
    windows = stereo_windows(pair, settings["size"], settings["shift"], 64, (0, pair.image_size[0]))
    datasets = {"train": StereoScenes(pair, windows[:2], 32), "eval": StereoScenes(pair, windows[2:5], 32)}
    budget = replace(BUDGETS["quick"], steps=2, warmup=1, seeds=(0,), train_scenes=2, eval_scenes=3)
    runner = StereoCellRunner(budget, tmp_path / "cache", datasets, settings, store=tmp_path / CELLS_NAME)
    cell = Cell(DATASET, REFERENCE, 0)
    record = runner.run(cell)
    assert record["steps"] == 2 and record["eval_scenes"] == 3
    assert len(record["per_scene"]["psnr"]) == 3 and all(math.isfinite(v) for v in record["per_scene"]["psnr"])
    assert runner.cell_id(cell).endswith(config_hash({**cell_settings(budget, cell), "stereo": settings}))
    data = yaml.safe_load((runner.folder(cell) / "config.yaml").read_text())["data"]
    assert data["kind"] == "folder" and data["depth"] == "maps" and "real_stereo_check" in data["note"]
    assert CellStore(tmp_path / CELLS_NAME).record(runner.cell_id(cell)) == record
