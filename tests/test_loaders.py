"""Real-data loaders: fixtures written in each foreign format from known OpenCV cameras.

Every fixture is written from ground-truth cameras (pixel K, world-to-camera, OpenCV axes) with
formulas independent of the loaders; the loaded cameras must re-project known 3D points to the
same pixels, and each view must carry its own image.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import random_rotation, so3_exp
from hrope.nvs.data.real.co3d import CO3DSource
from hrope.nvs.data.real.colmap import read_colmap_images
from hrope.nvs.data.real.frames import select_frames
from hrope.nvs.data.real.llff import load_llff
from hrope.nvs.data.real.loaders import LOADERS, Loader, SceneFolderSource, detect_format, load_scene, make_source
from hrope.nvs.data.real.re10k import RealEstate10KSource, read_evaluation_index
from hrope.nvs.data.scene import SceneError

H, W = 12, 16  # non-square so that width/height mix-ups show
V = 4


# ---------------------------------------------------------------- ground truth and checks
def truth(seed: int, size=(H, W), centred=False, square_pixels=False):
    """Random OpenCV cameras: K (V, 3, 3) pixels, world_to_cam (V, 4, 4), camera centres (V, 3)."""
    g = torch.Generator().manual_seed(seed)
    h, w = size
    u = torch.rand(V, 4, generator=g, dtype=torch.float64)
    K = torch.zeros(V, 3, 3, dtype=torch.float64)
    K[:, 0, 0] = w * (0.7 + 0.8 * u[:, 0])
    K[:, 1, 1] = K[:, 0, 0] if square_pixels else h * (0.7 + 0.8 * u[:, 1])
    K[:, 0, 2] = w / 2 if centred else w * (0.4 + 0.2 * u[:, 2])
    K[:, 1, 2] = h / 2 if centred else h * (0.4 + 0.2 * u[:, 3])
    K[:, 2, 2] = 1
    R = random_rotation(V, generator=g)
    centre = torch.randn(V, 3, generator=g, dtype=torch.float64)
    E = torch.eye(4, dtype=torch.float64).repeat(V, 1, 1)
    E[:, :3, :3] = R
    E[:, :3, 3] = -(R @ centre[..., None])[..., 0]
    return K, E, centre


def points_in_front(E: torch.Tensor, seed: int) -> torch.Tensor:
    """``(V, P, 3)`` world points 1–3 units in front of each camera."""
    g = torch.Generator().manual_seed(seed + 99)
    local = torch.rand(V, 20, 3, generator=g, dtype=torch.float64) - 0.5
    local[..., 2] = 1 + 2 * local[..., 2].abs()
    R, t = E[:, :3, :3], E[:, :3, 3]
    return (local - t[:, None]) @ R  # R^T (x - t) for each row


def project_cv(K, E, X):
    """OpenCV pinhole projection of world points ``X (V, P, 3)`` -> pixels ``(V, P, 2)``."""
    cam = X @ E[:, :3, :3].transpose(-1, -2) + E[:, None, :3, 3]
    pix = cam @ K.transpose(-1, -2)
    return pix[..., :2] / pix[..., 2:]


def assert_reprojects(scene, expected_pixels, X, atol=2e-3):
    cams = scene.cameras
    got = project_cv(cams.K[0].double(), cams.world_to_cam[0].double(), X)
    torch.testing.assert_close(got, expected_pixels, atol=atol, rtol=0)


def view_images(seed: int, size=(H, W)) -> list[np.ndarray]:
    """One distinct random uint8 image ``(H, W, 3)`` per view."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(V)]


def flat_images(size=(H, W)) -> list[np.ndarray]:
    """Per-view constant colours far apart (robust to JPEG)."""
    colours = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20)]
    return [np.broadcast_to(np.array(c, np.uint8), (*size, 3)).copy() for c in colours[:V]]


def assert_images(scene, arrays, atol=0.0):
    expected = torch.stack([torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays])
    torch.testing.assert_close(scene.images, expected, atol=atol + 1e-6, rtol=0)


def save_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG")  # PNG whatever the suffix: lossless


# ---------------------------------------------------------------- nerfstudio / instant-ngp
def write_nerfstudio(folder: Path, K, E, images, shared=True, distortion=0.0) -> None:
    frames = []
    for v in range(V):
        c2w = torch.linalg.inv(E[v])
        c2w_gl = torch.stack([c2w[:, 0], -c2w[:, 1], -c2w[:, 2], c2w[:, 3]], 1)  # x right, y up, z back
        save_png(folder / "images" / f"frame_{v:05d}.png", images[v])
        frame = {"file_path": f"images/frame_{v:05d}.png", "transform_matrix": c2w_gl.tolist()}
        if not shared:
            frame.update(fl_x=float(K[v, 0, 0]), fl_y=float(K[v, 1, 1]), cx=float(K[v, 0, 2]), cy=float(K[v, 1, 2]))
        frames.append(frame)
    meta = {"w": W, "h": H, "camera_model": "OPENCV", "k1": distortion, "frames": frames}
    if shared:
        meta.update(fl_x=float(K[0, 0, 0]), fl_y=float(K[0, 1, 1]), cx=float(K[0, 0, 2]), cy=float(K[0, 1, 2]))
    (folder / "transforms.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("shared", [True, False])
def test_nerfstudio_reprojects(tmp_path, shared):
    K, E, _ = truth(1)
    if shared:
        K[:] = K[0]
    images = view_images(1)
    write_nerfstudio(tmp_path, K, E, images, shared=shared)
    assert detect_format(tmp_path) == "nerfstudio"
    scene = load_scene(tmp_path)
    X = points_in_front(E, 1)
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert_images(scene, images)


def test_instant_ngp_camera_angle_and_ignored_distortion_warning(tmp_path, caplog):
    K, E, _ = truth(2, centred=True, square_pixels=True)
    K[:] = K[0]
    images = view_images(2)
    write_nerfstudio(tmp_path, K, E, images, distortion=0.1)
    meta = json.loads((tmp_path / "transforms.json").read_text())
    for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):  # size then comes from the image files
        del meta[key]
    meta["camera_angle_x"] = 2 * math.atan(W / (2 * float(K[0, 0, 0])))
    for frame in meta["frames"]:
        frame["file_path"] = frame["file_path"][:-4]  # Blender style: no extension
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path / "transforms.json", undistort=False)
    assert "OPENCV lens distortion ignored" in caplog.text
    X = points_in_front(E, 2)
    assert_reprojects(scene, project_cv(K, E, X), X)


