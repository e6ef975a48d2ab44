"""COLMAP text models (``cameras.txt`` + ``images.txt``).

``cameras.txt`` lines: ``CAMERA_ID MODEL WIDTH HEIGHT PARAMS...`` with PINHOLE ``fx fy cx cy`` and
SIMPLE_PINHOLE ``f cx cy``; SIMPLE_RADIAL / RADIAL / OPENCV / FULL_OPENCV keep their leading
``f cx cy`` or ``fx fy cx cy`` and their distortion is ignored with a warning.
``images.txt``: two lines per image, ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` then the
2D points (ignored, possibly empty). ``(q, t)`` is already **world-to-camera** with OpenCV axes:
``X_cam = R(q) X_world + t``, ``R(q)`` the rotation of the (normalised) Hamilton quaternion.
COLMAP's pixel convention (centre of the top-left pixel at (0.5, 0.5)) is the project's, so no
shift is applied. Images are ``IMAGE_DIR/NAME``, ordered by NAME.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...geometry import make_se3
from .frames import Frame, frames_to_scene
from .scene import Scene, SceneError

__all__ = ["quaternion_to_rotation", "read_colmap_cameras", "read_colmap_images", "find_colmap_model",
           "read_colmap_frames", "load_colmap"]

logger = logging.getLogger("hrope.nvs.data")

# model -> (number of params, index of fx, index of fy, index of cx) ; cy follows cx
_MODELS = {
    "SIMPLE_PINHOLE": (3, 0, 0, 1), "PINHOLE": (4, 0, 1, 2),
    "SIMPLE_RADIAL": (4, 0, 0, 1), "RADIAL": (5, 0, 0, 1),
    "OPENCV": (8, 0, 1, 2), "FULL_OPENCV": (12, 0, 1, 2),
}
_PINHOLE = {"SIMPLE_PINHOLE", "PINHOLE"}


def quaternion_to_rotation(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``(..., 3, 3)`` of quaternions ``(..., 4)`` ordered ``(w, x, y, z)``."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ]
    return torch.stack([torch.stack(row, -1) for row in rows], -2)


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every non-comment line, blank lines kept."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SceneError(f"{path}: cannot read: {error}") from error
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if not line.startswith("#")]


def _floats(tokens: list[str], where: str, field: str) -> list[float]:
    try:
        return [float(token) for token in tokens]
    except ValueError as error:
        raise SceneError(f"{where}: field {field} is not numeric: {' '.join(tokens)!r}") from error


def read_colmap_cameras(path: str | Path) -> dict[int, tuple[torch.Tensor, tuple[int, int]]]:
    """``camera_id -> (K (3, 3) float64 pixels, (H, W))`` from ``cameras.txt``."""
    path, cameras, warned = Path(path), {}, set()
    for n, line in _data_lines(path):
        if not line:
            continue
        tokens, where = line.split(), f"{path}:{n}"
        if len(tokens) < 4:
            raise SceneError(f"{where}: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...', got {line!r}")
        model = tokens[1]
        if model not in _MODELS:
            raise SceneError(f"{where}: camera model {model} is not supported (use one of {sorted(_MODELS)})")
        count, ifx, ify, icx = _MODELS[model]
        params = _floats(tokens[4:], where, "PARAMS")
        if len(params) != count:
            raise SceneError(f"{where}: {model} needs {count} PARAMS, got {len(params)}")
        if model not in _PINHOLE and model not in warned:
            warned.add(model)
            logger.warning("%s: %s distortion is ignored (treated as pinhole)", path, model)
        width, height = (int(v) for v in _floats(tokens[2:4], where, "WIDTH/HEIGHT"))
        K = torch.tensor([[params[ifx], 0.0, params[icx]], [0.0, params[ify], params[icx + 1]], [0.0, 0.0, 1.0]],
                         dtype=torch.float64)
        cameras[int(tokens[0])] = (K, (height, width))
    return cameras


def read_colmap_images(path: str | Path) -> list[tuple[str, torch.Tensor, int, str]]:
    """``(name, world_to_cam (4, 4) float64, camera_id, where)`` per image of ``images.txt``, by name."""
    path, images = Path(path), []
    lines = _data_lines(path)
    for k in range(0, len(lines), 2):
        n, line = lines[k]
        if not line:
            continue
        tokens, where = line.split(), f"{path}:{n}"
        if len(tokens) < 10:
            raise SceneError(f"{where}: expected 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME', got {line!r}")
        values = torch.tensor(_floats(tokens[1:8], where, "QW QX QY QZ TX TY TZ"), dtype=torch.float64)
        if values[:4].norm() == 0:
            raise SceneError(f"{where}: field QW QX QY QZ is a zero quaternion")
        world_to_cam = make_se3(quaternion_to_rotation(values[:4]), values[4:])
        images.append((" ".join(tokens[9:]), world_to_cam, int(_floats(tokens[8:9], where, "CAMERA_ID")[0]), where))
    return sorted(images, key=lambda image: image[0])


def find_colmap_model(folder: str | Path) -> Path | None:
    """The folder holding ``cameras.txt`` + ``images.txt``: ``folder``, ``folder/sparse/0`` or
    ``folder/sparse``; None when there is none."""
    folder = Path(folder)
    for candidate in (folder, folder / "sparse" / "0", folder / "sparse"):
        if (candidate / "cameras.txt").is_file() and (candidate / "images.txt").is_file():
            return candidate
    return None


def read_colmap_frames(folder: str | Path, image_dir: str | Path | None = None) -> list[Frame]:
    """Frames of the COLMAP text model in ``folder`` (see :func:`find_colmap_model`), by image name.

    Images are read from ``image_dir`` (default: ``folder/images`` if it exists, else ``folder``).
    """
    folder = Path(folder)
    model = find_colmap_model(folder)
    if model is None:
        raise SceneError(f"{folder}: no COLMAP text model (cameras.txt + images.txt in ., sparse/0 or sparse)")
    if image_dir is None:
        image_dir = folder / "images" if (folder / "images").is_dir() else folder
    cameras = read_colmap_cameras(model / "cameras.txt")
    frames = []
    for name, world_to_cam, camera_id, where in read_colmap_images(model / "images.txt"):
        if camera_id not in cameras:
            raise SceneError(f"{where}: field CAMERA_ID {camera_id} is not in {model / 'cameras.txt'}")
        K, size = cameras[camera_id]
        frames.append(Frame(Path(image_dir) / name, K, world_to_cam, size, where))
    return frames


def load_colmap(folder: str | Path, image_size: tuple[int, int] | None = None, views: list[int] | None = None,
                image_dir: str | Path | None = None) -> Scene:
    """A :class:`Scene` from a COLMAP text model (:func:`read_colmap_frames`)."""
    return frames_to_scene(read_colmap_frames(folder, image_dir), Path(folder).name, image_size, views)
