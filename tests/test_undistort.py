"""Undistortion: every lens model the loaders read, checked against the models' own definitions.

The forward distortion of each COLMAP / OpenCV / nerfstudio model is written here from its
definition (COLMAP's ``src/colmap/sensor/models``, OpenCV's calib3d and fisheye modules), in
float64 numpy, independently of kornia and of the loaders. Three checks:

- the distortion map the loader builds from a ``cameras.txt`` line moves every pixel where the
  definition does (parameter order included), to 1e-6 pixels;
- after undistortion, the pixel of a 3D point's pinhole projection holds what the distorted image
  had at the point's distorted projection (a coordinate-encoding image; error in pixels);
- end to end, files written with a distorted camera load as the pinhole images of the scene.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from hrope.nvs.data.real.colmap import read_colmap_cameras
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.data.scene import SceneError
from hrope.nvs.data.real.undistort import distort_pixels, undistort_image

H, W = 48, 64
FX, FY, CX, CY = 45.0, 44.0, 32.3, 23.7
FISHEYE = {"OPENCV_FISHEYE", "RADIAL_FISHEYE", "SIMPLE_RADIAL_FISHEYE"}
# distortion coefficients of each COLMAP model, in COLMAP's PARAMS order after the focal lengths and principal point
COLMAP = {
    "SIMPLE_RADIAL": [-0.08],
    "RADIAL": [-0.1, 0.02],
    "OPENCV": [0.06, -0.01, 0.003, -0.002],  # pincushion: black corners
    "FULL_OPENCV": [-0.12, 0.02, 0.002, 0.001, 0.003, 0.02, -0.005, 0.001],
    "OPENCV_FISHEYE": [0.05, -0.01, 0.002, -0.001],
    "RADIAL_FISHEYE": [0.04, -0.008],
    "SIMPLE_RADIAL_FISHEYE": [0.03],
}


# ---------------------------------------------------------------- the models, from their definitions
def single_focal(model: str) -> bool:
    return model.startswith(("SIMPLE", "RADIAL"))


def colmap_params(model: str, coefficients) -> list[float]:
    return [*([FX] if single_focal(model) else [FX, FY]), CX, CY, *coefficients]


def pinhole_pixels(model: str, x, y):
    """The pinhole projection (same fx, fy, cx, cy) of normalised coordinates."""
    return FX * x + CX, (FX if single_focal(model) else FY) * y + CY


def normalised(model: str, u, v):
    return (u - CX) / FX, (v - CY) / (FX if single_focal(model) else FY)


def distort(model: str, params, x, y):
    """COLMAP's ``ImgFromCam`` of normalised pinhole coordinates ``(x, y)``: distorted pixels."""
    single = single_focal(model)
    fx, fy, cx, cy = (params[0], params[0], params[1], params[2]) if single else params[:4]
    k = list(params[3 if single else 4 :])
    if model in FISHEYE:  # equidistant: theta = atan(r), then the radial polynomial in theta
        k += [0.0] * (4 - len(k))
        r = np.hypot(x, y)
        theta = np.arctan(r)
        scale = np.where(r > 1e-12, theta / np.maximum(r, 1e-12), 1.0)
        u, v = x * scale, y * scale
        t2 = u * u + v * v
        radial = k[0] * t2 + k[1] * t2**2 + k[2] * t2**3 + k[3] * t2**4
        xd, yd = u * (1 + radial), v * (1 + radial)
    else:  # SIMPLE_RADIAL (k), RADIAL (k1 k2), OPENCV (k1 k2 p1 p2): their PARAMS begin FULL_OPENCV's
        k1, k2, p1, p2, k3, k4, k5, k6 = k + [0.0] * (8 - len(k))
        r2 = x * x + y * y
        radial = (1 + k1 * r2 + k2 * r2**2 + k3 * r2**3) / (1 + k4 * r2 + k5 * r2**2 + k6 * r2**3)
        xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
        yd = y * radial + 2 * p2 * x * y + p1 * (r2 + 2 * y * y)
    return fx * xd + cx, fy * yd + cy


