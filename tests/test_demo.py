"""`make demo`'s entry point on a toy budget: every model trains, is evaluated and is reported."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from experiments.plane_evidence import PLANNED_ROWS
from experiments.rows import BUDGETS, Cell, cell_config
from hrope.nvs.build_data import build_dataset
from hrope.nvs.demo import (
    COST_ORDER,
    DEMO_MODELS,
    DEPTH_ROWS,
    TIE_DB,
    _train_and_score,
    default_jobs,
    demo_config,
    main,
    reading,
)
from hrope.nvs.viz.demo_figures import save_comparison, save_results_bar


@pytest.mark.slow
def test_demo_runs_end_to_end_in_parallel_with_the_results_of_one_process(tmp_path):
    main(["--steps", "2", "--jobs", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "results.json").read_text())
    results = report["results"]
    assert report["jobs"] == 2 and [r["name"] for r in results] == [m.name for m in DEMO_MODELS]
    assert all(math.isfinite(r["metrics"]["psnr"]) and math.isfinite(r["metrics"]["ssim"]) for r in results)
    assert all(0 < r["metrics"]["st_lpips"] < 1 and r["cpu_seconds"] > 0 for r in results)
    for name in ("results.md", "comparison.png", "normals.png", "results_bar.png"):
        assert (tmp_path / name).stat().st_size > 0
    columns = 3 + len(DEMO_MODELS)  # 2 context views, the ground truth, every row
    with Image.open(tmp_path / "comparison.png") as image:  # 4 scenes x the columns, 200-pixel cells + labels
        assert image.size[0] >= columns * 200 and image.size[1] >= 4 * 200
    learned = next(r for r in results if r["name"] == "hrope-lift (learned planes, transferred, world rays)")
    assert set(learned["planes"]) >= {"context", "target"}  # the learned planes' accuracy is reported
    text = (tmp_path / "results.md").read_text()
    assert "Reading: " in text and "Plane accuracy of `hrope-lift (learned planes, transferred, world rays)`" in text
    assert "| model | PSNR ↑ | SSIM ↑ | LPIPS-Alex ↓ | ST-LPIPS (alex) ↓ |" in text
    assert all(f"\n| {m.name} | " in text for m in DEMO_MODELS)  # every row in the table, in the figure's legend
    assert "columns: context views | ground truth | " + " | ".join(m.name for m in DEMO_MODELS) + "." in text
    commit = report["provenance"]["commit"]  # the code that produced the results, in both files
    assert commit is not None and len(commit) == 40 and f"Commit: `{commit}`" in text

    # the same row trained in this process (its own scenes, rendered lazily) gives the same numbers
    config = demo_config(DEMO_MODELS[0], tmp_path, 2)
    scenes = build_dataset(config, "train"), build_dataset(config, "eval")
    alone = _train_and_score(0, tmp_path / "alone", 2, scenes, progress=False)["result"]
    assert alone["metrics"] == results[0]["metrics"]


# the demo rows that are rows of experiments/plane_evidence.py's planned set (its labels)
PLANNED = {
    "prope": "prope",
    "prope (world rays)": "prope (rays world)",
    "urope": "urope",
    "hrope-lift (context depth, transferred, world rays)": "hrope-lift (external, targets transfer, rays world)",
    "hrope-lift-uv (context depth, transferred)": "hrope-lift-uv (external, targets transfer)",
    "urope (token depth from context depth, transferred)": "worldrope (external, targets transfer, footprint False)",
}


def test_demo_rows_are_the_planned_rows_and_use_no_target_geometry(tmp_path):
    planned = {row.label: row for row in PLANNED_ROWS}
    for name, label in PLANNED.items():
        demo = demo_config(next(m for m in DEMO_MODELS if m.name == name), tmp_path, 10).model
        cell = cell_config(BUDGETS["full"], Cell("room", planned[label], 0), tmp_path).model
        assert demo.to_dict() == cell.to_dict(), name
    assert DEPTH_ROWS == {m.name for m in DEMO_MODELS if "context depth" in m.name}
    for row in DEMO_MODELS:  # planes and depth come from the context views only, carried into the targets
        options = demo_config(row, tmp_path, 10).model.predictor_options
        assert getattr(options, "scope", None) != "all" and (
            row.predictor == "learned" or options.targets == "transfer"
        )


def test_demo_figures(tmp_path):
    images = [[torch.rand(3, 16, 16) for _ in range(3)] for _ in range(2)]
    save_comparison(images, ["a", "b", "a long label that wraps over lines"], tmp_path / "c.png", cell_inches=1.0)
    with Image.open(tmp_path / "c.png") as image:
        assert image.size[0] == 300 and image.size[1] > 200  # 100 pixels per cell, labels above
    with pytest.raises(ValueError, match="one image per label"):
        save_comparison(images, ["a", "b"], tmp_path / "c.png")
    rows = [{"name": "x", "metrics": {"psnr": 20.0, "ssim": 0.5, "lpips": "unavailable"}}]
    rows.append({"name": "y", "metrics": {"psnr": 21.0, "ssim": 0.6, "lpips": "unavailable"}})
    assert save_results_bar(rows, tmp_path / "bar.png").stat().st_size > 0
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically
    with pytest.raises(ValueError, match="no metric"):
        save_results_bar([{"name": "x", "metrics": {"lpips": "unavailable"}}], tmp_path / "bar.png")


def test_demo_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["--jobs", "0"])
    assert "--jobs must be >= 1" in capsys.readouterr().err
    assert 1 <= default_jobs() <= len(DEMO_MODELS)
    assert sorted(COST_ORDER) == list(range(len(DEMO_MODELS)))


def test_reading_names_the_best_row_against_prope():
    results = [{"name": "prope", "metrics": {"psnr": 21.0}}, {"name": "x", "metrics": {"psnr": 21.25}}]
    assert reading(results).startswith("`x` scores highest, +0.25 dB over `prope`")
    assert reading(results[:1]).startswith("`prope` scores highest")
    results = [
        {"name": "prope", "metrics": {"psnr": 21.0}},
        {"name": "prope (world rays)", "metrics": {"psnr": 21.5}},
        {"name": "hrope-lift (x, world rays)", "metrics": {"psnr": 21.75}},
    ]
    assert reading(results).startswith(
        "`hrope-lift (x, world rays)` scores highest, +0.75 dB over `prope` and "
        "+0.25 dB over `prope (world rays)` (the same rays without planes)"
    )


def test_reading_compares_a_depth_row_with_the_best_row_without_depth_and_names_ties():
    depth = sorted(DEPTH_ROWS)
    results = [
        {"name": "prope", "metrics": {"psnr": 21.0}},
        {"name": "urope", "metrics": {"psnr": 22.0}},
        {"name": depth[0], "metrics": {"psnr": 22.5}},
        {"name": depth[1], "metrics": {"psnr": 22.5 - TIE_DB / 2}},
        {"name": depth[2], "metrics": {"psnr": 22.5 - 2 * TIE_DB}},
    ]
    text = reading(results)
    assert text.startswith(
        f"`{depth[0]}` scores highest, +1.50 dB over `prope` and +0.50 dB over `urope`, the best row without depth; "
        f"`{depth[1]}` ({-TIE_DB / 2:+.2f}) is within {TIE_DB} dB of it, which this run cannot separate. "
    )
    assert f"`{depth[2]}`" not in text and "one seed" in text
    results[1]["metrics"]["psnr"] = 22.4  # two rows within the tie band
    assert f"`urope` (-0.10) and `{depth[1]}` ({-TIE_DB / 2:+.2f}) are within" in reading(results)
    assert reading(results[:1] + results[2:3]).startswith(
        f"`{depth[0]}` scores highest, +1.50 dB over `prope`, the best row without depth. "
    )
