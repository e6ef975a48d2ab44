"""nerfstudio / DL3DV / instant-ngp / Blender ``transforms.json`` scenes.

Format: ``frames[i].transform_matrix`` is a 4x4 **camera-to-world** matrix with **OpenGL** camera
axes (x right, y up, z backward). Intrinsics are shared at the top level or given per frame:
``fl_x, fl_y, cx, cy, w, h`` in pixels of a ``(h, w)`` image, or ``camera_angle_x`` (horizontal
field of view in radians; optional ``camera_angle_y``, else square pixels); the principal point
defaults to the centre and ``(h, w)`` to the image file's size. Every size, focal length, principal
point and angle given must be a positive finite number (``w``, ``h`` whole, angles below pi).

Lens (top level or per frame): ``camera_model`` (default ``OPENCV``) is one of the perspective
models ``OPENCV``, ``PINHOLE``, ``SIMPLE_PINHOLE``, ``SIMPLE_RADIAL``, ``RADIAL`` with distortion
``k1, k2, k3, p1, p2`` (OpenCV's meaning; nerfstudio's ``k4``, an r⁸ term, must be 0), or
``OPENCV_FISHEYE`` (also instant-ngp's ``is_fisheye: true``) with ``k1..k4`` (equidistant; ``p1``,
``p2`` must be 0); every coefficient given must be a finite number. Other models
(equirectangular, ...) are an error. The images are undistorted to pinhole
(:mod:`hrope.nvs.data.real.undistort`).

``transform_matrix`` is 4x4 with the bottom row ``[0, 0, 0, 1]`` (a 3x4 matrix gets that row) and a
proper rotation (checked with the camera). Conversion: ``cam_to_world_cv = transform_matrix @
diag(1, -1, -1, 1)`` (flip y and z) and ``world_to_cam = inverse(cam_to_world_cv)``.
``file_path`` is relative to the JSON's folder; a path without extension (Blender synthetic) gets
``.png``. With ``image_factor`` N, ``images/NAME`` is read from ``images_N/NAME``; without one, when
``images/NAME`` is missing, the smallest downsampled ``images_N/NAME`` that exists (nerfstudio,
DL3DV) is read; K is rescaled from ``(h, w)`` to the decoded size. Frames whose image file is
absent are skipped with one warning that counts them (the instant-ngp sample scenes list frames
they do not ship).
"""

from __future__ import annotations

import json
import math
import reprlib
from pathlib import Path

import torch

from ....geometry import invert_se3
from ..scene import Scene, SceneError
from .frames import (
    Frame,
    frames_to_scene,
    image_file_exists,
    image_folder,
    image_folders,
    number_array,
    pinhole,
    positive_number,
    report_missing,
)
from .images import read_image_size
from .undistort import Distortion, finite_number, make_distortion

__all__ = ["OPENGL_TO_OPENCV", "read_transforms_json", "load_transforms_json"]

OPENGL_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64))
"""Right-multiplying an OpenGL camera-to-world matrix by this gives the OpenCV one (and back)."""

_BOTTOM_ROW = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")
_CAMERA_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV_FISHEYE")


def _intrinsics(fields: dict, image: Path, label: str) -> tuple[torch.Tensor, tuple[int, int]]:
    """``(K, (h, w))`` from the merged top-level and per-frame fields, each checked."""

    def number(key: str, below: float = math.inf) -> float:
        return positive_number(fields[key], label, repr(key), below=below)

    given = {key: positive_number(fields[key], label, repr(key), whole=True) for key in ("h", "w") if key in fields}
    size = (given["h"], given["w"]) if len(given) == 2 else read_image_size(image, f"{label} (no 'w'/'h')")
    if "fl_x" in fields:
        fx = number("fl_x")
        fy = number("fl_y") if "fl_y" in fields else fx
    elif "camera_angle_x" in fields:
        fx = fy = 0.5 * size[1] / math.tan(0.5 * number("camera_angle_x", below=math.pi))
        if "camera_angle_y" in fields:
            fy = 0.5 * size[0] / math.tan(0.5 * number("camera_angle_y", below=math.pi))
    else:
        raise SceneError(f"{label}: no focal length (expected 'fl_x' or 'camera_angle_x')")
    cx = number("cx") if "cx" in fields else size[1] / 2
    cy = number("cy") if "cy" in fields else size[0] / 2
    return pinhole(fx, fy, cx, cy), size


