"""The noise set of plane_evidence.py and its figure (experiments/noise_figure.py) on made-up cells."""

import json
from pathlib import Path

import pytest

import experiments.noise_figure as noise_figure
import experiments.plane_evidence as plane_evidence

ROOT = Path(__file__).resolve().parents[1]


def test_noise_set_holds_the_planned_depth_rows_with_user_depth():
    planned = {row.label for row in plane_evidence.PLANNED_ROWS}
    assert {row.label for row in plane_evidence.noise_rows("0")} <= planned
    assert plane_evidence.REFERENCES["noise"].label == "prope (rays world)"
    rows = plane_evidence.SETS["noise"]
    assert len(rows) == 1 + 2 * 4 + 2 * 2 and not {row.label for row in rows[1:]} & planned
    for variant in ("1", "2", "3", "sparse"):
        level_zero = plane_evidence.noise_rows("0")
        for row, exact in zip(plane_evidence.noise_rows(variant), level_zero):
            assert dict(row.options)["targets"] == "transfer"
            assert (row.encoding, row.model_options, row.encoding_options) == (
                exact.encoding,
                exact.model_options,
                exact.encoding_options,
            )


def write_cells(folder: Path, rows: dict, steps: int = 600) -> None:
    """A cells.jsonl with two seeds of 3 scenes per row label, PSNR = the given offset + scene index."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for label, offset in rows.items():
        for seed in (0, 1):
            psnr = [offset + scene + 0.01 * seed for scene in range(3)]
            record = {"dataset": "room", "row": label, "seed": seed, "steps": steps, "eval_scenes": 3,
                      "metrics": {"psnr": sum(psnr) / 3}, "per_scene": {"psnr": psnr}}  # fmt: skip
            lines.append(json.dumps({"cell": f"room/{label}/seed{seed}-{steps}", "record": record}))
    (folder / "cells.jsonl").write_text("\n".join(sorted(lines)) + "\n")


@pytest.mark.slow  # matplotlib and the bootstrap: seconds
def test_figure_pairs_every_variant_with_prope_world_rays(tmp_path):
    reference = plane_evidence.NOISE_REFERENCE.label
    hrope, additive = plane_evidence.noise_rows("0")[:2]
    write_cells(tmp_path / "planned", {reference: 20.0, hrope.label: 21.0, additive.label: 20.5})
    noisy = {row.label: 20.0 + 0.1 * k for k, row in enumerate(plane_evidence.noise_rows("2"))}
    write_cells(tmp_path / "noise", {reference: 20.0, **noisy})
    write_cells(tmp_path / "quick", {plane_evidence.noise_rows("3")[0].label: 30.0}, steps=150)
    figure = tmp_path / "figure.png"
    text = noise_figure.main(
        ["--noise", str(tmp_path / "noise"), "--planned", str(tmp_path / "planned"), "--figure", str(figure)]
        + ["--table", str(tmp_path / "table.md")]
    )
    table = noise_figure.gains([tmp_path / "noise", tmp_path / "planned", tmp_path / "quick"])
    assert table["0"]["hrope-lift"]["mean"] == table["0"]["hrope-lift"]["low"] == 1.0
    assert abs(table["0"]["prope + additive hrope-lift"]["mean"] - 0.5) < 1e-9
    assert (
        table["2"]["hrope-lift"]["mean"] == 0.0 and abs(table["2"]["prope + additive hrope-lift"]["mean"] - 0.1) < 1e-9
    )
    assert table["1"]["hrope-lift"] is None and table["3"]["hrope-lift"] is None  # another budget's cells are left out
    assert "| exact (level 0) | +1.00 [+1.00, +1.00] (2 seed(s), 3 scenes)" in text
    assert "| noise level 1 | — | — | — | — |" in text
    assert (tmp_path / "table.md").read_text() == text
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
