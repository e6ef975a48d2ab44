"""Per-view maps a capture may ship beside its images: object masks and monocular priors.

They are read only on request (``masks=True``, ``priors=True`` of
:func:`hrope.nvs.data.real.loaders.load_scene` and :class:`hrope.nvs.data.real.source.SceneSource`)
by :func:`with_view_maps`:

- **Object masks** (``Frame.mask``: LLFF ``masks_N/`` beside ``images_N/``, IDR / NeuS ``mask/``):
  any image file :func:`hrope.nvs.data.real.images.read_image` decodes; the brightest channel
  (alpha composited over black) is the fraction of the pixel the object covers, so 0/255 masks
  read as 0/1. They become ``Scene.masks (V, H, W)``, resampled bilinearly like the image (edges
  become coverage in between); :meth:`hrope.nvs.data.Scene.composite` puts the object over a plain
  background with them. A mask with no pixel above 1/2 (a mask of nothing) is an error.
- **Monocular priors** (MonoSDF's ``*_depth.npy`` and ``*_normal.npy``, Omnidata predictions).
  Depth ``(H, W)``: **relative**, known up to an unknown per-view scale and shift, so it becomes
  ``Scene.relative_depth`` (NaN where the file holds 0, a negative or a non-finite value) and never
  ``Scene.depth``, which planes and scene normalisation read as metric. Normals ``(3, H, W)`` or
  ``(H, W, 3)``, stored as ``(n + 1) / 2`` in [0, 1] (MonoSDF's encoding; other values are an
  error), in the OpenCV camera frame (x right, y down, z forward; checked on DTU scan24, where
  they face the camera), decoded to unit vectors (zero where the length is below 1e-6), turned
  to face the camera like every normal map (:func:`facing_camera`), become ``Scene.normals``.

Every mask and prior must have its image's exact size (one made for another resolution is an
error naming the file); it is then undistorted with the image and resized + centre-cropped like it
(:func:`map_to_view`). ``.npy`` files are read with ``allow_pickle=False``: a pickle never runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ....geometry import pixel_rays
from ...config.fields import one_line
from ..scene import Scene, SceneError
from ..transforms import resize_crop
from .frames import Frame, _intrinsics
from .images import read_image, read_image_size
from .undistort import undistort_image

__all__ = [
    "read_numeric_npy",
    "read_mask",
    "read_depth_prior",
    "read_normal_prior",
    "map_to_view",
    "facing_camera",
    "with_view_maps",
]

_NORMAL_RANGE_TOLERANCE = 1e-4  # (n + 1) / 2 written from float32 unit vectors may exceed [0, 1] by rounding


def read_numeric_npy(path: Path, label: str, what: str) -> np.ndarray:
    """The numeric array of a ``.npy`` file (``allow_pickle=False``); a one-line :class:`SceneError`
    naming ``label``, ``what`` and ``path`` for anything else (a pickle, an object array, an ``.npz``
    archive, a truncated file)."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.ndarray):
            loaded.close()
            raise ValueError("an .npz archive of several arrays, expected one .npy array")
        if loaded.dtype.kind not in "iuf":
            raise ValueError(f"expected a numeric array, got {loaded.dtype}")
        return loaded
    except (OSError, ValueError, EOFError, MemoryError) as error:
        raise SceneError(f"{label}: cannot read {what} {path}: {one_line(error)}") from error


def read_mask(path: Path, label: str = "") -> Tensor:
    """Object coverage ``(H, W)`` float32 in [0, 1] of a mask image (module doc)."""
    mask = read_image(path, f"{label} mask", background=(0.0, 0.0, 0.0)).amax(0)
    if not (mask > 0.5).any():
        raise SceneError(f"{label}: mask {path} has no object pixel (none above 1/2): a mask of nothing")
    return mask


def read_depth_prior(path: Path, label: str = "") -> Tensor:
    """Relative depth ``(H, W)`` float32 of a depth prior file, NaN where it holds none (module doc)."""
    array = read_numeric_npy(path, label, "depth prior").astype(np.float32).squeeze()
    if array.ndim != 2:
        raise SceneError(f"{label}: depth prior {path} must be (H, W), got shape {array.shape}")
    depth = torch.from_numpy(array)
    valid = torch.isfinite(depth) & (depth > 0)
    if not valid.any():
        raise SceneError(f"{label}: depth prior {path} has no positive finite value")
    return torch.where(valid, depth, torch.full_like(depth, float("nan")))