def test_nerfstudio_downsampled_folder_and_malformed_frame(tmp_path):
    K, E, _ = truth(6)
    K[:] = K[0]
    write_nerfstudio(tmp_path, K, E, view_images(6))
    small = view_images(7, size=(H // 2, W // 2))
    for v in range(V):  # only a half-size copy, as some downloads ship
        (tmp_path / "images" / f"frame_{v:05d}.png").unlink()
        save_png(tmp_path / "images_2" / f"frame_{v:05d}.png", small[v])
    scene = load_scene(tmp_path)
    X = points_in_front(E, 6)
    assert_reprojects(scene, project_cv(K, E, X) / 2, X)
    assert_images(scene, small)
    meta = json.loads((tmp_path / "transforms.json").read_text())
    del meta["frames"][2]["transform_matrix"]
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match=r"transforms\.json frames\[2\]: needs 'file_path' and 'transform_matrix'"):
        load_scene(tmp_path)
    meta["frames"][2]["transform_matrix"] = torch.diag(
        torch.tensor([2.0, 2.0, 2.0, 1.0])
    ).tolist()  # a scaled "rotation"
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match=r"transforms\.json frames\[2\]: invalid camera.*not a rotation"):
        load_scene(tmp_path)


# ---------------------------------------------------------------- COLMAP
def rotation_to_quaternion(R: torch.Tensor) -> torch.Tensor:
    """(w, x, y, z) via the axis-angle of R (independent of the loader's formula)."""
    angle = torch.arccos(((torch.trace(R) - 1) / 2).clamp(-1, 1))
    axis = torch.stack([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]]) / (2 * torch.sin(angle))
    q = torch.cat([torch.cos(angle / 2)[None], torch.sin(angle / 2) * axis])
    # the fixture itself is right (arccos keeps half the digits near angle 0: measured 1.4e-7)
    assert torch.allclose(so3_exp(axis * angle), R, rtol=0, atol=2e-6)
    return q


def write_colmap(
    folder: Path,
    K,
    E,
    images,
    layout="sparse/0",
    models=("PINHOLE", "SIMPLE_PINHOLE", "SIMPLE_RADIAL", "OPENCV"),
    header=True,
) -> None:
    """COLMAP's text model; with ``header`` the counts COLMAP writes in its comments."""
    model = folder / layout if layout else folder
    model.mkdir(parents=True, exist_ok=True)
    camera_lines = ["# Camera list", *([f"# Number of cameras: {V}"] if header else [])]
    image_lines = [
        "# Image list",
        "#   POINTS2D[] as (X, Y, POINT3D_ID)",
        *([f"# Number of images: {V}, mean observations per image: 1"] if header else []),
    ]
    for v in range(V):
        fx, fy, cx, cy = (float(x) for x in (K[v, 0, 0], K[v, 1, 1], K[v, 0, 2], K[v, 1, 2]))
        params = {
            "PINHOLE": [fx, fy, cx, cy],
            "SIMPLE_PINHOLE": [fx, cx, cy],
            "SIMPLE_RADIAL": [fx, cx, cy, 0.01],
            "OPENCV": [fx, fy, cx, cy, 0.01, 0.0, 0.0, 0.0],
        }[models[v]]
        camera_lines.append(f"{v + 7} {models[v]} {W} {H} " + " ".join(repr(p) for p in params))
        q = rotation_to_quaternion(E[v, :3, :3])
        q = q if v % 2 else -q  # q and -q are the same rotation
        t = E[v, :3, 3]
        name = f"img_{v:02d}.png"
        save_png(folder / "images" / name, images[v])
        image_lines.append(f"{v + 1} " + " ".join(repr(float(x)) for x in [*q, *t]) + f" {v + 7} {name}")
        image_lines.append("" if v % 2 else "10.5 3.25 -1 2.0 4.0 17")  # points line, possibly empty
    (model / "cameras.txt").write_text("\n".join(camera_lines) + "\n")
    (model / "images.txt").write_text("\n".join(image_lines) + "\n")


@pytest.mark.parametrize("layout", ["sparse/0", ""])
def test_colmap_reprojects(tmp_path, layout, caplog):
    K, E, _ = truth(3)
    for v in (1, 2):  # single-focal models
        K[v, 1, 1] = K[v, 0, 0]
    images = view_images(3)
    write_colmap(tmp_path, K, E, images, layout)
    assert detect_format(tmp_path) == "colmap"
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path, undistort=False)  # the images as written (tests/test_undistort.py undistorts)
    assert "OPENCV, SIMPLE_RADIAL lens distortion ignored" in caplog.text
    X = points_in_front(E, 3)
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert_images(scene, images)


def test_colmap_unsupported_model_names_line(tmp_path):
    K, E, _ = truth(4)
    write_colmap(tmp_path, K, E, view_images(4))
    cameras = tmp_path / "sparse/0/cameras.txt"
    cameras.write_text(cameras.read_text().replace("PINHOLE 16", "FISHEYE_X 16", 1))
    with pytest.raises(SceneError, match=r"cameras\.txt:3.*FISHEYE_X"):
        load_scene(tmp_path)


# ---------------------------------------------------------------- LLFF
def write_llff(folder: Path, K, E, images, factor: int, size=(H, W)) -> None:
    """``poses_bounds.npy`` for full-resolution ``size`` images, and ``images`` in ``images_{factor}``."""
    rows = []
    for v in range(V):
        c2w = torch.linalg.inv(E[v])
        right, down, forward, centre = c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3]
        hwf = torch.tensor([size[0], size[1], float(K[v, 0, 0])], dtype=torch.float64)
        pose = torch.stack([down, right, -forward, centre, hwf], 1)  # LLFF [down, right, back]
        rows.append(torch.cat([pose.reshape(-1), torch.tensor([0.5, 9.0], dtype=torch.float64)]))
        save_png(folder / ("images" if factor == 1 else f"images_{factor}") / f"IMG_{v:03d}.png", images[v])
    np.save(folder / "poses_bounds.npy", torch.stack(rows).numpy())


