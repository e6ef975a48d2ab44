"""IDR / NeuS / MonoSDF ``cameras.npz``: projections written from known cameras (random K, pose and
normalisation) load as cameras that project every normalised point to the pixel ``world_mat @
scale_mat`` gives it (plus the half-pixel of the pixel conventions); every malformed field is a
one-line SceneError naming the file and the field."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import random_rotation
from hrope.nvs.data.real.idr import decompose_projection, read_idr_cameras
from hrope.nvs.data.real.loaders import detect_format, load_scene, make_source
from hrope.nvs.data.scene import SceneError
from test_loaders import H, V, W, assert_images, points_in_front, save_png, truth, view_images


def similarity(seed: int) -> torch.Tensor:
    """A random normalisation ``scale_mat = [[s Q, c], [0, 0, 0, 1]]`` (Q a rotation, s in [0.5, 3])."""
    g = torch.Generator().manual_seed(seed)
    S = torch.eye(4, dtype=torch.float64)
    S[:3, :3] = (0.5 + 2.5 * torch.rand((), generator=g, dtype=torch.float64)) * random_rotation(1, generator=g)[0]
    S[:3, 3] = torch.randn(3, generator=g, dtype=torch.float64)
    return S


def world_mats(K, E, seed: int) -> list[np.ndarray]:
    """4x4 projections ``lambda * [[K_file [R | t]], [0, 0, 0, 1]]`` of the world-frame cameras ``E``, with
    ``K_file`` the intrinsics for pixel centres at integers and ``lambda`` a random non-zero scale of
    either sign (a projection is defined up to scale)."""
    g = torch.Generator().manual_seed(seed)
    K_file = K.clone()
    K_file[:, :2, 2] -= 0.5
    mats = []
    for v in range(len(K)):
        P = torch.eye(4, dtype=torch.float64)
        P[:3] = K_file[v] @ E[v, :3]
        scale = (0.1 + 10 * torch.rand((), generator=g, dtype=torch.float64)) * (-1) ** v
        P[:3] *= scale
        mats.append(P.numpy())
    return mats


def write_idr(folder: Path, K, E, S, images, layout: str = "monosdf", rows: int = 4, name: str = "cameras.npz"):
    """A scene folder: ``world_mat_i`` projecting world points, ``scale_mat_i = S`` (None: no key),
    the images as MonoSDF's ``NNNNNN_rgb.png`` or IDR's ``image/NNN.png``."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for v, P in enumerate(world_mats(K, E, 7)):
        arrays[f"world_mat_{v}"] = P[:rows]
        if S is not None:
            arrays[f"scale_mat_{v}"] = S.numpy()
        image = folder / (f"{v:06d}_rgb.png" if layout == "monosdf" else f"image/{v:03d}.png")
        save_png(image, images[v])
    np.savez(folder / name, **arrays)


def file_pixels(mats: list[np.ndarray], X_world: torch.Tensor) -> torch.Tensor:
    """Pixels ``(V, P, 2)`` of world points through the files' projections (pixel centres at integers)."""
    out = []
    for P, X in zip(mats, X_world):
        x = X @ torch.from_numpy(P[:3, :3]).T + torch.from_numpy(P[:3, 3])
        out.append(x[:, :2] / x[:, 2:])
    return torch.stack(out)


