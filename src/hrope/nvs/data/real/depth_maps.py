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
centre-cropped exactly like it. Depth is in the capture's units here;
:func:`hrope.nvs.data.normalize_scene` rescales it with the cameras. A map that cannot be read
raises :class:`SceneError` naming the file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from ....geometry import pixel_rays
from ...config.fields import one_line
from ...config.schema import DEPTH_SOURCES, DataSettings
from ..scene import Scene, SceneError
from ..transforms import resize_crop
from .colmap_points import with_point_depth
from .frames import Frame, _intrinsics, frames_to_scene
from .images import read_image_size
from .undistort import undistort_image

__all__ = ["DEPTH_SOURCES", "PNG_DEPTH_SCALE", "read_depth_map", "read_normal_map", "with_depth_maps", "load_frames"]

PNG_DEPTH_SCALE = DataSettings.depth_scale  # scene units per count of a 16-bit PNG (millimetres -> metres)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I")


def _read_array(path: Path, label: str, what: str) -> tuple[np.ndarray, float]:
    """The array of a ``.npy`` or ``.png`` map and the value that stands for 1 (1 for floats, the
    integer maximum for PNGs); a one-line :class:`SceneError` naming ``path`` otherwise."""
    try:
        if path.suffix.lower() == ".npy":
            array = np.load(path, allow_pickle=False)
            if not isinstance(array, np.ndarray) or array.dtype.kind not in "iuf":
                raise ValueError(f"expected a numeric array, got {getattr(array, 'dtype', type(array).__name__)}")
            return array.astype(np.float32), 1.0
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


def _to_view(x: Tensor, frame: Frame, image_size: tuple[int, int], path: Path) -> Tensor:
    """A map ``(C, h, w)`` of ``frame`` moved like its image: resampled (nearest) to the decoded size,
    undistorted (nearest; 0 where the lens saw nothing), resized + centre-cropped to ``image_size``."""
    h, w = x.shape[-2:]
    native = read_image_size(frame.image, frame.label)
    if abs(h * native[1] - w * native[0]) > max(native):  # more than a pixel of rounding apart
        raise SceneError(
            f"{frame.label}: map {path} is {h}x{w}, its image {native[0]}x{native[1]}: the aspect ratios differ"
        )
    x = F.interpolate(x[None], size=native, mode="nearest-exact")[0] if (h, w) != tuple(native) else x
    if frame.distortion is not None:
        x = undistort_image(x, _intrinsics(frame, native), frame.distortion, mode="nearest")
    out, _ = resize_crop(x[None], torch.eye(3)[None], image_size, mode="nearest")
    return out[0]


def with_depth_maps(scene: Scene, frames: list[Frame], depth_scale: float = PNG_DEPTH_SCALE) -> Scene:
    """``scene`` with ``depth`` (and ``normals`` when every frame has a normal map) read from its
    frames' map files; ``frames`` are its views' frames, in order."""
    depths, normals = [], []
    for frame in frames:
        if frame.depth_map is None:
            raise SceneError(
                f"{frame.label}: data.depth 'maps' needs a depth map per frame (transforms.json "
                "'depth_file_path'); this frame has none"
            )
        depth = _to_view(
            read_depth_map(frame.depth_map, depth_scale, frame.label)[None], frame, scene.image_size, frame.depth_map
        )[0]
        depths.append(torch.where(depth > 0, depth, torch.full_like(depth, float("inf"))))  # 0: outside the lens
        if frame.normal_map is not None:
            normals.append(
                _to_view(read_normal_map(frame.normal_map, frame.label), frame, scene.image_size, frame.normal_map)
            )
    if len(normals) < len(frames):
        return replace(scene, depth=torch.stack(depths))
    stacked = torch.stack(normals)
    rays = pixel_rays(scene.cameras.K.float(), scene.image_size)[0].movedim(-1, 1)  # (V, 3, H, W)
    facing = torch.where((stacked * rays).sum(1, keepdim=True) > 0, -1.0, 1.0)  # towards the camera
    return replace(scene, depth=torch.stack(depths), normals=stacked * facing)


def load_frames(
    frames: list[Frame],
    name: str,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    depth: str = "none",
    depth_scale: float = PNG_DEPTH_SCALE,
    **decoding,
) -> Scene:
    """:func:`hrope.nvs.data.real.frames.frames_to_scene` (``decoding``: its ``cache``, ``workers``) with
    ``depth`` from ``depth`` (:data:`DEPTH_SOURCES`)."""
    if depth not in DEPTH_SOURCES:
        raise SceneError(f"{name}: depth must be one of {', '.join(DEPTH_SOURCES)}, got {depth!r}")
    scene = frames_to_scene(frames, name, image_size, views, **decoding)
    if depth == "none":
        return scene
    chosen = frames if views is None else [frames[int(i)] for i in views]
    return with_point_depth(scene, chosen) if depth == "points" else with_depth_maps(scene, chosen, depth_scale)