def read_normal_prior(path: Path, label: str = "") -> Tensor:
    """Unit camera-frame normals ``(3, H, W)`` float32 of a normal prior file holding ``(n + 1) / 2``;
    zero where the decoded vector is shorter than 1e-6 or not finite (module doc)."""
    array = read_numeric_npy(path, label, "normal prior").astype(np.float32)
    if array.ndim != 3 or 3 not in (array.shape[0], array.shape[-1]):
        raise SceneError(f"{label}: normal prior {path} must be (3, H, W) or (H, W, 3), got shape {array.shape}")
    encoded = torch.from_numpy(array if array.shape[0] == 3 and array.shape[-1] != 3 else array.transpose(2, 0, 1))
    finite = encoded[torch.isfinite(encoded)]
    low, high = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 0.0)
    if low < -_NORMAL_RANGE_TOLERANCE or high > 1 + _NORMAL_RANGE_TOLERANCE:
        raise SceneError(
            f"{label}: normal prior {path} holds values in [{low:.3g}, {high:.3g}]; expected (n + 1) / 2 in "
            "[0, 1] (MonoSDF's encoding)"
        )
    normals = encoded * 2 - 1
    length = normals.norm(dim=0, keepdim=True)
    good = torch.isfinite(length) & (length > 1e-6)
    return torch.where(good, normals / torch.where(good, length, torch.ones_like(length)), torch.zeros_like(normals))


def map_to_view(
    x: Tensor, frame: Frame, image_size: tuple[int, int], path: Path, *, mode: str = "nearest", exact: bool = False
) -> Tensor:
    """A map ``(C, h, w)`` of ``frame`` moved like its image: resampled (nearest) to the decoded size
    (``exact``: it must have that size already), undistorted, resized + centre-cropped to
    ``image_size``; ``mode`` "nearest" (geometry) or "bilinear" (masks). 0 where the lens saw nothing."""
    h, w = x.shape[-2:]
    native = read_image_size(frame.image, frame.label)
    if exact and (h, w) != tuple(native):
        raise SceneError(
            f"{frame.label}: map {path} is {h}x{w}, its image {native[0]}x{native[1]}; it must have its image's size"
        )
    if abs(h * native[1] - w * native[0]) > max(native):  # more than a pixel of rounding apart
        raise SceneError(
            f"{frame.label}: map {path} is {h}x{w}, its image {native[0]}x{native[1]}: the aspect ratios differ"
        )
    x = F.interpolate(x[None], size=native, mode="nearest-exact")[0] if (h, w) != tuple(native) else x
    if frame.distortion is not None:
        x = undistort_image(x, _intrinsics(frame, native), frame.distortion, mode=mode)
    out, _ = resize_crop(x[None], torch.eye(3)[None], image_size, mode=mode)
    return out[0]


def facing_camera(normals: Tensor, K: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Camera-frame normals ``(V, 3, H, W)`` of views with intrinsics ``K (V, 3, 3)``, each turned
    to face the camera (against the ray through its pixel)."""
    rays = pixel_rays(K[None].float(), image_size)[0].movedim(-1, 1)  # (V, 3, H, W)
    return normals * torch.where((normals * rays).sum(1, keepdim=True) > 0, -1.0, 1.0)


def _every_frame(frames: list[Frame], field: str, what: str, option: str) -> list[Path] | None:
    """The ``field`` files of every frame; None when no frame has one; an error when only some do."""
    paths = [getattr(frame, field) for frame in frames]
    if all(path is None for path in paths):
        return None
    missing = next((frame for frame, path in zip(frames, paths) if path is None), None)
    if missing is not None:
        raise SceneError(f"{missing.label}: {option} needs {what} for every frame; this frame has none")
    return paths


def _views(frames: list[Frame], paths: list[Path], read, size: tuple[int, int], mode: str = "nearest") -> Tensor:
    """``(V, C, H, W)``: each frame's map ``read(path, label) -> (C, h, w)`` moved to its view."""
    return torch.stack(
        [
            map_to_view(read(path, frame.label), frame, size, path, mode=mode, exact=True)
            for frame, path in zip(frames, paths)
        ]
    )


def with_view_maps(scene: Scene, frames: list[Frame], *, masks: bool = False, priors: bool = False) -> Scene:
    """``scene`` with ``masks`` (``masks=True``) and the monocular priors ``relative_depth`` and
    ``normals`` (``priors=True``) read from its frames' files (module doc); ``frames`` are its views'
    frames, in order. A :class:`SceneError` when a requested map is missing."""
    size = scene.image_size
    if masks:
        paths = _every_frame(frames, "mask", "an object mask", "masks=True")
        if paths is None:
            raise SceneError(f"{scene.name}: masks=True needs object masks (masks_N/ beside images_N/, or mask/)")
        coverage = _views(frames, paths, lambda path, label: read_mask(path, label)[None], size, "bilinear")
        scene = replace(scene, masks=coverage[:, 0].clamp(0, 1))
    if priors:
        depth = _every_frame(frames, "depth_prior", "a depth prior", "priors=True")
        normal = _every_frame(frames, "normal_prior", "a normal prior", "priors=True")
        if depth is None and normal is None:
            raise SceneError(f"{scene.name}: priors=True needs monocular priors (MonoSDF *_depth.npy, *_normal.npy)")
        if depth is not None:
            relative = _views(frames, depth, lambda path, label: read_depth_prior(path, label)[None], size)
            scene = replace(scene, relative_depth=relative[:, 0])
        if normal is not None:
            normals = _views(frames, normal, read_normal_prior, size)
            scene = replace(scene, normals=facing_camera(normals, scene.cameras.K[0], size))
    return scene