def test_llff_reprojects_with_downsampled_images(tmp_path):
    K, E, _ = truth(5, centred=True, square_pixels=True)
    images = view_images(5, size=(H // 2, W // 2))
    write_llff(tmp_path, K, E, images, factor=2)
    assert detect_format(tmp_path) == "llff"
    scene = load_llff(tmp_path, image_factor=2)
    assert scene.image_size == (H // 2, W // 2)
    X = points_in_front(E, 5)
    assert_reprojects(scene, project_cv(K, E, X) / 2, X)  # a half-size image halves pixel coordinates
    assert_images(scene, images)
    assert load_scene(tmp_path).image_size == (H // 2, W // 2)  # no images/: the downsampled folder there is
    with pytest.raises(SceneError, match=r"image_factor 1 reads images/, which does not exist; .*present: images_2/"):
        load_scene(tmp_path, image_factor=1)


# ---------------------------------------------------------------- RealEstate10K
def jpeg_tensor(array: np.ndarray) -> torch.Tensor:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=95)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def re10k_example(key: str, seed: int) -> tuple[dict, torch.Tensor, torch.Tensor, list[np.ndarray]]:
    K, E, _ = truth(seed)
    normalised = torch.stack([K[:, 0, 0] / W, K[:, 1, 1] / H, K[:, 0, 2] / W, K[:, 1, 2] / H], 1)
    cameras = torch.cat([normalised, torch.zeros(V, 2, dtype=torch.float64), E[:, :3].reshape(V, 12)], 1)
    images = flat_images()
    example = {
        "key": key,
        "url": "https://example.invalid",
        "timestamps": torch.arange(V) * 1000,
        "cameras": cameras.float(),
        "images": [jpeg_tensor(a) for a in images],
    }
    return example, K, E, images


def test_re10k_chunks_and_evaluation_index(tmp_path, caplog):
    examples = [re10k_example(f"scene{i}", 10 + i) for i in range(3)]
    torch.save([examples[0][0], examples[1][0]], tmp_path / "000000.torch")
    torch.save([examples[2][0]], tmp_path / "000001.torch")
    (tmp_path / "000002.torch").write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        source = RealEstate10KSource(tmp_path)
    assert "000002.torch" in caplog.text and len(source) == 3
    for i, (_, K, E, images) in enumerate(examples):
        scene = source[i]
        X = points_in_front(E, i)
        assert_reprojects(scene, project_cv(K, E, X), X, atol=1e-3 * W)  # float32 storage in the chunk
        assert_images(scene, images, atol=0.012)  # JPEG of flat colours: measured 1/255 = 0.0039

    index = {
        "scene1": {"context": [3, 0], "target": [1, 2, 0]},
        "scene0": None,
        "missing": {"context": [0, 1], "target": [2]},
    }
    (tmp_path / "evaluation_index.json").write_text(json.dumps(index))
    assert read_evaluation_index(tmp_path / "evaluation_index.json")["scene1"] == ([3, 0], [1, 2, 0])
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        evaluation = RealEstate10KSource(
            tmp_path, evaluation_index=tmp_path / "evaluation_index.json", image_size=(8, 8)
        )
    assert len(evaluation) == 1 and "1 of 2 evaluation scenes" in caplog.text
    scene = evaluation[0]
    assert scene.num_views == 5 and scene.image_size == (8, 8)
    assert evaluation.context_target(0) == ([0, 1], [2, 3, 4])
    order = [3, 0, 1, 2, 0]
    colours = scene.images.mean((-1, -2))
    expected = torch.stack([torch.from_numpy(examples[1][3][v][0, 0]).float() / 255 for v in order])
    torch.testing.assert_close(colours, expected, atol=0.012, rtol=0)  # JPEG: measured 1/255 = 0.0039


def test_re10k_corrupt_scene_is_skipped_and_counted(tmp_path, caplog):
    good, _, _, _ = re10k_example("good", 20)
    bad, _, _, _ = re10k_example("bad", 21)
    bad["images"][2] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    torch.save([bad, good], tmp_path / "000000.torch")
    source = RealEstate10KSource(tmp_path, num_views=3)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = source[0]  # "bad" sorts first
    assert scene.name == "good" and source.num_skipped == 1 and "'bad'" in caplog.text
    strict = RealEstate10KSource(tmp_path, skip_errors=False)
    with pytest.raises(SceneError, match=r"'bad' frame 2"):
        strict[0]


def test_re10k_malformed_field_and_unsafe_pickle(tmp_path):
    example, _, _, _ = re10k_example("odd", 22)
    example["cameras"] = example["cameras"][:, :17]
    torch.save([example], tmp_path / "000000.torch")
    with pytest.raises(SceneError, match=r"000000\.torch scene 'odd': field 'cameras'"):
        RealEstate10KSource(tmp_path, skip_errors=False)[0]

    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    torch.save([{"key": "x", "payload": logging.getLogger("x")}], unsafe / "000000.torch")
    with pytest.raises(SceneError, match="no readable"):
        RealEstate10KSource(unsafe)


# ---------------------------------------------------------------- CO3Dv2
def co3d_annotation(K, E, v, sequence, convention, size=(H, W)):
    """PyTorch3D viewpoint of the OpenCV camera: X_p3d = F X_cv with F = diag(-1, -1, 1)."""
    h, w = size
    F = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64))
    R_rows = (F @ E[v, :3, :3]).T  # row-vector convention: X_p3d = X_world @ R + T
    T = F @ E[v, :3, 3]
    half = torch.tensor([w / 2, h / 2], dtype=torch.float64)
    scale = torch.full((2,), min(h, w) / 2, dtype=torch.float64) if convention == "ndc_isotropic" else half
    focal = torch.stack([K[v, 0, 0], K[v, 1, 1]]) / scale
    principal = (half - torch.stack([K[v, 0, 2], K[v, 1, 2]])) / scale
    return {
        "sequence_name": sequence,
        "frame_number": v,
        "frame_timestamp": 0.1 * v,
        "image": {"path": f"teddybear/{sequence}/images/frame{v:06d}.jpg", "size": [h, w]},
        "viewpoint": {
            "R": R_rows.tolist(),
            "T": T.tolist(),
            "focal_length": focal.tolist(),
            "principal_point": principal.tolist(),
            "intrinsics_format": convention,
        },
    }


def project_pytorch3d(annotation, X):
    """Pixels of world points by PyTorch3D's own conventions (NDC +x left/+y up -> screen)."""
    vp, (h, w) = annotation["viewpoint"], annotation["image"]["size"]
    R, T = torch.tensor(vp["R"], dtype=torch.float64), torch.tensor(vp["T"], dtype=torch.float64)
    cam = X @ R + T
    ndc = torch.tensor(vp["focal_length"], dtype=torch.float64) * cam[:, :2] / cam[:, 2:] + torch.tensor(
        vp["principal_point"], dtype=torch.float64
    )
    half = torch.tensor([w / 2, h / 2], dtype=torch.float64)
    scale = min(h, w) / 2 if vp["intrinsics_format"] == "ndc_isotropic" else half
    return half - ndc * scale


@pytest.mark.parametrize("convention", ["ndc_isotropic", "ndc_norm_image_bounds"])
def test_co3d_reprojects(tmp_path, convention):
    K, E, _ = truth(30)
    annotations = [co3d_annotation(K, E, v, "101_1_2", convention) for v in range(V)]
    K2, E2, _ = truth(31)
    annotations += [co3d_annotation(K2, E2, v, "102_3_4", convention) for v in range(V)]
    for a, image in zip(annotations, view_images(30) + view_images(31)):
        save_png(tmp_path / a["image"]["path"], image)  # PNG bytes under a .jpg name: decoded by content
    annotations = annotations[::-1]  # the loader sorts by frame_number
    (tmp_path / "teddybear").mkdir(exist_ok=True)
    with gzip.open(tmp_path / "teddybear" / "frame_annotations.jgz", "wt") as file:
        json.dump(annotations, file)
    source = CO3DSource(tmp_path, num_views=3)
    assert len(source) == 2
    scene = source[0]
    picked = select_frames(V, 3, "even")
    X = points_in_front(E, 30)[picked]
    by_frame = {a["frame_number"]: a for a in annotations if a["sequence_name"] == "101_1_2"}
    expected = torch.stack([project_pytorch3d(by_frame[v], X[i]) for i, v in enumerate(picked)])
    assert_reprojects(scene, expected, X)
    torch.testing.assert_close(expected, project_cv(K[picked], E[picked], X))  # the fixture matches the truth
    assert_images(scene, [view_images(30)[v] for v in picked])


def test_co3d_malformed_annotation_names_field(tmp_path):
    K, E, _ = truth(32)
    annotations = [co3d_annotation(K, E, v, "s", "ndc_isotropic") for v in range(V)]
    del annotations[1]["viewpoint"]["focal_length"]
    (tmp_path / "teddybear").mkdir()
    with gzip.open(tmp_path / "teddybear" / "frame_annotations.jgz", "wt") as file:
        json.dump(annotations, file)
    with pytest.raises(SceneError, match=r"frame_number 1: field viewpoint\.focal_length"):
        CO3DSource(tmp_path, skip_errors=False)[0]


# ---------------------------------------------------------------- a rendered synthetic scene
@pytest.mark.parametrize("writer", ["nerfstudio", "colmap"])
def test_rendered_synthetic_scene_round_trips(tmp_path, writer):
    """A scene of the synthetic renderer (cameras known exactly), written in a foreign format,
    loads back to its own cameras and images."""
    from hrope.nvs.data.synthetic import make_scene

    original = make_scene(0, 0, "object", num_views=V, image_size=(H, W))
    K, E = original.cameras.K[0].double(), original.cameras.world_to_cam[0].double()
    images = [(image.permute(1, 2, 0) * 255).round().byte().numpy() for image in original.images]
    if writer == "nerfstudio":
        write_nerfstudio(tmp_path, K, E, images, shared=False)
    else:
        write_colmap(tmp_path, K, E, images, models=["PINHOLE"] * V)
    scene = load_scene(tmp_path)
    torch.testing.assert_close(scene.cameras.K, original.cameras.K, atol=1e-4, rtol=0)
    torch.testing.assert_close(scene.cameras.world_to_cam, original.cameras.world_to_cam, atol=1e-5, rtol=0)
    assert_images(scene, images)


# ---------------------------------------------------------------- detection, sources, sampling
def test_detection_error_lists_what_it_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(SceneError) as info:
        load_scene(tmp_path)
    for expected in ("transforms.json", "sparse/0", "cameras.txt + images.txt", "poses_bounds.npy", "notes.txt"):
        assert expected in str(info.value)


def test_folder_source_skips_broken_scene(tmp_path, caplog):
    K, E, _ = truth(40)
    write_nerfstudio(tmp_path / "a_scene", K, E, view_images(40))
    write_colmap(tmp_path / "b_broken", K, E, view_images(41))
    (tmp_path / "b_broken" / "images" / "img_03.png").write_bytes(b"not an image")
    write_colmap(tmp_path / "c_scene", K, E, view_images(42))
    source = make_source("folder", tmp_path, num_views=2, image_size=(8, 8))
    assert len(source) == 3
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        names = [source[i].name for i in range(3)]
    assert names == ["a_scene", "c_scene", "c_scene"] and source.num_skipped == 1
    assert "img_03.png" in caplog.text
    with pytest.raises(SceneError, match="img_03.png"):
        SceneFolderSource(tmp_path, skip_errors=False)[1]


def test_source_frame_access_and_dataset_wrapper(tmp_path):
    from hrope.nvs.data.dataset import SceneDataset

    example, K, E, images = re10k_example("only", 50)
    torch.save([example], tmp_path / "000000.torch")
    source = RealEstate10KSource(tmp_path, num_views=2, sampling="random", image_size=(8, 8))
    assert source.num_frames(0) == V
    scene = source.load_views(0, [3, 1])
    expected = torch.stack([torch.from_numpy(images[v][0, 0]).float() / 255 for v in (3, 1)])
    torch.testing.assert_close(scene.images.mean((-1, -2)), expected, atol=0.012, rtol=0)  # JPEG: measured 0.0039
    assert source[0].num_views == 2
    example_views = SceneDataset(make_source("re10k", tmp_path), num_context=2, num_target=1, split="eval")[0]
    assert example_views.num_views == 3

    # scenes listed by index.json are opened lazily; a missing chunk is skipped when reached
    (tmp_path / "index.json").write_text(json.dumps({"only": "000000.torch", "ghost": "000009.torch"}))
    listed = RealEstate10KSource(tmp_path)
    assert listed.keys == ["ghost", "only"]
    assert listed[0].name == "only" and listed.num_skipped == 1


def test_select_frames_even_and_random():
    assert select_frames(10, 3, "even") in ([0, 4, 9], [0, 5, 9])  # 4.5 rounds either way
    assert select_frames(5, None) == [0, 1, 2, 3, 4]
    g = torch.Generator().manual_seed(0)
    draws = [select_frames(100, 4, "random", max_span=10, generator=g) for _ in range(20)]
    for d in draws:
        assert d == sorted(set(d)) and len(d) == 4 and d[-1] - d[0] < 10
    assert len({tuple(d) for d in draws}) > 1
    with pytest.raises(SceneError, match="cannot pick"):
        select_frames(2, 3)


# ---------------------------------------------------------------- sizes and intrinsics: zero, negative, non-finite
def edit_json(path: Path, edit) -> None:
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def edit_tokens(path: Path, first_token: str, index: int, token: str) -> None:
    """Replace token ``index`` of the data line starting with ``first_token``."""
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == first_token and not line.startswith("#"):
            tokens[index] = token
            lines[n] = " ".join(tokens)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "key, value",
    [
        ("w", 0),
        ("h", -12),
        ("w", 12.5),
        ("h", True),
        ("fl_x", 0),
        ("fl_y", math.inf),
        ("cx", math.nan),
        ("cy", -1.0),
        ("fl_x", "wide"),
        ("w", 10**400),
    ],
)
def test_nerfstudio_bad_size_or_intrinsic_names_file_frame_and_field(tmp_path, key, value):
    K, E, _ = truth(8)
    K[:] = K[0]
    write_nerfstudio(tmp_path, K, E, view_images(8))
    edit_json(tmp_path / "transforms.json", lambda meta: meta["frames"][3].update({key: value}))
    with pytest.raises(SceneError, match=rf"transforms\.json frames\[3\]: field '{key}' must be a positive"):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "edit",
    [
        lambda meta: meta.update(fl_x=1e39),  # finite in float64, inf in float32
        lambda meta: meta["frames"][2]["transform_matrix"][0].__setitem__(3, 1e39),
    ],
)
def test_camera_beyond_float32_is_an_error(tmp_path, edit):
    K, E, _ = truth(8)
    K[:] = K[0]
    write_nerfstudio(tmp_path, K, E, view_images(8))
    edit_json(tmp_path / "transforms.json", edit)
    with pytest.raises(SceneError, match=r"frames\[\d\]: invalid camera: .*non-finite"):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "key, value",
    [("camera_angle_x", 0), ("camera_angle_x", math.pi), ("camera_angle_y", -0.5), ("camera_angle_y", math.nan)],
)
def test_instant_ngp_bad_field_of_view_names_field(tmp_path, key, value):
    K, E, _ = truth(8)
    K[:] = K[0]
    write_nerfstudio(tmp_path, K, E, view_images(8))

    def edit(meta):
        for field in ("fl_x", "fl_y"):
            del meta[field]
        meta.update({"camera_angle_x": 0.8, key: value})

    edit_json(tmp_path / "transforms.json", edit)
    with pytest.raises(SceneError, match=rf"frames\[0\]: field '{key}' must be a positive finite number below 3\.14"):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "camera, index, token, field",
    [
        ("7", 2, "0", "WIDTH"),
        ("7", 3, "-12", "HEIGHT"),
        ("7", 2, "16.5", "WIDTH"),
        ("7", 4, "0", "PARAMS fx"),
        ("7", 5, "inf", "PARAMS fy"),
        ("7", 7, "nan", "PARAMS cy"),
        ("8", 4, "-3", "PARAMS f"),
        ("8", 5, "0", "PARAMS cx"),
    ],
)
def test_colmap_bad_size_or_intrinsic_names_line_and_field(tmp_path, camera, index, token, field):
    K, E, _ = truth(4)
    write_colmap(tmp_path, K, E, view_images(4))
    edit_tokens(tmp_path / "sparse/0/cameras.txt", camera, index, token)
    line = 3 if camera == "7" else 4  # after the two header comments
    with pytest.raises(SceneError, match=rf"cameras\.txt:{line}: field {field} must be a positive .*got '{token}'"):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "column, value, field",
    [
        (4, 0.0, "hwf H"),
        (9, math.nan, "hwf W"),
        (14, -100.0, "hwf focal"),
        (14, math.inf, "hwf focal"),
        (4, 11.5, "hwf H"),
    ],
)
def test_llff_bad_size_or_focal_names_row_and_field(tmp_path, column, value, field):
    K, E, _ = truth(5, centred=True, square_pixels=True)
    write_llff(tmp_path, K, E, view_images(5), factor=1)
    rows = np.load(tmp_path / "poses_bounds.npy")
    rows[2, column] = value
    np.save(tmp_path / "poses_bounds.npy", rows)
    with pytest.raises(SceneError, match=rf"poses_bounds\.npy row 2: field {field} must be a positive"):
        load_scene(tmp_path)


