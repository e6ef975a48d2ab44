"""The real captures of the project's shared research folder (``shared/realdata`` beside the repository,
or the folder ``HROPE_REALDATA`` names; skipped without it): DTU scan24 in MonoSDF's layout and the
NeRD object captures in LLFF's with masks. Each test reads a few views only. The expected numbers
come from each capture's README (made from the source files, independently of these loaders)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hrope.geometry import pixel_rays
from hrope.nvs import cli
from hrope.nvs.data.real.loaders import detect_format, load_scene, scene_frames
from hrope.nvs.data.real.view_maps import read_depth_prior, read_normal_prior

REALDATA = Path(os.environ.get("HROPE_REALDATA") or Path(__file__).resolve().parents[2] / "shared" / "realdata")
pytestmark = pytest.mark.skipif(
    not REALDATA.is_dir(), reason=f"the real captures are not here ({REALDATA}; set HROPE_REALDATA to their folder)"
)

NERD = {  # capture: views in images_8/ (README)
    "ethiopianHead": 66,
    "maryRose": 69,
    "moldGoldCape": 119,
    "mother_child": 19,
    "duck_queen": 14,
    "gnomes": 6,
}


def nearest_point_to_axes(world_to_cam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The point nearest every optical axis (+z of OpenCV cameras) and each axis' angle to it (degrees)."""
    cam_to_world = torch.linalg.inv(world_to_cam.double())
    centres, forward = cam_to_world[:, :3, 3], cam_to_world[:, :3, 2]
    projectors = torch.eye(3, dtype=torch.float64) - forward[:, :, None] * forward[:, None, :]
    point = torch.linalg.solve(projectors.sum(0), (projectors @ centres[:, :, None]).sum(0)[:, 0])
    to_point = point - centres
    return point, torch.rad2deg(torch.arccos((to_point * forward).sum(1) / to_point.norm(dim=1)))


def test_scan24_cameras_match_its_readme():
    """K of view 0 (README: fx 462.773, fy 461.308, cx 99.463, cy 98.801 with pixel centres at integers),
    cameras 2.72 normalised units from the origin (608.7 mm / scale 223.33), the origin (the scale
    sphere's centre) projecting at x 99.0-100.1, y 98.4-99.9 (+0.5 here), the axes meeting within 0.14 deg."""
    scan24 = REALDATA / "scan24"
    assert detect_format(scan24) == "idr"
    scene = load_scene(scan24, views=[0, 12, 24, 36, 48])
    K, E = scene.cameras.K[0].double(), scene.cameras.world_to_cam[0].double()
    expected = torch.tensor([[462.773, 0, 99.963], [0, 461.308, 99.301], [0, 0, 1]], dtype=torch.float64)
    torch.testing.assert_close(K[0], expected, atol=1e-3, rtol=0)  # the README's 3 decimals
    distance = torch.linalg.inv(E)[:, :3, 3].norm(dim=1)
    assert ((distance > 2.70) & (distance < 2.75)).all()
    origin = (K @ E[:, :3, 3:])[..., 0]
    u, v = (origin[:, :2] / origin[:, 2:]).T
    assert ((u > 99.4) & (u < 100.7) & (v > 98.8) & (v < 100.5)).all()
    _, angles = nearest_point_to_axes(E)
    assert angles.max() < 0.2


def test_scan24_priors_are_relative_depth_and_camera_frame_normals_facing_the_camera():
    """The files' normals, decoded, face the camera (against the pixel ray) at >= 97% of the pixels
    (measured 99.0-100%), and their x / y signs follow the depth prior's gradients as in the OpenCV
    camera frame at > 80% of the strongly slanted pixels (measured 93-98%; flipped axes give 2-7%)."""
    frames = scene_frames(REALDATA / "scan24")
    for v in (0, 12, 24):  # view 48's normals are partly clipped (README): 52-55% there
        frame = frames[v]
        normals, depth = read_normal_prior(frame.normal_prior, frame.label), read_depth_prior(frame.depth_prior)
        rays = pixel_rays(frame.K[None, None].float(), (192, 192))[0, 0].permute(2, 0, 1)
        assert ((normals * rays).sum(0) < 0).float().mean() >= 0.97
        d_dy, d_dx = torch.gradient(depth)
        for n, slope in ((normals[0], d_dx), (normals[1], d_dy)):
            slanted = (n.abs() > 0.3) & (slope.abs() > slope.abs().quantile(0.5))
            assert (torch.sign(n[slanted]) == torch.sign(slope[slanted])).float().mean() > 0.8
    scene = load_scene(REALDATA / "scan24", (64, 64), views=[0, 24], priors=True)
    assert scene.depth is None and scene.relative_depth.shape == (2, 64, 64)
    assert not torch.isnan(scene.relative_depth).any()  # README: no invalid block at 192x192
    torch.testing.assert_close(scene.normals.norm(dim=1), torch.ones(2, 64, 64))


@pytest.mark.parametrize("capture", NERD)
def test_nerd_captures_have_a_mask_per_view(capture):
    frames = scene_frames(REALDATA / capture)
    assert detect_format(REALDATA / capture) == "llff" and len(frames) == NERD[capture]
    assert all(frame.mask is not None and frame.mask.parent.name == "masks_8" for frame in frames)


@pytest.mark.parametrize(("capture", "focal", "size"), [("ethiopianHead", 942.9468, 500), ("maryRose", 1318.4055, 432)])
def test_nerd_cameras_look_at_the_masked_object(capture, focal, size):
    """Three views: K from the README (f / 8, principal point at the centre), the optical axes meet within
    1.5 degrees (README: median 0.81 / 0.82 over all views), and the point they meet at projects onto the
    object in every view's mask; the masks cover 20-50% of each view (README means 0.281 / 0.451)."""
    scene = load_scene(REALDATA / capture, views=[0, 22, 44], masks=True)
    K, E = scene.cameras.K[0].double(), scene.cameras.world_to_cam[0].double()
    expected = torch.tensor([[focal, 0, size / 2], [0, focal, size / 2], [0, 0, 1]], dtype=torch.float64)
    torch.testing.assert_close(K, expected.expand(3, 3, 3), atol=1e-3, rtol=0)
    point, angles = nearest_point_to_axes(E)
    assert angles.max() < 1.5
    pixel = K @ (E[:, :3, :3] @ point + E[:, :3, 3])[..., None]
    columns, rows = (pixel[:, :2, 0] / pixel[:, 2:, 0]).long().T
    assert (scene.masks[torch.arange(3), rows, columns] == 1).all()
    coverage = scene.masks.mean((1, 2))
    assert ((coverage > 0.2) & (coverage < 0.5)).all()


@pytest.mark.parametrize("capture", ["scan24", "ethiopianHead"])
def test_hrope_info_summarises_a_capture(capture, capsys):
    assert cli.run(["info", str(REALDATA / capture)]) == 0
    text = capsys.readouterr().out
    assert cli.run(["info", str(REALDATA / capture), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    if capture == "scan24":
        assert "format: idr" in text and "frames: 49 (images in ./, HxW 192x192)" in text
        assert "relative depth priors (scale and shift unknown): 49 of 49 frames" in text
        assert facts["carried"]["normal_prior"]["frames"] == 49 and facts["optical_axes"]["max_angle_deg"] < 0.2
    else:
        assert "format: llff" in text and "object masks: 66 of 66 frames (masks_8/" in text
        assert facts["intrinsics"]["fx"] == [942.9468, 942.9468] and facts["optical_axes"]["median_angle_deg"] < 1