def undistort_normalised(model: str, params, u, v):
    """Normalised pinhole coordinates of distorted pixels ``(u, v)``: the inverse of :func:`distort`,
    by fixed-point iteration on the forward model (converged to 1e-12)."""
    target_x, target_y = normalised(model, u, v)
    x, y = target_x.copy(), target_y.copy()
    for _ in range(500):
        ex, ey = (a - b for a, b in zip(normalised(model, *distort(model, params, x, y)), (target_x, target_y)))
        x, y = x - ex, y - ey
    assert max(np.abs(ex).max(), np.abs(ey).max()) < 1e-12
    return x, y


def write_cameras(folder: Path, model: str, params) -> Path:
    path = folder / "cameras.txt"
    path.write_text(f"1 {model} {W} {H} " + " ".join(repr(float(p)) for p in params) + "\n")
    return path


def pixel_grid() -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)


# ---------------------------------------------------------------- the map: parameter order and equations
@settings(max_examples=15, deadline=None)
@given(model=st.sampled_from(sorted(COLMAP)), scale=st.floats(-1.5, 1.5), seed=st.integers(0, 2**16))
def test_distortion_map_follows_each_models_definition(model, scale, seed):
    rng = np.random.default_rng(seed)
    coefficients = [c * scale * rng.uniform(0.5, 1.5) for c in COLMAP[model]]
    params = colmap_params(model, coefficients)
    with tempfile.TemporaryDirectory() as tmp:
        camera = read_colmap_cameras(write_cameras(Path(tmp), model, params))[1]
    pixels = np.stack(pixel_grid(), -1).reshape(-1, 2)
    expected = np.stack(distort(model, params, *normalised(model, pixels[:, 0], pixels[:, 1])), -1)
    if camera.distortion is None:  # all coefficients 0: a pinhole camera
        assert model not in FISHEYE and not any(coefficients)
        np.testing.assert_allclose(pixels, expected, atol=1e-9, rtol=0)
        return
    got = distort_pixels(torch.from_numpy(pixels), camera.K, camera.distortion).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- the image: a coordinate-encoding image
@pytest.mark.parametrize("model", sorted(COLMAP))
def test_undistorted_pixel_holds_what_the_distorted_image_had_at_the_distorted_projection(tmp_path, model):
    params = colmap_params(model, COLMAP[model])
    camera = read_colmap_cameras(write_cameras(tmp_path, model, params))[1]
    u, v = pixel_grid()
    coordinates = torch.from_numpy(np.stack([u / W, v / H])).float()  # the distorted image: its own coordinates
    undistorted = undistort_image(coordinates, camera.K, camera.distortion).double().numpy()

    rng = np.random.default_rng(1)  # 3D points in front of the camera, across the field of view
    points = np.stack([rng.uniform(-0.75, 0.75, 2000), rng.uniform(-0.6, 0.6, 2000), rng.uniform(1, 3, 2000)], -1)
    points[:, :2] *= points[:, 2:]
    x, y = points[:, 0] / points[:, 2], points[:, 1] / points[:, 2]
    pinhole_u, pinhole_v = pinhole_pixels(model, x, y)
    distorted_u, distorted_v = distort(model, params, x, y)
    inside = (
        (pinhole_u > 1)
        & (pinhole_u < W - 1)
        & (pinhole_v > 1)
        & (pinhole_v < H - 1)  # no padding read
        & (distorted_u > 2)
        & (distorted_u < W - 2)
        & (distorted_v > 2)
        & (distorted_v < H - 2)
    )
    assert inside.sum() > 1000

    def bilinear(image, pu, pv):  # pixel centres at (j + 0.5, i + 0.5)
        j, i = pu - 0.5, pv - 0.5
        j0, i0 = np.floor(j).astype(int), np.floor(i).astype(int)
        a, b = j - j0, i - i0
        return (
            (1 - a) * (1 - b) * image[:, i0, j0]
            + a * (1 - b) * image[:, i0, j0 + 1]
            + (1 - a) * b * image[:, i0 + 1, j0]
            + a * b * image[:, i0 + 1, j0 + 1]
        )

    held = bilinear(undistorted, pinhole_u[inside], pinhole_v[inside])
    error = np.hypot(held[0] * W - distorted_u[inside], held[1] * H - distorted_v[inside])
    # measured: at most 0.0024 px (fisheye; the bilinear reading of a smooth map between pixel centres)
    assert error.max() < 0.005, f"{model}: {error.max():.4f} px"
    ignored = np.hypot(pinhole_u[inside] - distorted_u[inside], pinhole_v[inside] - distorted_v[inside])
    assert ignored.max() > 0.5  # what ignoring the distortion would cost: the check can fail