@pytest.mark.parametrize("rows", [3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loaded_cameras_project_normalised_points_like_the_files(tmp_path, seed, rows):
    K, E, _ = truth(20 + seed)
    S = similarity(seed)
    images = view_images(seed)
    write_idr(tmp_path, K, E, S, images, rows=rows)
    K_loaded, E_loaded = read_idr_cameras(tmp_path / "cameras.npz")
    X_world = points_in_front(E, seed)
    X = (X_world - S[:3, 3]) @ torch.linalg.inv(S[:3, :3]).T  # the same points in the normalised frame
    expected = file_pixels(world_mats(K, E, 0), X_world) + 0.5  # the project's pixel centres
    camera = X @ E_loaded[:, :3, :3].transpose(-1, -2) + E_loaded[:, None, :3, 3]
    assert (camera[..., 2] > 0).all()  # in front: the sign of each projection is resolved
    pixels = camera @ K_loaded.transpose(-1, -2)
    # float64 throughout: measured worst 4.3e-14 px over these seeds, K within 1.9e-15 (relative)
    torch.testing.assert_close(pixels[..., :2] / pixels[..., 2:], expected, atol=1e-12, rtol=0)
    assert torch.allclose(torch.linalg.det(E_loaded[:, :3, :3]), torch.ones(V, dtype=torch.float64))
    torch.testing.assert_close(K_loaded, K, atol=1e-12, rtol=1e-13)  # positive focal lengths, zero skew
    assert detect_format(tmp_path) == "idr"
    scene = load_scene(tmp_path)
    assert_images(scene, images)
    cams = scene.cameras
    got = X.float() @ cams.world_to_cam[0, :, :3, :3].transpose(-1, -2) + cams.world_to_cam[0, :, None, :3, 3]
    got = got @ cams.K[0].transpose(-1, -2)
    torch.testing.assert_close((got[..., :2] / got[..., 2:]).double(), expected, atol=2e-3, rtol=0)


def test_decomposition_on_random_projections():
    """RQ with positive focal lengths and a proper rotation, for P and -P, at any scale (measured
    worst: K 4.7e-15 relative, R 7.8e-16, t 1.3e-15)."""
    g = torch.Generator().manual_seed(5)
    for _ in range(50):
        K = torch.tensor([[300.0, 0, 40], [0, 280, 30], [0, 0, 1]], dtype=torch.float64)
        K[:2] *= 0.5 + torch.rand(2, 1, generator=g, dtype=torch.float64)
        R = random_rotation(1, generator=g)[0]
        t = torch.randn(3, generator=g, dtype=torch.float64)
        for scale in (3.7, -0.02):
            K_out, E_out = decompose_projection(scale * K @ torch.cat([R, t[:, None]], 1), "P")
            torch.testing.assert_close(K_out, K, rtol=1e-13, atol=1e-12)
            torch.testing.assert_close(E_out[:3, :3], R, rtol=0, atol=1e-13)
            torch.testing.assert_close(E_out[:3, 3], t, rtol=0, atol=1e-13)


def test_idr_layout_with_masks_neus_file_name_and_no_scale_mat(tmp_path):
    K, E, _ = truth(30)
    images = view_images(30)
    write_idr(tmp_path, K, E, None, images, layout="idr", name="cameras_sphere.npz")
    masks = [np.full((H, W), 255 * (v % 2), np.uint8) for v in range(V)]
    for v, mask in enumerate(masks):
        mask[2:5, 3:9] = 255
        save_png(tmp_path / "mask" / f"{v:03d}.png", np.stack([mask] * 3, -1))
    scene = load_scene(tmp_path, masks=True)
    assert_images(scene, images)
    torch.testing.assert_close(scene.masks, torch.from_numpy(np.stack(masks)).float() / 255)
    K_loaded, E_loaded = read_idr_cameras(tmp_path / "cameras_sphere.npz")
    torch.testing.assert_close(E_loaded, E, atol=1e-12, rtol=0)  # no scale_mat: the world frame itself
    (tmp_path / "mask" / "003.png").unlink()
    with pytest.raises(SceneError, match=r"mask: 3 masks for 4 images \(one per image, in sorted order\)"):
        load_scene(tmp_path)
    with pytest.raises(SceneError, match=r"image_factor picks an images_N/ folder; IDR / MonoSDF scenes have none"):
        load_scene(tmp_path, image_factor=2)


def edit_npz(path: Path, edit) -> None:
    with np.load(path) as archive:
        arrays = dict(archive)
    edit(arrays)
    np.savez(path, **arrays)


def skewed(arrays):
    arrays["world_mat_1"][0, :3] += 0.2 * arrays["world_mat_1"][1, :3]


NPZ_CASES = {
    "3x3 world_mat": (
        lambda a: a.__setitem__("world_mat_2", np.eye(3)),
        r"cameras\.npz: field world_mat_2 must be a numeric 3x4 or 4x4 matrix, got float64 \(3, 3\)",
    ),
    "text world_mat": (
        lambda a: a.__setitem__("world_mat_0", np.array([["a"] * 4] * 3)),
        r"field world_mat_0 must be a numeric 3x4 or 4x4 matrix, got <U1",
    ),
    "NaN": (lambda a: a["world_mat_1"].__setitem__((0, 0), np.nan), r"field world_mat_1 @ scale_mat_1 is not finite"),
    "singular": (
        lambda a: a["world_mat_3"].__setitem__((2, slice(0, 3)), a["world_mat_3"][0, :3]),
        r"field world_mat_3 @ scale_mat_3 is singular \(its 3x3 part has singular values",
    ),
    "all zero": (lambda a: a.__setitem__("world_mat_0", np.zeros((3, 4))), r"world_mat_0 @ scale_mat_0 is singular"),
    "skewed pixels": (skewed, r"field world_mat_1 @ scale_mat_1 has skewed pixels \(K\[0, 1\] = .*only zero-skew"),
    "missing index": (lambda a: a.pop("world_mat_2"), r"field world_mat_2 is missing \(it has world_mat_0 to 3\)"),
    "no world_mat": (
        lambda a: [a.pop(f"world_mat_{v}") for v in range(V)],
        r"no field world_mat_0 \(IDR / NeuS / MonoSDF cameras\); it holds \['scale_mat_0'",
    ),
    "one scale_mat missing": (lambda a: a.pop("scale_mat_1"), r"field scale_mat_1 is missing \(scale_mat_0 is there\)"),
    "non-uniform scale": (
        lambda a: a.__setitem__("scale_mat_0", np.diag([1.0, 2.0, 1.0, 1.0])),
        r"field scale_mat_0 must be a similarity \[\[s R, c\], \[0, 0, 0, 1\]\] \(s > 0, R a rotation\)",
    ),
    "reflection": (
        lambda a: a.__setitem__("scale_mat_2", np.diag([-1.0, 1.0, 1.0, 1.0])),
        r"scale_mat_2 must be a similarity",
    ),
    "bottom row": (lambda a: a["scale_mat_0"].__setitem__((3, 0), 1.0), r"scale_mat_0 must be a similarity"),
    "another normalisation": (
        lambda a: a.__setitem__("scale_mat_3", 2 * a["scale_mat_3"] * np.array([1, 1, 1, 0.5])[:, None]),
        r"field scale_mat_3 differs from scale_mat_0; one scene has one normalisation",
    ),
    "extra camera": (
        lambda a: a.update(world_mat_4=a["world_mat_0"], scale_mat_4=a["scale_mat_0"]),
        r"4 images \(\*_rgb\.png\) but cameras\.npz has 5 cameras",
    ),
}


@pytest.mark.parametrize("case", NPZ_CASES)
def test_malformed_cameras_npz_names_the_file_and_field(tmp_path, case):
    K, E, _ = truth(40)
    write_idr(tmp_path, K, E, similarity(40), view_images(40))
    edit, message = NPZ_CASES[case]
    edit_npz(tmp_path / "cameras.npz", edit)
    with pytest.raises(SceneError, match=message) as error:
        load_scene(tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"cameras\.npz: cannot read: "),
        (b"version https://git-lfs.github.com/spec/v1\n", r"cameras\.npz: cannot read: This file contains pickled"),
        ("npy", r"cameras\.npz: expected an \.npz archive of world_mat_i / scale_mat_i, got one \.npy array"),
    ],
)
def test_a_camera_file_that_is_no_npz_archive_is_one_line(tmp_path, content, message):
    K, E, _ = truth(41)
    write_idr(tmp_path, K, E, None, view_images(41))
    if content == "npy":
        buffer = io.BytesIO()
        np.save(buffer, np.eye(4))
        content = buffer.getvalue()
    (tmp_path / "cameras.npz").write_bytes(content)
    with pytest.raises(SceneError, match=message) as error:
        load_scene(tmp_path)
    assert "\n" not in str(error.value)


def test_a_camera_file_cut_anywhere_is_a_one_line_error(tmp_path):
    """Every cut of cameras.npz (every 97th byte) is one SceneError naming the file (a zip archive's
    directory is at its end, so a cut archive is no archive)."""
    K, E, _ = truth(42)
    write_idr(tmp_path, K, E, similarity(42), view_images(42))
    path = tmp_path / "cameras.npz"
    whole = path.read_bytes()
    for cut in range(0, len(whole), 97):
        path.write_bytes(whole[:cut])
        with pytest.raises(SceneError, match=r"cameras\.npz: cannot read") as error:
            load_scene(tmp_path)
        assert "\n" not in str(error.value)


def test_a_folder_of_idr_scenes_skips_a_broken_one(tmp_path, caplog):
    K, E, _ = truth(43)
    for name in ("a", "b"):
        write_idr(tmp_path / name, K, E, similarity(43), view_images(43))
    edit_npz(tmp_path / "a" / "cameras.npz", lambda a: a["world_mat_0"].__setitem__((0, 0), np.inf))
    source = make_source("idr", tmp_path)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        assert source[0].name == "b"
    assert "world_mat_0 @ scale_mat_0 is not finite" in caplog.text