@pytest.mark.parametrize(
    "column, value, field", [(0, 0.0, "fx"), (1, -0.5, "fy"), (2, math.nan, "cx"), (3, math.inf, "cy")]
)
def test_re10k_bad_intrinsic_names_frame_and_field(tmp_path, column, value, field):
    example, _, _, _ = re10k_example("odd", 23)
    example["cameras"][1, column] = value
    torch.save([example], tmp_path / "000000.torch")
    with pytest.raises(SceneError, match=rf"scene 'odd' frame 1 \(cameras\[1\]\): field {field} must be a positive"):
        RealEstate10KSource(tmp_path, skip_errors=False)[0]


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda a: a["image"].update(size=[0, W]), r"image\.size H"),
        (lambda a: a["image"].update(size=[H, -W]), r"image\.size W"),
        (lambda a: a["viewpoint"].update(focal_length=[0.0, 1.0]), r"viewpoint\.focal_length x"),
        (lambda a: a["viewpoint"].update(focal_length=[1.0, math.nan]), r"viewpoint\.focal_length y"),
    ],
)
def test_co3d_bad_size_or_focal_names_frame_and_field(tmp_path, edit, field):
    K, E, _ = truth(33)
    annotations = [co3d_annotation(K, E, v, "s", "ndc_isotropic") for v in range(V)]
    edit(annotations[2])
    (tmp_path / "teddybear").mkdir()
    with gzip.open(tmp_path / "teddybear" / "frame_annotations.jgz", "wt") as file:
        json.dump(annotations, file)
    with pytest.raises(SceneError, match=rf"frame_number 2: field {field} must be a positive"):
        CO3DSource(tmp_path, skip_errors=False)[0]


