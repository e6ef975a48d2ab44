"""Object masks (LLFF ``masks_N/``) and monocular priors (MonoSDF ``*_depth.npy`` / ``*_normal.npy``):
read per view on request, moved with their images, carried by the scene (never as metric depth),
and every malformed file is a one-line SceneError naming the file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hrope.cameras import Cameras
from hrope.geometry import pixel_rays
from hrope.nvs.data import collate_scenes, normalize_scene, resize_crop_scene
from hrope.nvs.data.real.loaders import load_scene, make_source
from hrope.nvs.data.scene import Scene, SceneError
from hrope.nvs.evaluation.protocols import zoom_views
from test_idr import similarity, write_idr
from test_loaders import H, V, W, save_png, truth, view_images, write_llff


def object_masks(seed: int) -> list[np.ndarray]:
    """One 0/255 mask per view: a random rectangle."""
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(V):
        mask = np.zeros((H, W), np.uint8)
        top, left = rng.integers(0, H // 2), rng.integers(0, W // 2)
        mask[top : top + H // 2, left : left + W // 2] = 255
        masks.append(mask)
    return masks


@pytest.fixture
def llff_with_masks(tmp_path):
    K, E, _ = truth(50, centred=True, square_pixels=True)
    images, masks = view_images(50), object_masks(50)
    write_llff(tmp_path, K, E, images, factor=8)
    for v, mask in enumerate(masks):
        save_png(tmp_path / "masks_8" / f"IMG_{v:03d}.png", mask)
    return tmp_path, images, masks


def test_llff_masks_are_read_per_view_and_composite_the_object(llff_with_masks):
    folder, images, masks = llff_with_masks
    assert load_scene(folder).masks is None  # read only on request
    scene = load_scene(folder, masks=True)
    expected = torch.from_numpy(np.stack(masks)).float() / 255
    assert torch.equal(scene.masks, expected)
    composite = scene.composite((0.0, 0.5, 1.0))
    colour = torch.tensor([0.0, 0.5, 1.0]).view(1, 3, 1, 1)
    torch.testing.assert_close(composite.images, scene.images * expected[:, None] + colour * (1 - expected[:, None]))
    picked = load_scene(folder, views=[2, 0], masks=True)
    assert torch.equal(picked.masks, expected[[2, 0]])
    resized = load_scene(folder, (6, 6), masks=True)  # bilinear, antialiased: coverage in [0, 1]
    assert resized.masks.shape == (V, 6, 6) and 0 <= resized.masks.min() and resized.masks.max() <= 1
    direct = resize_crop_scene(scene, (6, 6))
    torch.testing.assert_close(resized.masks, direct.masks, atol=1e-6, rtol=0)
    with pytest.raises(SceneError, match=r"composite needs object masks"):
        load_scene(folder).composite()
    with pytest.raises(SceneError, match=r"background must be an RGB colour in \[0, 1\], got \(2, 0, 0\)"):
        scene.composite((2, 0, 0))


def test_a_source_carries_masks_on_request(llff_with_masks):
    folder, _, masks = llff_with_masks
    source = make_source("llff", folder, masks=True)
    assert torch.equal(source.load_views(0, [1]).masks[0], torch.from_numpy(masks[1]).float() / 255)
    assert source[0].masks.shape == (V, H, W)


MASK_CASES = {
    "missing": (lambda d: (d / "IMG_002.png").unlink(), r"masks_8: no mask for 1 of 4 images \(first: IMG_002\.png"),
    "two for one image": (
        lambda d: (d / "IMG_001_mask.jpg").write_bytes((d / "IMG_001.png").read_bytes()),
        r"masks_8: 2 masks for image IMG_001\.png: IMG_001\.png, IMG_001_mask\.jpg",
    ),
    "all zero": (
        lambda d: save_png(d / "IMG_003.png", np.zeros((H, W), np.uint8)),
        r"row 3 \(IMG_003\.png\): mask .*IMG_003\.png has no object pixel \(none above 1/2\)",
    ),
    "another size": (
        lambda d: save_png(d / "IMG_001.png", np.full((H // 2, W // 2), 255, np.uint8)),
        r"row 1 \(IMG_001\.png\): map .*IMG_001\.png is 6x8, its image 12x16; it must have its image's size",
    ),
    "truncated": (
        lambda d: (d / "IMG_000.png").write_bytes((d / "IMG_000.png").read_bytes()[:60]),
        r"row 0 \(IMG_000\.png\) mask: cannot read image .*IMG_000\.png",
    ),
    "text": (
        lambda d: (d / "IMG_000.png").write_text("version https://git-lfs.github.com/spec/v1\n"),
        r"mask: image .*IMG_000\.png is in no image format PIL can read",
    ),
}


@pytest.mark.parametrize("case", MASK_CASES)
def test_malformed_masks_name_the_file(llff_with_masks, case):
    folder, _, _ = llff_with_masks
    edit, message = MASK_CASES[case]
    edit(folder / "masks_8")
    with pytest.raises(SceneError, match=message) as error:
        load_scene(folder, masks=True)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- MonoSDF priors
def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=0, keepdims=True)


@pytest.fixture
def monosdf(tmp_path):
    """A MonoSDF folder with depth priors (0 = none at one pixel) and normal priors (``(n + 1) / 2``),
    half of them facing away from the camera."""
    K, E, _ = truth(60)
    write_idr(tmp_path, K, E, similarity(60), view_images(60))
    rng = np.random.default_rng(60)
    depths, normals = [], []
    for v in range(V):
        depth = rng.uniform(0.1, 0.6, (H, W)).astype(np.float32)
        depth[3, 4] = 0.0
        normal = unit(rng.normal(size=(3, H, W))).astype(np.float32)
        np.save(tmp_path / f"{v:06d}_depth.npy", depth)
        np.save(tmp_path / f"{v:06d}_normal.npy", (normal + 1) / 2)
        depths.append(depth)
        normals.append(normal)
    return tmp_path, np.stack(depths), np.stack(normals)


def test_monosdf_priors_are_relative_depth_and_camera_facing_normals(monosdf):
    folder, depths, normals = monosdf
    scene = load_scene(folder, priors=True)
    assert scene.depth is None and scene.planes(4) is None  # a relative depth is never metric
    expected = torch.from_numpy(depths)
    assert torch.isnan(scene.relative_depth[:, 3, 4]).all()
    valid = ~torch.isnan(scene.relative_depth)
    assert valid.sum() == V * H * W - V and torch.equal(scene.relative_depth[valid], expected[valid])
    decoded = torch.from_numpy(normals)
    decoded = decoded / decoded.norm(dim=1, keepdim=True)
    rays = pixel_rays(scene.cameras.K.double(), scene.image_size)[0].movedim(-1, 1).float()
    towards = torch.where((decoded * rays).sum(1, keepdim=True) > 0, -1.0, 1.0)
    # stored as (n + 1) / 2 in float32: measured 1.2e-7 (one float32 ulp at 1); bound 5e-7
    torch.testing.assert_close(scene.normals, decoded * towards, atol=5e-7, rtol=0)
    assert ((scene.normals * rays).sum(1) <= 0).all()
    normalised = normalize_scene(scene, [0, 1])
    torch.testing.assert_close(normalised.relative_depth, scene.relative_depth, equal_nan=True, atol=0, rtol=0)
    assert collate_scenes([scene], 2).depth is None
    small = load_scene(folder, (6, 8), priors=True)  # nearest neighbour: values of the file
    assert set(small.relative_depth[~torch.isnan(small.relative_depth)].tolist()) <= set(depths.ravel().tolist())
    zoomed = zoom_views(scene, 2.0, [1])  # the centre half of view 1, nearest: its own values, enlarged
    torch.testing.assert_close(zoomed.relative_depth[0], scene.relative_depth[0], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(zoomed.relative_depth[1, 4:8:2, 4:12:2], scene.relative_depth[1, 5:7, 6:10])


def test_data_depth_maps_never_reads_a_relative_prior(monosdf):
    folder, _, _ = monosdf
    source = make_source("idr", folder, depth="maps")
    with pytest.raises(SceneError, match=r"needs a depth map per frame .* \(its depth prior is relative: read it"):
        source.load_views(0, [0, 1])
    with pytest.raises(SceneError, match=r"masks=True needs object masks"):
        load_scene(folder, masks=True)


def save_array(path, array):
    np.save(path, array)


PRIOR_CASES = {
    "depth of another size": (
        lambda d: save_array(d / "000001_depth.npy", np.ones((H // 2, W // 2), np.float32)),
        r"world_mat_1 \(000001_rgb\.png\): map .*000001_depth\.npy is 6x8, its image 12x16; it must have its",
    ),
    "normals of another size": (
        lambda d: save_array(d / "000002_normal.npy", np.full((3, H, W + 1), 0.5, np.float32)),
        r"map .*000002_normal\.npy is 12x17, its image 12x16",
    ),
    "normals in [-1, 1]": (
        lambda d: save_array(d / "000000_normal.npy", unit(np.random.default_rng(0).normal(size=(3, H, W)))),
        r"normal prior .*000000_normal\.npy holds values in \[-.*\]; expected \(n \+ 1\) / 2 in \[0, 1\]",
    ),
    "normals of two channels": (
        lambda d: save_array(d / "000000_normal.npy", np.zeros((2, H, W))),
        r"normal prior .* must be \(3, H, W\) or \(H, W, 3\), got shape \(2, 12, 16\)",
    ),
    "depth without a positive value": (
        lambda d: save_array(d / "000003_depth.npy", np.zeros((H, W))),
        r"depth prior .*000003_depth\.npy has no positive finite value",
    ),
    "depth of three dimensions": (
        lambda d: save_array(d / "000003_depth.npy", np.ones((2, H, W))),
        r"depth prior .* must be \(H, W\), got shape \(2, 12, 16\)",
    ),
    "text depth": (
        lambda d: save_array(d / "000003_depth.npy", np.array([["a"] * W] * H)),
        r"cannot read depth prior .*000003_depth\.npy: expected a numeric array, got <U1",
    ),
    "an npz archive": (
        lambda d: np.savez(open(d / "000003_depth.npy", "wb"), a=np.ones(3)),
        r"cannot read depth prior .*: an \.npz archive of several arrays, expected one \.npy array",
    ),
    "a truncated file": (
        lambda d: (d / "000002_depth.npy").write_bytes((d / "000002_depth.npy").read_bytes()[:200]),
        r"cannot read depth prior .*000002_depth\.npy: ",
    ),
    "one frame without": (
        lambda d: (d / "000001_normal.npy").unlink(),
        r"world_mat_1 \(000001_rgb\.png\): priors=True needs a normal prior for every frame; this frame has none",
    ),
}


@pytest.mark.parametrize("case", PRIOR_CASES)
def test_malformed_priors_name_the_file(monosdf, case):
    folder, _, _ = monosdf
    edit, message = PRIOR_CASES[case]
    edit(folder)
    assert load_scene(folder).relative_depth is None  # not read without priors=True
    with pytest.raises(SceneError, match=message) as error:
        load_scene(folder, priors=True)
    assert "\n" not in str(error.value)


def test_a_scene_checks_the_shapes_of_masks_and_relative_depth():
    K = torch.tensor([[8.0, 0, 3], [0, 8, 2], [0, 0, 1]])
    cameras = Cameras(K.repeat(1, 2, 1, 1), torch.eye(4).repeat(1, 2, 1, 1), (4, 6))
    images = torch.zeros(2, 3, 4, 6)
    with pytest.raises(SceneError, match=r"masks must be \(2, 4, 6\), got \(2, 4, 5\)"):
        Scene(images, cameras, masks=torch.zeros(2, 4, 5))
    with pytest.raises(SceneError, match=r"relative_depth must be \(2, 4, 6\), got \(1, 4, 6\)"):
        Scene(images, cameras, relative_depth=torch.zeros(1, 4, 6))
