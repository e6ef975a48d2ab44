"""`make demo`'s entry point on a toy budget: every model trains, is evaluated and is reported."""

from __future__ import annotations

import json
import math

import pytest

from hrope.nvs.demo import DEMO_MODELS, main


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    main(["--steps", "2", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert len(results) == len(DEMO_MODELS)
    assert all(math.isfinite(r["metrics"]["psnr"]) and math.isfinite(r["metrics"]["ssim"]) for r in results)
    for name in ("results.md", "comparison.png", "normals.png"):
        assert (tmp_path / name).stat().st_size > 0