def test_skip_path_turns_bad_intrinsics_into_a_skipped_scene_but_lets_bugs_through(tmp_path, caplog, monkeypatch):
    K, E, _ = truth(43)
    K[:] = K[0]
    write_nerfstudio(tmp_path / "a_zero_width", K, E, view_images(43))
    edit_json(tmp_path / "a_zero_width" / "transforms.json", lambda meta: meta.update(w=0))
    write_nerfstudio(tmp_path / "b_scene", K, E, view_images(44))
    source = make_source("folder", tmp_path)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        assert source[0].name == "b_scene" and source.num_skipped == 1
    assert "1 scene(s) skipped" in caplog.text and "field 'w' must be a positive whole number, got 0" in caplog.text
    monkeypatch.setattr(SceneFolderSource, "frames", lambda self, i: [][i])  # a bug, not bad data
    with pytest.raises(IndexError):
        make_source("folder", tmp_path)[1]


# ---------------------------------------------------------------- COLMAP images.txt: lines recognised by content
def test_colmap_points2d_line_is_optional_and_kept(tmp_path):
    K, E, _ = truth(9)
    images = view_images(9)
    write_colmap(tmp_path, K, E, images, models=["PINHOLE"] * V, header=False)
    path = tmp_path / "sparse/0/images.txt"
    lines = path.read_text().splitlines()
    first = next(n for n, line in enumerate(lines) if not line.startswith("#"))
    image_lines = lines[first::2]
    points = "12 7 -1 30.5 40 5 1 2 -1 100 200 8"  # integer first x: still read as POINTS2D
    # image 0 lost its non-empty POINTS2D line, image 1 its empty one
    path.write_text(
        "\n".join([*lines[:first], image_lines[0], image_lines[1], image_lines[2], points, image_lines[3]]) + "\n"
    )
    scene = load_scene(tmp_path)
    X = points_in_front(E, 9)
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert_images(scene, images)
    parsed = read_colmap_images(path)
    assert [image.points2d for image in parsed] == ["", "", points, ""]
    assert [image.image_id for image in parsed] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda lines: lines[:-2], r"images\.txt: the header declares 4 images, the file has 3"),
        (lambda lines: lines + [lines[3]], r"images\.txt:12: field IMAGE_ID 1 repeats that of line 4"),
        (lambda lines: lines[:5] + [lines[4]] + lines[5:], r"images\.txt:6: expected 'IMAGE_ID QW"),
        (lambda lines: lines[:4] + ["3 0.5"] + lines[4:], r"images\.txt:5: expected 'IMAGE_ID QW.*got '3 0\.5'"),
    ],
)
def test_colmap_truncated_or_garbled_images_txt_is_an_error(tmp_path, edit, message):
    K, E, _ = truth(10)
    write_colmap(tmp_path, K, E, view_images(10))
    path = tmp_path / "sparse/0/images.txt"
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")
    with pytest.raises(SceneError, match=message):
        load_scene(tmp_path)