def _distortion(fields: dict, label: str) -> Distortion | None:
    """The lens model of a frame's merged fields (module doc)."""
    model = fields.get("camera_model", "OPENCV")
    if model not in _CAMERA_MODELS:
        raise SceneError(
            f"{label}: field 'camera_model' must be one of {', '.join(_CAMERA_MODELS)}, got {reprlib.repr(model)}"
        )
    values = {key: finite_number(fields[key], label, repr(key)) for key in _DISTORTION if fields.get(key) is not None}
    fisheye = model == "OPENCV_FISHEYE" or fields.get("is_fisheye") is True
    name = "OPENCV_FISHEYE" if fisheye else model
    unsupported, reason = (
        (("p1", "p2"), "the equidistant model has no tangential terms")
        if fisheye
        else (("k4",), "nerfstudio's r^8 term, which OpenCV's model has not")
    )
    if any(values.get(key) for key in unsupported):
        raise SceneError(
            f"{label}: field {' and '.join(map(repr, unsupported))} must be 0 for camera_model {name} "
            f"({reason}), got {[values.get(key, 0.0) for key in unsupported]}"
        )
    values = {key: value for key, value in values.items() if key not in unsupported}
    return make_distortion("fisheye" if fisheye else "opencv", values, name, label)


def _image_path(folder: Path, file_path: str, image_factor: int | None, label: str) -> Path:
    """``folder / file_path`` (``.png`` added to a path without extension), ``images/NAME`` taken
    from ``images_{image_factor}/``, or without a factor, when missing, from the smallest
    ``images_N/`` holding it."""
    path = folder / file_path
    if path.suffix == "" and not path.exists():
        path = path.with_suffix(".png")
    parts = Path(file_path).parts
    under_images = len(parts) > 1 and parts[0] == "images"
    if image_factor not in (None, 1):
        if not under_images:
            raise SceneError(
                f"{label}: image_factor {image_factor} needs a field 'file_path' under images/, got {file_path!r}"
            )
        return folder / f"images_{image_factor}" / Path(*parts[1:])
    if image_factor is None and under_images and not path.is_file():
        for _, downsampled in sorted(image_folders(folder).items()):
            if (downsampled / Path(*parts[1:])).is_file():
                return downsampled / Path(*parts[1:])
    return path


def read_transforms_json(path: str | Path, image_factor: int | None = None) -> list[Frame]:
    """Frames of a ``transforms.json`` file, converted to OpenCV world-to-camera (module doc)."""
    path = Path(path)
    if image_factor is not None:
        image_folder(path.parent, image_factor)  # an error naming the folders present when it is missing
    try:
        text = path.read_text()
        meta = json.loads(text) if text.strip() else None
    except (OSError, ValueError) as error:
        raise SceneError(f"{path}: cannot read JSON: {error}") from error
    if meta is None and not text.strip():
        raise SceneError(f"{path}: the file is empty; expected a JSON object with a list 'frames'")
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise SceneError(f"{path}: field 'frames' must be a list")
    shared = {k: v for k, v in meta.items() if k != "frames"}
    frames, missing = [], []
    for i, entry in enumerate(meta["frames"]):
        label = f"{path} frames[{i}]"
        if not isinstance(entry, dict) or "file_path" not in entry or "transform_matrix" not in entry:
            raise SceneError(f"{label}: needs 'file_path' and 'transform_matrix'")
        if not isinstance(entry["file_path"], str) or not entry["file_path"]:
            raise SceneError(
                f"{label}: field 'file_path' must be a non-empty string, got {type(entry['file_path']).__name__}"
            )
        fields = {**shared, **entry}
        image = _image_path(path.parent, entry["file_path"], image_factor, label)
        if not image_file_exists(image):
            missing.append(image)
            continue
        K, size = _intrinsics(fields, image, label)
        distortion = _distortion(fields, label)
        c2w = number_array(entry["transform_matrix"], label, "'transform_matrix'")
        if c2w.shape == (3, 4):
            c2w = torch.cat([c2w, _BOTTOM_ROW[None]])
        if c2w.shape != (4, 4):
            raise SceneError(f"{label}: field 'transform_matrix' must be 4x4, got {tuple(c2w.shape)}")
        if (c2w[3] - _BOTTOM_ROW).abs().max() > 1e-6:
            raise SceneError(
                f"{label}: field 'transform_matrix' must end in the row [0, 0, 0, 1], got {c2w[3].tolist()}"
            )
        world_to_cam = invert_se3(c2w @ OPENGL_TO_OPENCV)
        maps = [entry.get(key) for key in ("depth_file_path", "normal_file_path")]  # read on request (data.depth)
        if any(m is not None and not (isinstance(m, str) and m) for m in maps):
            raise SceneError(f"{label}: fields 'depth_file_path' and 'normal_file_path' must be non-empty strings")
        depth_map, normal_map = (m and path.parent / m for m in maps)
        frames.append(Frame(image, K, world_to_cam, size, label, depth_map, normal_map, distortion=distortion))
    report_missing(str(path), missing, len(meta["frames"]))
    return frames


def load_transforms_json(
    path: str | Path,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    image_factor: int | None = None,
) -> Scene:
    """A :class:`Scene` from a ``transforms.json`` file or the folder holding it.

    ``views`` selects frames (in the file's order, after missing ones are skipped) before any image
    is decoded.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "transforms.json"
    return frames_to_scene(read_transforms_json(path, image_factor), path.parent.name, image_size, views)
