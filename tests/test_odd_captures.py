"""Poses and cameras as captures have them: non-finite or non-rigid poses, repeated frames,
unsupported camera models, cameras that see nothing of the scene."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from hrope.cameras import Cameras
from hrope.nvs.data.normalize import normalize_scene
from hrope.nvs.data.real.colmap import _MODELS
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.data.scene import Scene, SceneError
from test_loaders import V, assert_reprojects, points_in_front, project_cv, truth, view_images, write_colmap
from test_loaders import write_nerfstudio


def nerfstudio_scene(folder, seed=11):
    K, E, _ = truth(seed)
    K[:] = K[0]
    write_nerfstudio(folder, K, E, view_images(seed))
    return K, E


def edit_frames(folder, edit) -> None:
    path = folder / "transforms.json"
    meta = json.loads(path.read_text())
    edit(meta["frames"])
    path.write_text(json.dumps(meta))


def scale_rotation(frames, factor=2.0):
    for row in frames[2]["transform_matrix"][:3]:
        row[:3] = [factor * x for x in row[:3]]


def reflect(frames):
    for row in frames[2]["transform_matrix"][:3]:
        row[0] = -row[0]


POSES = {
    "NaN": (lambda frames: frames[2]["transform_matrix"][0].__setitem__(0, math.nan), r"non-finite entry"),
    "beyond float32": (lambda frames: frames[2]["transform_matrix"][1].__setitem__(3, 1e39), r"non-finite entry"),
    "scaled": (scale_rotation, r"is not a rotation: \|R\^T R - I\| = 3, det R = 8 \(tolerance 0\.001\)"),
    "sheared": (lambda frames: frames[2]["transform_matrix"][0].__setitem__(1, 0.5), r"is not a rotation"),
    "reflected": (reflect, r"has a reflection \(det R = -1\); a proper rotation"),
    "bottom row": (
        lambda frames: frames[2]["transform_matrix"].__setitem__(3, [0, 0, 1, 1]),
        r"field 'transform_matrix' must end in the row \[0, 0, 0, 1\], got \[0\.0, 0\.0, 1\.0, 1\.0\]",
    ),
}


@pytest.mark.parametrize("case", POSES)
def test_non_finite_or_non_rigid_poses_name_the_frame(tmp_path, case):
    edit, message = POSES[case]
    nerfstudio_scene(tmp_path)
    edit_frames(tmp_path, edit)
    with pytest.raises(SceneError, match=r"transforms\.json frames\[2\]: .*" + message) as error:
        load_scene(tmp_path)
    assert "[b=0, v=0]" not in str(error.value) and "\n" not in str(error.value)


def test_a_repeated_frame_is_left_out_with_a_warning(tmp_path, caplog):
    K, E = nerfstudio_scene(tmp_path)
    edit_frames(tmp_path, lambda frames: frames.insert(3, dict(frames[1])))
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path)
    assert scene.num_views == V
    assert "1 frame(s) repeat an earlier frame's image and camera and are left out (first: " in caplog.text
    assert "frames[3]" in caplog.text
    X = points_in_front(E, 11)
    assert_reprojects(scene, project_cv(K, E, X), X)


def test_one_image_listed_with_two_cameras_is_an_error(tmp_path):
    nerfstudio_scene(tmp_path)

    def moved_copy(frames):
        copy = json.loads(json.dumps(frames[1]))
        copy["transform_matrix"][0][3] += 0.5
        frames.append(copy)

    edit_frames(tmp_path, moved_copy)
    with pytest.raises(
        SceneError,
        match=r"frames\[4\]: lists image .*frame_00001\.png again \(first in .*frames\[1\]\) with another camera",
    ):
        load_scene(tmp_path)


def test_colmap_image_ids_repeating_a_name_are_left_out(tmp_path, caplog):
    K, E, _ = truth(12)
    write_colmap(tmp_path, K, E, view_images(12), models=("PINHOLE",) * V)
    images = tmp_path / "sparse/0/images.txt"
    lines = images.read_text().splitlines()
    first = next(line for line in lines if line.endswith("img_00.png"))
    lines = [line.replace("Number of images: 4", "Number of images: 5") for line in lines]
    images.write_text("\n".join([*lines, "99" + first[1:], ""]))
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        assert load_scene(tmp_path).num_views == V
    assert "1 frame(s) repeat an earlier frame's image and camera" in caplog.text


@pytest.mark.parametrize("model", ["FOV", "THIN_PRISM_FISHEYE", "PINHOLE_X", "pinhole"])
def test_an_unsupported_colmap_model_names_it_and_lists_the_supported(tmp_path, model):
    K, E, _ = truth(13)
    write_colmap(tmp_path, K, E, view_images(13), models=("PINHOLE",) * V)
    cameras = tmp_path / "sparse/0/cameras.txt"
    cameras.write_text(cameras.read_text().replace(" PINHOLE ", f" {model} ", 1))
    with pytest.raises(SceneError) as error:
        load_scene(tmp_path)
    message = str(error.value)
    assert f"cameras.txt:3: camera model {model} is not supported (use one of " in message
    assert all(name in message for name in _MODELS)


@pytest.mark.parametrize("model", ["EQUIRECTANGULAR", "FISHEYE624", 3])
def test_an_unsupported_nerfstudio_model_names_it_and_lists_the_supported(tmp_path, model):
    nerfstudio_scene(tmp_path)
    path = tmp_path / "transforms.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "camera_model": model}))
    with pytest.raises(
        SceneError, match=rf"field 'camera_model' must be one of OPENCV, PINHOLE, .*OPENCV_FISHEYE, got {model!r}"
    ):
        load_scene(tmp_path)


def test_cameras_that_see_nothing_keep_the_normalised_scene_finite():
    """A context camera 1e4 units away facing away from everything, one facing the sky, and depth maps
    that see no point: the normalised cameras, depths and planes stay finite or at infinity."""
    K, E, _ = truth(14)
    E[1, :3, :3] = -E[1, :3, :3] @ torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))  # turned round
    E[1, :3, 3] = torch.tensor([3e3, -2e3, 1e4], dtype=torch.float64)
    E[3, :3, 3] *= 1e-9  # at the world origin
    depth = torch.full((V, 12, 16), math.inf)
    depth[0, 4:8, 4:8] = 2.0
    scene = Scene(torch.rand(V, 3, 12, 16), Cameras(K[None].float(), E[None].float(), (12, 16)), depth=depth)
    for context in ([0, 1], [1, 3], [3]):
        normalised = normalize_scene(scene, context)
        assert torch.isfinite(normalised.cameras.world_to_cam).all()
        torch.testing.assert_close(normalised.cameras.world_to_cam[0, context[0]], torch.eye(4), atol=1e-5, rtol=0)
        assert normalised.depth is not None and not torch.isnan(normalised.depth).any()
        assert torch.isinf(normalised.depth[1:]).all()  # nothing seen stays nothing
        planes = normalised.planes(4)
        assert planes is not None
        m = planes.m(normalised.cameras, (3, 4))
        assert torch.isfinite(m).all() and (m[0, 12:] == 0).all()  # views 1-3: planes at infinity
