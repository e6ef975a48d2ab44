"""Depth for real scenes (``data.depth``): depth and normal maps on disk, or COLMAP's 3D points.

:func:`load_frames` decodes frames like :func:`hrope.nvs.data.real.frames.frames_to_scene` and adds
``Scene.depth`` (and ``Scene.normals``) from one of :data:`DEPTH_SOURCES`:

- ``none``: no depth (nothing extra is read).
- ``points``: sparse depth of the COLMAP model's 3D points (:mod:`hrope.nvs.data.real.colmap_points`).
- ``maps``: one depth map per frame (nerfstudio ``depth_file_path``), z-depth in the poses' units:
  ``.npy`` float arrays ``(H, W)`` as they are, 16-bit PNGs times ``depth_scale`` (default
  :data:`PNG_DEPTH_SCALE`: millimetres to metres, nerfstudio's convention); 0, NaN and inf mean
  no depth, a negative value is an error. Optional normal maps (``normal_file_path``), unit
  normals in the OpenCV camera frame (x right, y down, z forward): ``.npy`` ``(H, W, 3)`` floats, or
  8/16-bit RGB PNGs holding ``(n + 1) / 2``; they are turned to face the camera, and kept only when
  every frame has one.

Maps are read at their own size, resampled (nearest) to the size of the decoded image (same aspect
ratio required), undistorted like the image (nearest) when its lens is, then resized +
centre-cropped exactly like it (:func:`hrope.nvs.data.real.view_maps.map_to_view`). Depth is in the
capture's units here; :func:`hrope.nvs.data.normalize_scene` rescales it with the cameras. A map
that cannot be read raises :class:`SceneError` naming the file. A capture's relative depth priors
(MonoSDF) are never read as depth: :func:`load_frames` reads them with ``priors=True``
(:mod:`hrope.nvs.data.real.view_maps`), with the object masks (``masks=True``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ...config.fields import one_line
from ...config.schema import DEPTH_SOURCES, DataSettings
from ..scene import Scene, SceneError
from .colmap_points import with_point_depth
from .frames import Frame, frames_to_scene
from .view_maps import facing_camera, map_to_view, read_numeric_npy, with_view_maps

__all__ = ["DEPTH_SOURCES", "PNG_DEPTH_SCALE", "read_depth_map", "read_normal_map", "with_depth_maps", "load_frames"]

PNG_DEPTH_SCALE = DataSettings.depth_scale  # scene units per count of a 16-bit PNG (millimetres -> metres)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I")


def _read_array(path: Path, label: str, what: str) -> tuple[np.ndarray, float]:
    """The array of a ``.npy`` or ``.png`` map and the value that stands for 1 (1 for floats, the
    integer maximum for PNGs); a one-line :class:`SceneError` naming ``path`` otherwise."""
    if path.suffix.lower() == ".npy":
        return read_numeric_npy(path, label, what).astype(np.float32), 1.0
    try:
        if path.suffix.lower() != ".png":
            raise ValueError("expected a .npy or .png file")
        with Image.open(path) as image:
            mode = image.mode
            array = np.asarray(image)
        return array.astype(np.float32), 65535.0 if mode in _SIXTEEN_BIT or array.dtype == np.uint16 else 255.0
    except (OSError, ValueError, EOFError, Image.DecompressionBombError) as error:
        raise SceneError(f"{label}: cannot read {what} {path}: {one_line(error)}") from error


def read_depth_map(path: str | Path, depth_scale: float = PNG_DEPTH_SCALE, label: str = "") -> Tensor:
    """z-depth ``(H, W)`` float32 of a depth map file (module doc), ``inf`` where there is none."""
    path = Path(path)
    array, unit = _read_array(path, label, "depth map")
    if path.suffix.lower() == ".png":
        if unit != 65535.0 or array.ndim != 2:
            raise SceneError(
                f"{label}: depth map {path} must be a single-channel 16-bit PNG, got shape "
                f"{array.shape} of {'8' if unit == 255.0 else '16'}-bit values"
            )
        array = array * depth_scale
    array = array.squeeze()
    if array.ndim != 2:
        raise SceneError(f"{label}: depth map {path} must be (H, W), got shape {array.shape}")
    if (array < 0).any():
        raise SceneError(
            f"{label}: depth map {path} has negative values (min {float(np.nanmin(array)):g}); "
            "expected z-depth >= 0 (0 = no depth)"
        )
    depth = torch.from_numpy(array)
    return torch.where(torch.isfinite(depth) & (depth > 0), depth, torch.full_like(depth, float("inf")))


def read_normal_map(path: str | Path, label: str = "") -> Tensor:
    """Unit camera-frame normals ``(3, H, W)`` float32 of a normal map file (module doc), 0 where invalid."""
    path = Path(path)
    array, unit = _read_array(path, label, "normal map")
    if path.suffix.lower() == ".png":
        array = array[..., :3] / unit * 2 - 1 if array.ndim == 3 else array
    if array.ndim != 3 or 3 not in (array.shape[0], array.shape[-1]):
        raise SceneError(f"{label}: normal map {path} must be (H, W, 3) or RGB, got shape {array.shape}")
    normals = torch.from_numpy(np.ascontiguousarray(array))
    normals = normals if normals.shape[0] == 3 and normals.shape[-1] != 3 else normals.permute(2, 0, 1)
    length = normals.norm(dim=0, keepdim=True)
    good = torch.isfinite(length) & (length > 1e-6)
    return torch.where(good, normals / torch.where(good, length, torch.ones_like(length)), torch.zeros_like(normals))


def with_depth_maps(scene: Scene, frames: list[Frame], depth_scale: float = PNG_DEPTH_SCALE) -> Scene:
    """``scene`` with ``depth`` (and ``normals`` when every frame has a normal map) read from its
    frames' map files; ``frames`` are its views' frames, in order."""
    depths, normals = [], []
    for frame in frames:
        if frame.depth_map is None:
            relative = "" if frame.depth_prior is None else " (its depth prior is relative: read it with priors=True)"
            raise SceneError(
                f"{frame.label}: data.depth 'maps' needs a depth map per frame (transforms.json "
                f"'depth_file_path'); this frame has none{relative}"
            )
        depth = map_to_view(
            read_depth_map(frame.depth_map, depth_scale, frame.label)[None], frame, scene.image_size, frame.depth_map
        )[0]
        depths.append(torch.where(depth > 0, depth, torch.full_like(depth, float("inf"))))  # 0: outside the lens
        if frame.normal_map is not None:
            normals.append(
                map_to_view(read_normal_map(frame.normal_map, frame.label), frame, scene.image_size, frame.normal_map)
            )
    if len(normals) < len(frames):
        return replace(scene, depth=torch.stack(depths))
    normals_facing = facing_camera(torch.stack(normals), scene.cameras.K[0], scene.image_size)
    return replace(scene, depth=torch.stack(depths), normals=normals_facing)


def load_frames(
    frames: list[Frame],
    name: str,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    depth: str = "none",
    depth_scale: float = PNG_DEPTH_SCALE,
    *,
    masks: bool = False,
    priors: bool = False,
    **decoding,
) -> Scene:
    """:func:`hrope.nvs.data.real.frames.frames_to_scene` (``decoding``: its ``cache``, ``workers``) with
    ``depth`` from ``depth`` (:data:`DEPTH_SOURCES`), and the frames' object masks (``masks``) and
    monocular priors (``priors``; :func:`hrope.nvs.data.real.view_maps.with_view_maps`)."""
    if depth not in DEPTH_SOURCES:
        raise SceneError(f"{name}: depth must be one of {', '.join(DEPTH_SOURCES)}, got {depth!r}")
    scene = frames_to_scene(frames, name, image_size, views, **decoding)
    chosen = frames if views is None else [frames[int(i)] for i in views]
    if depth != "none":
        scene = with_point_depth(scene, chosen) if depth == "points" else with_depth_maps(scene, chosen, depth_scale)
    return with_view_maps(scene, chosen, masks=masks, priors=priors) if masks or priors else scene