def test_colmap_truncated_cameras_txt_is_an_error(tmp_path):
    K, E, _ = truth(11)
    write_colmap(tmp_path, K, E, view_images(11))
    path = tmp_path / "sparse/0/cameras.txt"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(SceneError, match=r"cameras\.txt: the header declares 4 cameras, the file has 3"):
        load_scene(tmp_path)


# ---------------------------------------------------------------- what a source leaves out is counted
def test_folder_source_counts_unrecognised_sub_folders(tmp_path, caplog):
    K, E, _ = truth(45)
    write_nerfstudio(tmp_path / "scene", K, E, view_images(45))
    for name in ("notes", "sparse_only"):
        (tmp_path / name).mkdir()
    (tmp_path / "sparse_only" / "cameras.txt").write_text("")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        source = make_source("folder", tmp_path)
    assert len(source) == 1
    assert "2 sub-folder(s) in no known scene format left out: ['notes', 'sparse_only']" in caplog.text


def test_re10k_counts_scenes_without_key_or_with_a_repeated_key(tmp_path, caplog):
    first, _, _, _ = re10k_example("twin", 24)
    second, _, _, _ = re10k_example("twin", 25)
    unnamed, _, _, _ = re10k_example("x", 26)
    del unnamed["key"]
    other, _, _, _ = re10k_example("other", 27)
    torch.save([first, unnamed], tmp_path / "000000.torch")
    torch.save([second, other], tmp_path / "000001.torch")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        source = RealEstate10KSource(tmp_path)
    assert source.keys == ["other", "twin"] and source.chunk_of["twin"].name == "000000.torch"
    assert "1 scene(s) without a string 'key' left out" in caplog.text
    assert "1 scene(s) repeat an earlier scene's key" in caplog.text


@pytest.mark.parametrize(
    "entry", [{"context": [0, "1"], "target": [2]}, {"context": [0, 1]}, [0, 1], {"context": [0, 1.5], "target": [2]}]
)
def test_re10k_evaluation_index_needs_integer_lists(tmp_path, entry):
    (tmp_path / "index.json").write_text(json.dumps({"scene": entry}))
    with pytest.raises(SceneError, match=r"index\.json: entry 'scene' needs lists of frame indices"):
        read_evaluation_index(tmp_path / "index.json")


def test_co3d_counts_requested_sequences_not_found(tmp_path, caplog):
    K, E, _ = truth(34)
    (tmp_path / "teddybear").mkdir()
    with gzip.open(tmp_path / "teddybear" / "frame_annotations.jgz", "wt") as file:
        json.dump([co3d_annotation(K, E, v, "s", "ndc_isotropic") for v in range(V)], file)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        source = CO3DSource(tmp_path, sequences=["s", "ghost"], categories=["teddybear", "hydrant"])
    assert len(source) == 1
    assert "1 of the 2 requested sequences not found" in caplog.text and "['ghost']" in caplog.text
    assert "1 of the 2 requested categories not found" in caplog.text and "['hydrant']" in caplog.text


# ---------------------------------------------------------------- public layouts as distributed
def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def test_transforms_json_listing_frames_it_does_not_ship_loads_the_rest_with_one_warning(tmp_path, caplog):
    """The instant-ngp sample scenes list more frames than they ship (50 of 67); instant-ngp keeps a
    frame only if its file exists, and so does the loader, once per scene of a source."""
    K, E, _ = truth(70)
    K[:] = K[0]
    images = view_images(70)
    write_nerfstudio(tmp_path, K, E, images)
    meta = json.loads((tmp_path / "transforms.json").read_text())
    ghost = {"file_path": "images/frame_99999.png", "transform_matrix": meta["frames"][0]["transform_matrix"]}
    meta["frames"] = meta["frames"][:2] + [ghost] * 3 + meta["frames"][2:]
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    (tmp_path / "images" / "frame_00001.png").unlink()
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path)
    assert warnings_of(caplog) == [
        f"{tmp_path / 'transforms.json'}: 4 of 7 listed frames have no image file and are "
        f"skipped (first: {tmp_path / 'images' / 'frame_00001.png'})"
    ]
    kept = [0, 2, 3]
    X = points_in_front(E, 70)[kept]
    assert_reprojects(scene, project_cv(K[kept], E[kept], X), X)
    assert_images(scene, [images[v] for v in kept])

    caplog.clear()
    source = make_source("nerfstudio", tmp_path, num_views=2)
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        assert source.num_frames(0) == 3 and source[0].num_views == 2 and source.load_views(0, [2]).num_views == 1
    assert len(warnings_of(caplog)) == 1  # the files are read once per source, not at every access
    for path in (tmp_path / "images").iterdir():
        path.unlink()
    with pytest.raises(SceneError, match=r"transforms\.json: none of the 7 listed image files exists \(the first: "):
        load_scene(tmp_path)


