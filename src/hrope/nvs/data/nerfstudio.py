"""nerfstudio / DL3DV / instant-ngp / Blender ``transforms.json`` scenes.

Format: ``frames[i].transform_matrix`` is a 4x4 **camera-to-world** matrix with **OpenGL** camera
axes (x right, y up, z backward). Intrinsics are shared at the top level or given per frame:
``fl_x, fl_y, cx, cy, w, h`` in pixels of a ``(h, w)`` image, or ``camera_angle_x`` (horizontal
field of view in radians; optional ``camera_angle_y``, else square pixels); the principal point
defaults to the centre and ``(h, w)`` to the image file's size. Every size, focal length, principal
point and angle given must be a positive finite number (``w``, ``h`` whole, angles below pi).
Distortion (``k1..k4, p1, p2``) and non-pinhole ``camera_model`` values (fisheye,
equirectangular) are ignored with a warning.

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
from .frames import Frame, frames_to_scene, number_array, pinhole, positive_number
from .scene import Scene, SceneError

__all__ = ["OPENGL_TO_OPENCV", "read_transforms_json", "load_transforms_json"]

logger = logging.getLogger("hrope.nvs.data")

OPENGL_TO_OPENCV = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64))
"""Right-multiplying an OpenGL camera-to-world matrix by this gives the OpenCV one (and back)."""

_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")
_PINHOLE_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE")


def _image_size(path: Path, label: str) -> tuple[int, int]:
    """``(H, W)`` from an image file's header (used when the JSON gives no ``w``/``h``)."""
    try:
        with Image.open(path) as image:
            return image.height, image.width
    except OSError as error:
        raise SceneError(f"{label}: no 'w'/'h' and cannot read image {path}: {error}") from error


def _intrinsics(fields: dict, image: Path, label: str) -> tuple[torch.Tensor, tuple[int, int]]:
    """``(K, (h, w))`` from the merged top-level and per-frame fields, each checked."""
    number = lambda key, **bounds: positive_number(fields[key], label, repr(key), **bounds)  # noqa: E731
    given = {key: number(key, whole=True) for key in ("h", "w") if key in fields}
    size = (given["h"], given["w"]) if len(given) == 2 else _image_size(image, label)
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
        if not isinstance(entry["file_path"], str) or not entry["file_path"]:
            raise SceneError(f"{label}: field 'file_path' must be a non-empty string, "
                             f"got {type(entry['file_path']).__name__}")
        fields = {**shared, **entry}
        image = _image_path(path.parent, entry["file_path"])
        K, size = _intrinsics(fields, image, label)
        distorted |= fields.get("camera_model", "OPENCV") not in _PINHOLE_MODELS
        distorted |= any(bool((number_array(fields[key], label, repr(key)) != 0).any())
                         for key in _DISTORTION if fields.get(key) is not None)
        c2w = number_array(entry["transform_matrix"], label, "'transform_matrix'")
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
