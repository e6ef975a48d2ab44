"""The geometry sweep (experiments/geometry_sweep.py): its geometry helpers (view angle, surface slant,
bins) on cases with known answers, and the whole sweep on two toy cells trained here."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from hrope.cameras import Cameras
from hrope.geometry import pixel_rays
from hrope.nvs.data.synthetic.generator import make_scene


from experiments.geometry_sweep import SweepError, main, run
from experiments.cells import CellRunner
from experiments.rows import BUDGETS, Cell, Row
from experiments.view_geometry import (
    bin_index,
    nearest_context_angle,
    nearest_context_distance,
    quantile_edges,
    surface_slant,
)

K = torch.tensor([[20.0, 0.0, 8.5], [0.0, 20.0, 8.5], [0.0, 0.0, 1.0]])  # principal point at pixel (8, 8)'s centre


def _yaw(degrees: float, centre: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> torch.Tensor:
    """World-to-camera extrinsics of a camera at ``centre`` turned by ``degrees`` about the y axis."""
    a = math.radians(degrees)
    R = torch.tensor([[math.cos(a), 0.0, -math.sin(a)], [0.0, 1.0, 0.0], [math.sin(a), 0.0, math.cos(a)]])
    E = torch.eye(4)
    E[:3, :3], E[:3, 3] = R, -R @ torch.tensor(centre)
    return E


def test_nearest_context_angle_and_distance_of_known_cameras():
    extrinsics = torch.stack([_yaw(0.0), _yaw(20.0, (1.0, 0.0, 0.0)), _yaw(30.0, (0.0, 0.0, 3.0)), _yaw(-5.0)])
    cameras = Cameras(K.expand(1, 4, 3, 3), extrinsics[None], (17, 17))
    angle = nearest_context_angle(cameras, 2)
    assert angle.shape == (1, 2)
    assert torch.allclose(angle, torch.tensor([[10.0, 5.0]], dtype=torch.float64), atol=1e-4)
    distance = nearest_context_distance(cameras, 2)
    assert torch.allclose(distance, torch.tensor([[3.0, 0.0]], dtype=torch.float64), atol=1e-5)


def test_slant_of_a_surface_facing_the_camera_is_zero_and_edge_on_is_ninety():
    rays = pixel_rays(K.double()[None, None], (17, 17))  # (1, 1, H, W, 3)
    facing = -(rays / rays.norm(dim=-1, keepdim=True)).permute(0, 1, 4, 2, 3)  # a sphere around the camera
    assert surface_slant(facing, K[None, None]).abs().max() < 1e-5
    frontal = torch.zeros(1, 1, 3, 17, 17)
    frontal[:, :, 2] = -1.0  # the plane z = const: faces the camera on the optical axis only
    slant = surface_slant(frontal, K[None, None])[0, 0]
    assert slant[8, 8] < 1e-5
    offset = torch.hypot(*torch.meshgrid(torch.arange(17.0) - 8, torch.arange(17.0) - 8, indexing="ij"))
    assert torch.allclose(slant, torch.rad2deg(torch.atan(offset / 20.0)).double(), atol=1e-4)
    edge_on = torch.zeros(1, 1, 3, 17, 17)
    edge_on[:, :, 0] = 1.0  # the plane x = const, seen along the centre column
    assert abs(float(surface_slant(edge_on, K[None, None])[0, 0, 3, 8]) - 90.0) < 1e-5
    assert surface_slant(torch.zeros(1, 1, 3, 17, 17), K[None, None]).isnan().all()  # nothing seen


@pytest.mark.parametrize("kind", ["room", "object"])
def test_slant_of_rendered_scenes_agrees_with_their_plane_vectors(kind):
    """cos(slant) = 1 / (|m| |X|) for the point X = z * ray on the plane n.X = d, m = n / d."""
    scene = make_scene(0, 0, kind, 2, (16, 16))
    slant = surface_slant(scene.normals[None], scene.cameras.K)[0]
    rays = pixel_rays(scene.cameras.K.double(), (16, 16))[0]
    expected = 1.0 / (scene.plane_m.double().norm(dim=1) * scene.depth.double() * rays.norm(dim=-1))
    seen = torch.isfinite(scene.depth)
    assert seen.any()
    assert torch.allclose(torch.cos(torch.deg2rad(slant[seen])), expected[seen], atol=1e-6)
    assert torch.equal(slant.isnan(), ~seen)


def test_quantile_bins_are_populated_and_half_open():
    values = torch.tensor([5.0, 1.0, 2.0, 8.0, 3.0, 4.0, 7.0, 6.0])
    edges = quantile_edges(values, 4)
    assert edges[0] == 1.0 and edges[-1] == 8.0 and len(edges) == 5
    assert torch.bincount(bin_index(values, edges), minlength=4).tolist() == [2, 2, 2, 2]
    index = bin_index(torch.tensor([0.0, 30.0, 59.9, 60.0, 90.0, 95.0, math.nan]), (0.0, 30.0, 60.0, 90.0))
    assert index.tolist() == [0, 1, 1, 2, 2, 2, 3]


TOY = replace(
    BUDGETS["quick"],
    steps=2,
    train_scenes=4,
    eval_scenes=4,
    warmup=1,
    seeds=(0,),
    model={"preset": "tiny", "image_size": 16, "patch_size": 8, "dim": 32, "layers": 1, "heads": 2},
)
REFERENCE = Row("prope", model_options=(("rays", "world"),))
OTHER = Row("hrope-lift", "external", options=(("targets", "transfer"),), model_options=(("rays", "world"),))


def _check_row(row: dict, record: dict, summary: dict) -> None:
    """Per-bin pooled PSNR recombines to the row's MSE, which is the mean image MSE of the cell's
    own evaluation (one target per scene, equal image sizes)."""
    images_mse = sum(10 ** (-p / 10) for p in record["per_scene"]["psnr"]) / len(record["per_scene"]["psnr"])
    assert row["mse"] == pytest.approx(images_mse, rel=1e-5)
    for kind in ("angle", "slant"):
        bins = [b for b in row[kind] if b["pixels"]]
        pixels = sum(b["pixels"] for b in bins)
        assert pixels == summary["scenes"] * 16 * 16
        recombined = sum(b["pixels"] * 10 ** (-b["psnr"] / 10) for b in bins) / pixels
        assert recombined == pytest.approx(row["mse"], rel=1e-9)


@pytest.mark.slow
def test_sweep_of_two_toy_cells(tmp_path):
    runner = CellRunner(TOY, tmp_path / "cache")
    records = {row.label: runner.run(Cell("room", row, 0)) for row in (REFERENCE, OTHER)}
    report = run(TOY, tmp_path / "cache", ["room"], [OTHER], REFERENCE, tmp_path / "out", angle_bins=2, min_pixels=1)
    summary = report["datasets"]["room"]
    assert summary["scenes"] == 4 and [b["targets"] for b in summary["angle"]] == [2, 2]
    assert [b["scenes"] for b in summary["angle"]] == [2, 2]  # one target per scene: in one angle bin
    assert summary["angle_edges"][0] < summary["angle_edges"][1] < summary["angle_edges"][2]
    assert sum(b["pixel_share"] for b in summary["slant"]) == pytest.approx(1.0)
    rows = {row["row"]: row for row in summary["rows"]}
    for label, row in rows.items():
        _check_row(row, records[label], summary)
        assert row["max_psnr_difference_to_record"] < 1e-4
    assert rows[REFERENCE.label]["all"][0]["vs_reference"] is None
    gain = rows[OTHER.label]["all"][0]["vs_reference"]
    paired = [
        a - b for a, b in zip(records[OTHER.label]["per_scene"]["psnr"], records[REFERENCE.label]["per_scene"]["psnr"])
    ]
    assert gain["mean"] == pytest.approx(sum(paired) / len(paired), abs=1e-4) and gain["scenes"] == 4
    assert json.loads((tmp_path / "out" / "geometry_sweep.json").read_text()) == json.loads(json.dumps(report))
    assert "gain vs surface slant" in (tmp_path / "out" / "geometry_sweep.md").read_text()
    assert (tmp_path / "out" / "geometry_sweep.png").stat().st_size > 0

    with pytest.raises(SweepError, match=r"^2 of 4 cells are not finished .*/seed1-") as error:
        run(replace(TOY, seeds=(0, 1)), tmp_path / "cache", ["room"], [OTHER], REFERENCE, tmp_path / "out")
    assert "\n" not in str(error.value)


def test_unknown_row_and_missing_cache_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "no such row", "--cache", str(tmp_path)])
    assert "unknown rows ['no such row']" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^geometry_sweep.py: error: 15 of 15 cells are not finished"):
        main(["--cache", str(tmp_path), "--out", str(tmp_path / "out")])
