"""nerfstudio / DL3DV / instant-ngp / Blender ``transforms.json`` scenes.

Format: ``frames[i].transform_matrix`` is a 4x4 **camera-to-world** matrix with **OpenGL** camera
axes (x right, y up, z backward). Intrinsics are shared at the top level or given per frame:
``fl_x, fl_y, cx, cy, w, h`` in pixels of a ``(h, w)`` image, or ``camera_angle_x`` (horizontal
field of view in radians; optional ``camera_angle_y``, else square pixels); the principal point
defaults to the centre and ``(h, w)`` to the image file's size. Distortion (``k1..k4, p1, p2``)
and non-pinhole ``camera_model`` values (fisheye, equirectangular) are ignored with a warning.

Conversion: ``cam_to_world_cv = transform_matrix @ diag(1, -1, -1, 1)`` (flip y and z) and
``world_to_cam = inverse(cam_to_world_cv)``. ``file_path`` is relative to the JSON's folder; a
path without extension (Blender synthetic) gets ``.png``; when ``images/NAME`` is missing, the
downsampled ``images_2|4|8/NAME`` (nerfstudio, DL3DV) is read and K rescaled from ``(h, w)``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
from PIL import Image

from ...geometry import invert_se3
from .frames import Frame, frames_to_scene
from .scene import Scene, SceneError

__all__ = ["OPENGL_TO_OPENCV", "read_transforms_json", "load_transforms_json"]

logger = logging.getLogger("hrope.nvs.data")

OPENGL_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64))
"""Right-multiplying an OpenGL camera-to-world matrix by this gives the OpenCV one (and back)."""

_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")
_PINHOLE_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE")


def _number(entry: dict, key: str, label: str) -> float:
    try:
        return float(entry[key])
    except (TypeError, ValueError) as error:
        raise SceneError(f"{label}: field {key!r} must be a number, got {entry[key]!r}") from error


def _image_size(path: Path, label: str) -> tuple[int, int]:
    """``(H, W)`` from an image file's header (used when the JSON gives no ``w``/``h``)."""
    try:
        with Image.open(path) as image:
            return image.height, image.width
    except OSError as error:
        raise SceneError(f"{label}: no 'w'/'h' and cannot read image {path}: {error}") from error


def _intrinsics(fields: dict, image: Path, label: str) -> tuple[torch.Tensor, tuple[int, int]]:
    """``(K, (h, w))`` from the merged top-level and per-frame fields."""
    if "w" in fields and "h" in fields:
        size = (int(_number(fields, "h", label)), int(_number(fields, "w", label)))
    else:
        size = _image_size(image, label)
    if "fl_x" in fields:
        fx = _number(fields, "fl_x", label)
        fy = _number(fields, "fl_y", label) if "fl_y" in fields else fx
    elif "camera_angle_x" in fields:
        fx = fy = 0.5 * size[1] / math.tan(0.5 * _number(fields, "camera_angle_x", label))
        if "camera_angle_y" in fields:
            fy = 0.5 * size[0] / math.tan(0.5 * _number(fields, "camera_angle_y", label))
    else:
        raise SceneError(f"{label}: no focal length (expected 'fl_x' or 'camera_angle_x')")
    cx = _number(fields, "cx", label) if "cx" in fields else size[1] / 2
    cy = _number(fields, "cy", label) if "cy" in fields else size[0] / 2
    K = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)
    return K, size


def _image_path(folder: Path, file_path: str) -> Path:
    """``folder / file_path``; ``.png`` added to a path without extension; a missing
    ``images/NAME`` falls back to the first existing ``images_2|4|8/NAME`` (downsampled copies)."""
    path = folder / file_path
    if path.suffix == "" and not path.exists():
        path = path.with_suffix(".png")
    parts = Path(file_path).parts
    if not path.exists() and parts and parts[0] == "images":
        for factor in (2, 4, 8):
            candidate = folder / f"images_{factor}" / Path(*parts[1:])
            if candidate.exists():
                return candidate
    return path


def read_transforms_json(path: str | Path) -> list[Frame]:
    """Frames of a ``transforms.json`` file, converted to OpenCV world-to-camera (module doc)."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SceneError(f"{path}: cannot read JSON: {error}") from error
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise SceneError(f"{path}: field 'frames' must be a list")
    shared = {k: v for k, v in meta.items() if k != "frames"}
    frames, distorted = [], False
    for i, entry in enumerate(meta["frames"]):
        label = f"{path} frames[{i}]"
        if not isinstance(entry, dict) or "file_path" not in entry or "transform_matrix" not in entry:
            raise SceneError(f"{label}: needs 'file_path' and 'transform_matrix'")
        fields = {**shared, **entry}
        image = _image_path(path.parent, entry["file_path"])
        K, size = _intrinsics(fields, image, label)
        distorted |= fields.get("camera_model", "OPENCV") not in _PINHOLE_MODELS
        distorted |= any(_number(fields, key, label) != 0 for key in _DISTORTION if fields.get(key) is not None)
        try:
            c2w = torch.tensor(entry["transform_matrix"], dtype=torch.float64)
        except (TypeError, ValueError) as error:
            raise SceneError(f"{label}: field 'transform_matrix' is not numeric: {error}") from error
        if c2w.shape == (3, 4):
            c2w = torch.cat([c2w, torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)])
        if c2w.shape != (4, 4):
            raise SceneError(f"{label}: field 'transform_matrix' must be 4x4, got {tuple(c2w.shape)}")
        world_to_cam = invert_se3(c2w @ OPENGL_TO_OPENCV)
        frames.append(Frame(image, K, world_to_cam, size, label))
    if distorted:
        logger.warning("%s: lens distortion / non-pinhole camera_model ignored (images treated as pinhole)", path)
    return frames


def load_transforms_json(path: str | Path, image_size: tuple[int, int] | None = None,
                         views: list[int] | None = None) -> Scene:
    """A :class:`Scene` from a ``transforms.json`` file or the folder holding it.

    ``views`` selects frames (in the file's order) before any image is decoded.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "transforms.json"
    return frames_to_scene(read_transforms_json(path), path.parent.name, image_size, views)