def test_llff_scene_as_commonly_downloaded_with_only_images_8(tmp_path):
    """poses_bounds.npy describes the full-resolution photos; the download ships images_8/ with
    rounded sizes (100x132 / 8 = 12.5x16.5 -> 13x17): K follows the decoded size, not the factor."""
    K, E, _ = truth(71, size=(100, 132), centred=True, square_pixels=True)
    images = view_images(71, size=(13, 17))
    write_llff(tmp_path, K, E, images, factor=8, size=(100, 132))
    for scene in (load_scene(tmp_path), load_scene(tmp_path, image_factor=8)):
        assert scene.image_size == (13, 17)
        X = points_in_front(E, 71)
        pixels = project_cv(K, E, X) * torch.tensor([17 / 132, 13 / 100], dtype=torch.float64)
        assert_reprojects(scene, pixels, X)
        assert_images(scene, images)
    with pytest.raises(
        SceneError,
        match=r"image_factor 4 reads images_4/, which does not exist; image folders "
        r"present: images_8/",
    ):
        load_scene(tmp_path, image_factor=4)
    with pytest.raises(SceneError, match=r"field image_factor must be a positive whole number, got 0"):
        load_scene(tmp_path, image_factor=0)
    for v in range(V):  # a rotated copy: another aspect ratio, not a rounding
        save_png(tmp_path / "images_8" / f"IMG_{v:03d}.png", np.ascontiguousarray(images[v].transpose(1, 0, 2)))
    with pytest.raises(SceneError, match=r"the image is 17x13 but the camera is for 100x132, another aspect ratio"):
        load_scene(tmp_path)
    (tmp_path / "images_8").rename(tmp_path / "photos")
    with pytest.raises(SceneError, match=r"no image folder; looked for images/ and images_N/"):
        load_scene(tmp_path)