def test_pincushion_corners_that_the_lens_never_saw_are_black(tmp_path):
    camera = read_colmap_cameras(write_cameras(tmp_path, "OPENCV", colmap_params("OPENCV", COLMAP["OPENCV"])))[1]
    undistorted = undistort_image(torch.ones(3, H, W), camera.K, camera.distortion)
    assert undistorted[:, 0, 0].max() == 0 and undistorted[:, -1, -1].max() == 0
    assert undistorted[:, H // 2, W // 2].min() == 1


# ---------------------------------------------------------------- end to end: files with distorted cameras
def pattern(x, y) -> np.ndarray:
    """A smooth RGB image of the normalised pinhole plane (periods of about 40 pixels)."""
    return np.stack(
        [
            0.5 + 0.4 * np.sin(6.0 * x + 4.0 * y),
            0.5 + 0.4 * np.cos(5.0 * x - 6.5 * y + 1),
            0.5 + 0.4 * np.sin(3.0 * x + 7.0 * y + 2),
        ],
        -1,
    )


def distorted_view(model: str, params) -> np.ndarray:
    """uint8 ``(H, W, 3)``: :func:`pattern` seen through the distorted camera."""
    x, y = undistort_normalised(model, params, *pixel_grid())
    return (pattern(x, y) * 255).round().astype(np.uint8)


def write_colmap_scene(folder: Path, model: str, params) -> None:
    (folder / "images").mkdir(parents=True)
    Image.fromarray(distorted_view(model, params)).save(folder / "images" / "view.png")
    write_cameras(folder, model, params)
    (folder / "images.txt").write_text("1 1 0 0 0 0 0 0 1 view.png\n\n")


def write_nerfstudio_scene(folder: Path, lens: dict, model: str, params) -> None:
    (folder / "images").mkdir(parents=True)
    Image.fromarray(distorted_view(model, params)).save(folder / "images" / "view.png")
    c2w = np.diag([1.0, -1.0, -1.0, 1.0]).tolist()  # OpenGL axes of the identity OpenCV camera
    meta = {
        "fl_x": FX,
        "fl_y": FY,
        "cx": CX,
        "cy": CY,
        "w": W,
        "h": H,
        **lens,
        "frames": [{"file_path": "images/view.png", "transform_matrix": c2w}],
    }
    (folder / "transforms.json").write_text(json.dumps(meta))


NERFSTUDIO = {  # transforms.json lens fields -> the COLMAP model with the same equations, and its coefficients
    "opencv": (
        {"camera_model": "OPENCV", "k1": -0.07, "k2": 0.01, "k3": 0.002, "p1": 0.002, "p2": -0.001},
        "FULL_OPENCV",
        [-0.07, 0.01, 0.002, -0.001, 0.002, 0, 0, 0],
    ),
    "fisheye": (
        {"camera_model": "OPENCV_FISHEYE", "k1": 0.05, "k2": -0.01, "k3": 0.002, "k4": -0.001},
        "OPENCV_FISHEYE",
        [0.05, -0.01, 0.002, -0.001],
    ),
    "instant-ngp fisheye": (
        {"is_fisheye": True, "k1": 0.04, "k2": -0.008, "p1": 0.0, "p2": 0.0},
        "OPENCV_FISHEYE",
        [0.04, -0.008, 0, 0],
    ),
}


@pytest.mark.parametrize("case", [*(f"colmap {m}" for m in sorted(COLMAP)), *(f"nerfstudio {n}" for n in NERFSTUDIO)])
def test_distorted_captures_load_as_the_pinhole_images_of_the_scene(tmp_path, case, caplog):
    writer, name = case.split(" ", 1)
    if writer == "colmap":
        model, coefficients = name, COLMAP[name]
        params = colmap_params(model, coefficients)
        write_colmap_scene(tmp_path, model, params)
    else:
        lens, model, coefficients = NERFSTUDIO[name]
        params = [FX, FY, CX, CY, *coefficients]
        write_nerfstudio_scene(tmp_path, lens, model, params)
    x, y = normalised(model, *pixel_grid())
    x_d, y_d = distort(model, params, x, y)
    seen = (x_d > 1) & (x_d < W - 1) & (y_d > 1) & (y_d < H - 1)
    expected = pattern(x, y)[seen]

    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path)
    assert not caplog.text
    fy = FX if single_focal(model) else FY
    torch.testing.assert_close(
        scene.cameras.K[0, 0].double(),
        torch.tensor([[FX, 0, CX], [0, fy, CY], [0, 0, 1]], dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )  # K kept
    error = np.abs(scene.images[0].permute(1, 2, 0).double().numpy()[seen] - expected).max()
    # measured: at most 0.0061 (8-bit files and the bilinear reading of a pattern with 40-pixel periods)
    assert error < 0.012, f"{case}: {error:.4f}"
    as_pinhole = load_scene(tmp_path, undistort=False).images[0].permute(1, 2, 0).double().numpy()[seen]
    assert np.abs(as_pinhole - expected).max() > 0.06  # distortion ignored (measured 0.09 to 0.58): the check can fail


# ---------------------------------------------------------------- lens fields that cannot be undistorted
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"camera_model": "EQUIRECTANGULAR"}, r"field 'camera_model' must be one of OPENCV, .*got 'EQUIRECTANGULAR'"),
        ({"camera_model": "OPENCV", "k4": 0.01}, r"field 'k4' must be 0 for camera_model OPENCV \(nerfstudio's r\^8"),
        (
            {"camera_model": "OPENCV_FISHEYE", "p1": 0.01},
            r"field 'p1' and 'p2' must be 0 for camera_model OPENCV_FISHEYE",
        ),
        ({"k1": "abc"}, r"field 'k1' must be a finite number, got 'abc'"),
        ({"k2": float("nan")}, r"field 'k2' must be a finite number, got nan"),
    ],
)
def test_nerfstudio_lens_fields_that_cannot_be_undistorted_name_the_field(tmp_path, fields, message):
    write_nerfstudio_scene(tmp_path, fields, "OPENCV", [FX, FY, CX, CY, 0, 0, 0, 0])
    with pytest.raises(SceneError, match=r"transforms\.json frames\[0\]: " + message):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "line, message",
    [
        (f"1 FOV {W} {H} 45 32 24 0.9", r"cameras\.txt:1: camera model FOV is not supported \(use one of"),
        (
            f"1 SIMPLE_RADIAL {W} {H} 45 32 24 nan",
            r"cameras\.txt:1: field PARAMS k1 must be a finite number, got 'nan'",
        ),
        (f"1 OPENCV {W} {H} 45 45 32 24 0.1 0.0 inf 0.0", r"cameras\.txt:1: field PARAMS p1 must be a finite number"),
        (
            f"1 OPENCV_FISHEYE {W} {H} 45 45 32 24 0.1",
            r"OPENCV_FISHEYE needs 8 PARAMS \(fx, fy, cx, cy, k1, k2, k3, k4\)",
        ),
    ],
)
def test_colmap_lens_params_that_cannot_be_undistorted_name_the_line(tmp_path, line, message):
    (tmp_path / "cameras.txt").write_text(line + "\n")
    with pytest.raises(SceneError, match=message):
        read_colmap_cameras(tmp_path / "cameras.txt")
