"""Stereo pairs cut into posed scenes (hrope.nvs.data.real.stereo): geometry, splits, missing depth, files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from hrope.nvs.data.real.stereo import (
    StereoPair,
    StereoWindow,
    read_middlebury,
    read_pfm,
    stereo_windows,
    window_scene,
)
from hrope.nvs.data.scene import SceneError

SIZE = 16


def _pair(H: int = 48, W: int = 80, seed: int = 0) -> StereoPair:
    g = torch.Generator().manual_seed(seed)
    disparity = 2 + 10 * torch.rand(H, W, generator=g)
    disparity[5, 7] = float("nan")
    disparity[6, 9] = float("inf")
    return StereoPair(
        torch.rand(3, H, W, generator=g),
        torch.rand(3, H, W, generator=g),
        disparity,
        focal=120.0,
        cx0=37.3,
        cx1=45.9,
        cy=22.1,
        baseline=0.19,
    )


def _project(scene, view: int, world: torch.Tensor) -> torch.Tensor:
    """Pixel ``(2,)`` of world point ``world (3,)`` in ``view`` of ``scene``."""
    E = scene.cameras.world_to_cam[0, view].double()
    K = scene.cameras.K[0, view].double()
    q = K @ (E[:3, :3] @ world + E[:3, 3])
    return q[:2] / q[2]


def test_a_left_pixel_lands_in_the_other_crops_where_its_disparity_says():
    pair = _pair()
    window = StereoWindow(top=10, left=20, shift=8)
    scene = window_scene(pair, window, SIZE)
    K0 = scene.cameras.K[0, 0].double()
    assert torch.equal(scene.cameras.world_to_cam[0, 0], torch.eye(4))  # world = the first context camera
    for v, u in [(0, 0), (3, 11), (15, 15), (8, 2)]:
        z = scene.depth[0, v, u].double()
        d = float(pair.disparity[window.top + v, window.left + u])
        world = z * torch.linalg.solve(K0, torch.tensor([u + 0.5, v + 0.5, 1.0], dtype=torch.float64))
        # the second context crop: the same camera, principal point moved by the shift
        assert _project(scene, 1, world).tolist() == pytest.approx([u + 0.5 - window.shift, v + 0.5], abs=1e-4)
        # the target: the right camera sees the point at x - d, on the same row
        assert _project(scene, 2, world).tolist() == pytest.approx([u + 0.5 - d, v + 0.5], abs=1e-4)


def test_depth_is_in_baselines_and_matches_the_middlebury_formula():
    pair = _pair()
    scene = window_scene(pair, StereoWindow(0, 0, 8), SIZE)
    d = pair.disparity[:SIZE, :SIZE].double()
    expected = pair.focal / (d + pair.doffs)  # baseline * f / (d + doffs), divided by the baseline
    ok = torch.isfinite(d)
    assert torch.allclose(scene.depth[0][ok].double(), expected[ok], rtol=1e-6)
    centres = scene.cameras.centers()[0]
    assert centres[2].tolist() == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)  # one baseline to the right


def test_missing_disparity_gives_missing_depth_and_the_target_gets_none():
    pair = _pair()
    scene = window_scene(pair, StereoWindow(0, 0, 8), SIZE)
    assert math.isinf(scene.depth[0, 5, 7]) and math.isinf(scene.depth[0, 6, 9])
    assert torch.isfinite(scene.depth[0]).sum() == SIZE * SIZE - 2
    assert torch.isinf(scene.depth[2]).all()  # the target view's depth is never given


def test_train_and_test_windows_cover_disjoint_rows():
    pair = _pair(H=60)
    split = 40
    train = stereo_windows(pair, SIZE, 8, 4, (0, split))
    test = stereo_windows(pair, SIZE, 8, 4, (split, 60))
    assert train and test
    assert max(w.top + SIZE for w in train) <= split <= min(w.top for w in test)
    W = pair.image_size[1]
    assert all(w.left >= 0 and w.left + w.shift + SIZE <= W for w in train + test)


def test_a_window_outside_the_images_is_refused():
    pair = _pair()
    with pytest.raises(SceneError, match="does not fit"):
        window_scene(pair, StereoWindow(0, pair.image_size[1] - SIZE, 8), SIZE)


def test_downscale_halves_disparity_and_intrinsics_and_spreads_missing_values():
    pair = _pair()
    small = pair.downscale(2)
    assert small.image_size == (24, 40)
    assert small.focal == pair.focal / 2 and small.cx1 == pair.cx1 / 2 and small.cy == pair.cy / 2
    block = pair.disparity[:2, :2]
    assert float(small.disparity[0, 0]) == pytest.approx(float(block.mean()) / 2, rel=1e-6)
    assert math.isnan(small.disparity[2, 3]) and math.isnan(small.disparity[3, 4])  # blocks of (5, 7), (6, 9)
    # depth is unchanged by the downscale (d and doffs both halve)
    assert float(small.depth()[0, 0]) == pytest.approx(float(pair.baseline * pair.focal / (block.mean() + pair.doffs)))


def _write_pfm(path, array: np.ndarray) -> None:
    H, W = array.shape
    path.write_bytes(f"Pf\n{W} {H}\n-1.0\n".encode() + np.ascontiguousarray(array[::-1], dtype="<f4").tobytes())


def write_middlebury(folder, H: int = 6, W: int = 10) -> np.ndarray:
    """A Middlebury 2014 scene folder of random ``H x W`` images; returns its disparity."""
    rng = np.random.default_rng(0)
    for name in ("im0.png", "im1.png"):
        Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(folder / name)
    disparity = rng.uniform(1, 5, (H, W)).astype(np.float32)
    disparity[0, 1] = np.inf
    _write_pfm(folder / "disp0.pfm", disparity)
    (folder / "calib.txt").write_text(
        "cam0=[100.5 0 4.25; 0 100.5 3.5; 0 0 1]\ncam1=[100.5 0 6.75; 0 100.5 3.5; 0 0 1]\n"
        f"doffs=2.5\nbaseline=193.001\nwidth={W}\nheight={H}\nndisp=16\n"
    )
    return disparity


def test_read_middlebury_folder(tmp_path):
    H, W = 6, 10
    disparity = write_middlebury(tmp_path, H, W)
    pair = read_middlebury(tmp_path)
    assert (pair.focal, pair.cx0, pair.cx1, pair.cy, pair.baseline) == (100.5, 4.25, 6.75, 3.5, 193.001)
    assert pair.doffs == pytest.approx(2.5)
    assert pair.left.shape == (3, H, W)
    assert torch.equal(read_pfm(tmp_path / "disp0.pfm"), torch.from_numpy(disparity))  # top row first
    assert math.isinf(pair.depth()[0, 1])


def test_a_pfm_that_is_not_one_channel_is_refused(tmp_path):
    (tmp_path / "x.pfm").write_bytes(b"PF\n2 2\n-1.0\n" + bytes(48))
    with pytest.raises(SceneError, match="one-channel PFM"):
        read_pfm(tmp_path / "x.pfm")