def test_colmap_reads_the_downsampled_folder_there_is_and_skips_absent_images(tmp_path, caplog):
    K, E, _ = truth(72)
    write_colmap(tmp_path, K, E, view_images(72), models=["PINHOLE"] * V)
    small = view_images(73, size=(H // 2, W // 2))
    for v in range(V):
        (tmp_path / "images" / f"img_{v:02d}.png").unlink()
        if v != 2:
            save_png(tmp_path / "images_2" / f"img_{v:02d}.png", small[v])
    (tmp_path / "images").rmdir()
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path)
    assert warnings_of(caplog) == [
        f"{tmp_path / 'sparse/0/images.txt'}: 1 of 4 listed frames have no image file and "
        f"are skipped (first: {tmp_path / 'images_2' / 'img_02.png'})"
    ]
    kept = [0, 1, 3]
    X = points_in_front(E, 72)[kept]
    assert_reprojects(scene, project_cv(K[kept], E[kept], X) / 2, X)
    assert_images(scene, [small[v] for v in kept])


def test_image_factor_chooses_the_folder_and_rescales_K(tmp_path):
    K, E, _ = truth(74)
    K[:] = K[0]
    images, small = view_images(74), view_images(75, size=(H // 2, W // 2))
    write_nerfstudio(tmp_path, K, E, images)
    for v in range(V):
        save_png(tmp_path / "images_2" / f"frame_{v:05d}.png", small[v])
    X = points_in_front(E, 74)
    for factor, expected, scale in ((None, images, 1), (1, images, 1), (2, small, 2)):
        scene = load_scene(tmp_path, image_factor=factor)  # the full-resolution folder unless told otherwise
        assert_reprojects(scene, project_cv(K, E, X) / scale, X)
        assert_images(scene, expected)
    with pytest.raises(SceneError, match=r"image_factor 4 reads images_4/, .* present: images/, images_2/"):
        load_scene(tmp_path, image_factor=4)
    edit_json(tmp_path / "transforms.json", lambda meta: meta["frames"][1].update(file_path="frame_00001.png"))
    with pytest.raises(SceneError, match=r"frames\[1\]: image_factor 2 needs a field 'file_path' under images/, got "):
        load_scene(tmp_path, image_factor=2)


# ---------------------------------------------------------------- Objaverse renderings (Zero123 / EscherNet)
def zero123_scene():
    """A synthetic object rendered with Zero123's intrinsics, its world shifted so the point the
    cameras look at is the origin (Zero123 normalises objects to it): (scene, K, world_to_cam)."""
    from hrope.nvs.data.synthetic.config import SyntheticConfig
    from hrope.nvs.data.synthetic import make_scene

    fov = math.degrees(2 * math.atan(16 / 35))  # a 35 mm lens on a 32 mm sensor
    config = SyntheticConfig(fov_deg=(fov, fov), focal_aspect_jitter=0.0, principal_point_jitter=0.0)
    scene = make_scene(0, 0, "object", num_views=V, image_size=(64, 64), config=config)
    K, E = scene.cameras.K[0].double(), scene.cameras.world_to_cam[0].double()
    R, t = E[:, :3, :3], E[:, :3, 3]
    centres, axes = -(R.transpose(1, 2) @ t[..., None])[..., 0], R[:, 2]  # optical axes in the world
    projectors = torch.eye(3, dtype=torch.float64) - axes[:, :, None] * axes[:, None, :]
    target = torch.linalg.solve(projectors.sum(0), (projectors @ centres[..., None]).sum(0))[:, 0]
    shift = torch.eye(4, dtype=torch.float64)
    shift[:3, 3] = target
    return scene, K, E @ shift  # X_world_old = X_new + target


def write_objaverse(folder: Path, E, images: list[np.ndarray], opencv_axes: bool = False) -> None:
    """``NNN.png`` + ``NNN.npy`` as Zero123's get_3x4_RT_matrix_from_blender writes them: the
    Blender camera's world rotation R_b (OpenCV camera-to-world rotation with y and z flipped) and
    location C give [R_b^T | -R_b^T C]."""
    folder.mkdir(parents=True, exist_ok=True)
    for v, image in enumerate(images):
        c2w = torch.linalg.inv(E[v])
        rotation = c2w[:3, :3] @ torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))
        R = rotation.T if not opencv_axes else c2w[:3, :3].T
        RT = torch.cat([R, -(R @ c2w[:3, 3])[:, None]], 1)
        np.save(folder / f"{v:03d}.npy", RT.numpy())
        Image.fromarray(image).save(folder / f"{v:03d}.png")


def test_objaverse_rendering_round_trips_its_cameras_and_composites_over_white(tmp_path):
    original, K, E = zero123_scene()
    rgb = [(image.permute(1, 2, 0) * 255).round().byte().numpy() for image in original.images]
    rgba = [np.concatenate([image, np.full((64, 64, 1), 255, np.uint8)], -1) for image in rgb]
    rgba[1][:8, :8] = (10, 200, 30, 0)  # transparent background, whatever colour it carries
    write_objaverse(tmp_path / "obj", E, rgba)
    assert detect_format(tmp_path / "obj") == "objaverse"
    scene = load_scene(tmp_path / "obj")
    torch.testing.assert_close(scene.cameras.K[0].double(), K, atol=1e-4, rtol=0)  # 560 px at 512 = 70 at 64
    torch.testing.assert_close(scene.cameras.world_to_cam[0].double(), E, atol=1e-5, rtol=0)
    rgb[1][:8, :8] = 255
    assert_images(scene, rgb)
    source = make_source("objaverse", tmp_path)
    assert len(source) == 1 and source[0].num_views == V


def test_objaverse_convention_check_and_bad_files(tmp_path, caplog):
    original, _, E = zero123_scene()
    rgb = [(image.permute(1, 2, 0) * 255).round().byte().numpy() for image in original.images]
    write_objaverse(tmp_path, E, rgb, opencv_axes=True)  # matrices already in OpenCV axes: the object is behind
    with pytest.raises(SceneError, match=r"4 of 4 cameras have the object centre behind them .*Blender camera axes"):
        load_scene(tmp_path)
    write_objaverse(tmp_path, E, rgb)
    (tmp_path / "002.png").unlink()
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        assert load_scene(tmp_path).num_views == V - 1
    assert warnings_of(caplog) == [
        f"{tmp_path}: 1 of 4 listed frames have no image file and are skipped (first: {tmp_path / '002.png'})"
    ]
    np.save(tmp_path / "001.npy", np.eye(3))
    with pytest.raises(SceneError, match=r"001\.npy: expected a numeric 3x4 \[R \| t\] matrix, got float64 \(3, 3\)"):
        load_scene(tmp_path)
    with pytest.raises(SceneError, match=r"image_factor picks an images_N/ folder; Objaverse renderings have none"):
        load_scene(tmp_path, image_factor=2)
    turn = torch.eye(4, dtype=torch.float64)  # camera 3 turned 40 degrees away: the object leaves its 49-degree view
    turn[0, 0] = turn[2, 2] = math.cos(math.radians(40))
    turn[0, 2], turn[2, 0] = math.sin(math.radians(40)), -math.sin(math.radians(40))
    E[3] = turn @ E[3]
    write_objaverse(tmp_path, E, rgb)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        load_scene(tmp_path)
    assert warnings_of(caplog) == [
        f"{tmp_path}: the object centre projects outside 1 of 4 views (first: "
        f"{tmp_path / '003.npy'}); Zero123 renderings always look at it"
    ]


# ---------------------------------------------------------------- the data keys of a run config
def test_data_config_keys_reach_the_loaders(tmp_path):
    from hrope.nvs.config import ConfigError, resolve
    from hrope.nvs.build_data import build_scene_source

    K, E, _ = truth(76, centred=True, square_pixels=True)
    write_llff(tmp_path / "scene", K, E, view_images(76), factor=1)
    write_llff(tmp_path / "scene", K, E, view_images(77, size=(H // 2, W // 2)), factor=2)
    data = {
        "kind": "llff",
        "root": str(tmp_path / "scene"),
        "image_factor": 2,
        "cache_dir": str(tmp_path / "cache"),
        "workers": 2,
    }
    source = build_scene_source(resolve({"data": data}), "train")
    assert (source.image_factor, source.workers, source.cache.folder) == (2, 2, tmp_path / "cache")
    assert source.frames(0)[0].image.parent.name == "images_2"
    assert source.load_views(0, [0, 3]).image_size == (64, 64)  # the tiny preset's resolution
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 2
    assert build_scene_source(resolve({"data": {**data, "cache": False}}), "train").cache is None
    with pytest.raises(SceneError, match=r"workers must be a non-negative integer, got -1"):
        make_source("llff", tmp_path / "scene", workers=-1)
    with pytest.raises(ConfigError, match=r"data.image_factor is for the scene-folder kinds \(colmap, dl3dv, "):
        build_scene_source(resolve({"data": {**data, "kind": "re10k"}}), "train")
    for key, value, accepted in (
        ("image_factor", 0, "null or a positive integer"),
        ("workers", -1, "a non-negative integer"),
        ("undistort", "yes", "true or false"),
        ("cache_dir", "", "null or a path"),
    ):
        with pytest.raises(ConfigError, match=rf"data\.{key} must be {accepted}"):
            resolve({"data": {key: value}})


# ---------------------------------------------------------------- the loader registry
def test_a_new_loader_is_one_registry_entry(tmp_path, monkeypatch):
    """A format registered as one :class:`Loader` is detected, loaded, a ``data.kind`` and listed in the errors."""
    from hrope.nvs.config import ConfigError, resolve
    from hrope.nvs.data.real.frames import Frame
    from hrope.nvs.build_data import build_scene_source

    K, E, _ = truth(81)
    X = points_in_front(E, 81)
    images = view_images(81)
    for v, image in enumerate(images):
        save_png(tmp_path / "scene" / f"{v}.png", image)
    torch.save({"K": K, "world_to_cam": E}, tmp_path / "scene" / "cameras.toy")

    def read_toy(folder: Path, image_factor: int | None) -> list[Frame]:
        cameras = torch.load(folder / "cameras.toy")
        return [
            Frame(folder / f"{v}.png", cameras["K"][v], cameras["world_to_cam"][v], label=f"{folder} view {v}")
            for v in range(V)
        ]

    toy = Loader(
        "toy",
        SceneFolderSource,
        detect=lambda folder: (folder / "cameras.toy").is_file(),
        read_frames=read_toy,
        looks_for=("cameras.toy",),
    )
    monkeypatch.setitem(LOADERS, "toy", toy)
    assert detect_format(tmp_path / "scene") == "toy"
    scene = load_scene(tmp_path / "scene")
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert_images(scene, images)
    assert len(make_source("toy", tmp_path)) == 1
    source = build_scene_source(resolve({"data": {"kind": "toy", "root": str(tmp_path), "cache": False}}))
    assert source.scene_name(0) == "scene" and source.load_views(0, [2]).image_size == (64, 64)
    with pytest.raises(SceneError, match=r"looked for transforms\.json, .*, cameras\.toy; the folder contains"):
        load_scene(tmp_path)
    with pytest.raises(
        ConfigError, match=r"unknown data\.kind 'toys'; expected room, object, captures or one of \[.*'toy'\]"
    ):
        build_scene_source(resolve({"data": {"kind": "toys", "root": str(tmp_path)}}))


def test_docs_list_every_loader():
    """The ``data.kind`` row of docs/data.md and its list of source kinds name exactly the registry's kinds."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `data.kind` |"))
    assert set(re.findall(r"`([a-z0-9]+)`", row)) - {"room", "object", "captures"} == set(LOADERS)
    kinds = re.search(r"Kinds: (.*?) \(a folder of scene folders", text, re.S).group(1)
    assert set(re.findall(r"`([a-z0-9]+)`", kinds)) == set(LOADERS)


def test_colmap_image_name_too_long_for_the_file_system_is_a_missing_frame(tmp_path, caplog):
    """A NAME no file system holds (here 400 characters) is a listed frame without an image file."""
    K, E, _ = truth(V)
    write_colmap(tmp_path, K, E, view_images(V))
    images_txt = tmp_path / "sparse/0/images.txt"
    images_txt.write_text(images_txt.read_text().replace("img_00.png", "a" * 400 + ".png"))
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path)
    assert scene.num_views == V - 1
    assert f"{images_txt}: 1 of {V} listed frames have no image file and are skipped" in caplog.text
