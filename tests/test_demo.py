"""`make demo`'s entry point on a toy budget: every model trains, is evaluated and is reported."""

from __future__ import annotations

import json
import math

import pytest

from hrope.nvs.demo import DEMO_MODELS, main, reading


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    main(["--steps", "2", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert len(results) == len(DEMO_MODELS)
    assert all(math.isfinite(r["metrics"]["psnr"]) and math.isfinite(r["metrics"]["ssim"]) for r in results)
    for name in ("results.md", "comparison.png", "normals.png"):
        assert (tmp_path / name).stat().st_size > 0
    learned = next(r for r in results if r["name"] == "hrope-lift (learned planes, transferred, world rays)")
    assert set(learned["planes"]) >= {"context", "target"}  # the learned planes' accuracy is reported
    text = (tmp_path / "results.md").read_text()
    assert "Reading: " in text and "Plane accuracy of `hrope-lift (learned planes, transferred, world rays)`" in text
    assert not any(DEMO_MODELS[i].options.get("scope") == "all" for i in range(len(DEMO_MODELS)))  # no target geometry


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
