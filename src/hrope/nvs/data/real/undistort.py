"""Lens distortion of real captures, and its removal: pinhole images with the same intrinsics.

Models, on normalised camera coordinates ``(x, y) = (X / Z, Y / Z)`` with ``r² = x² + y²``; the
distorted point ``(x_d, y_d)`` is at pixel ``(fx x_d + cx, fy y_d + cy)``:

- ``opencv``, the perspective model of OpenCV and COLMAP:
  ``x_d = x R + 2 p1 x y + p2 (r² + 2 x²)``, ``y_d = y R + p1 (r² + 2 y²) + 2 p2 x y``, with
  ``R = (1 + k1 r² + k2 r⁴ + k3 r⁶) / (1 + k4 r² + k5 r⁴ + k6 r⁶)``. Coefficients are kept in
  OpenCV's order ``(k1, k2, p1, p2, k3, k4, k5, k6)``, the layout of
  ``kornia.geometry.calibration.distort_points``, which evaluates the model. COLMAP's models are
  this one with some coefficients zero: SIMPLE_RADIAL ``f, cx, cy, k`` (k1 = k), RADIAL
  ``f, cx, cy, k1, k2``, OPENCV ``fx, fy, cx, cy, k1, k2, p1, p2``, FULL_OPENCV ``..., k1, k2,
  p1, p2, k3, k4, k5, k6`` (OpenCV's own order). nerfstudio / instant-ngp ``transforms.json``:
  ``k1, k2, k3, p1, p2`` of the same model (their ``k4`` multiplies r⁸ in nerfstudio's
  perspective model, a term OpenCV's has not: refused).
- ``fisheye``, the equidistant model of OpenCV's fisheye module: ``θ = atan(r)``,
  ``θ_d = θ (1 + k1 θ² + k2 θ⁴ + k3 θ⁶ + k4 θ⁸)``, ``(x_d, y_d) = (θ_d / r) (x, y)``; coefficients
  ``(k1, k2, k3, k4)``, evaluated by ``kornia.geometry.camera.distort_points_kannala_brandt``.
  COLMAP OPENCV_FISHEYE (``fx, fy, cx, cy, k1, k2, k3, k4``), RADIAL_FISHEYE (``f, cx, cy, k1,
  k2``), SIMPLE_RADIAL_FISHEYE (``f, cx, cy, k``); nerfstudio ``camera_model: OPENCV_FISHEYE``
  and instant-ngp ``is_fisheye: true`` with ``k1..k4``.

:func:`undistort_image` keeps the intrinsics ``(fx, fy, cx, cy)`` and the image size (the common
choice, as COLMAP's undistorter with its default scale): each pixel of the pinhole image is
sampled (bilinear) at its distorted position in the source image. Pixels whose distorted position
lies outside the source are black: pincushion distortion (``k1 > 0``) blackens the corners,
barrel distortion (``k1 < 0``, most phone and action-camera lenses) instead loses the outer rim
of the source's field of view. Pixel centres are at ``(j + 0.5, i + 0.5)`` (the project's and
COLMAP's convention); kornia's ``undistort_image`` samples integer pixel centres
(``align_corners=True``), so the map is sampled here with ``grid_sample(align_corners=False)``.
"""

from __future__ import annotations

import logging
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from kornia.geometry.calibration import distort_points
from kornia.geometry.camera import distort_points_kannala_brandt
from torch import Tensor

from ..scene import SceneError

__all__ = [
    "COEFFICIENTS",
    "Distortion",
    "finite_number",
    "make_distortion",
    "distort_pixels",
    "undistort_image",
    "without_distortion",
]

logger = logging.getLogger("hrope.nvs.data")

COEFFICIENTS = {"opencv": ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"), "fisheye": ("k1", "k2", "k3", "k4")}
"""The coefficients of each kind of model, in the order :class:`Distortion` keeps them."""


@dataclass(frozen=True)
class Distortion:
    """A lens model: ``kind`` (a key of :data:`COEFFICIENTS`), its ``coefficients`` in that order,
    and ``model``, the name the file gives it (``SIMPLE_RADIAL``, ``OPENCV_FISHEYE``, ...)."""

    kind: str
    coefficients: tuple[float, ...]
    model: str


def finite_number(value: Any, where: str, field: str) -> float:
    """``value`` as a finite float, else a :class:`SceneError` naming ``where`` and ``field``."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise SceneError(f"{where}: field {field} must be a finite number, got {reprlib.repr(value)}")
    return number


def make_distortion(kind: str, values: Mapping[str, object], model: str, where: str) -> Distortion | None:
    """The :class:`Distortion` of named coefficients (missing ones are 0, each one given must be a
    finite number, else a :class:`SceneError` naming ``where`` and the field); None for an
    ``opencv`` model whose coefficients are all 0 (a pinhole camera)."""
    coefficients = tuple(
        finite_number(values[name], where, name) if name in values else 0.0 for name in COEFFICIENTS[kind]
    )
    if kind == "opencv" and not any(coefficients):
        return None
    return Distortion(kind, coefficients, model)


def distort_pixels(pixels: Tensor, K: Tensor, distortion: Distortion) -> Tensor:
    """Where points at pinhole pixel coordinates ``pixels (..., 2)`` appear in the distorted image of
    intrinsics ``K (3, 3)`` (the forward lens model, module doc); same dtype as ``pixels``."""
    K = K.to(pixels.dtype)
    coefficients = torch.tensor(distortion.coefficients, dtype=pixels.dtype)
    if distortion.kind == "opencv":
        return distort_points(pixels, K, coefficients)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    normalised = torch.stack([(pixels[..., 0] - cx) / fx, (pixels[..., 1] - cy) / fy], -1)
    return distort_points_kannala_brandt(normalised, torch.cat([torch.stack([fx, fy, cx, cy]), coefficients]))


def undistort_image(image: Tensor, K: Tensor, distortion: Distortion, mode: str = "bilinear") -> Tensor:
    """The pinhole image ``(C, H, W)`` with the same ``K`` (pixels of ``image``) and size as the
    distorted ``image``; black where the lens saw nothing (module doc). ``mode="nearest"`` for
    depth and normal maps."""
    height, width = image.shape[-2:]
    rows, columns = torch.meshgrid(
        torch.arange(height, dtype=torch.float32) + 0.5, torch.arange(width, dtype=torch.float32) + 0.5, indexing="ij"
    )
    source = distort_pixels(torch.stack([columns, rows], -1), K, distortion)
    grid = source / torch.tensor([width, height], dtype=torch.float32) * 2 - 1
    grid = torch.nan_to_num(grid, nan=-2.0, posinf=-2.0, neginf=-2.0)  # outside the image: black
    return F.grid_sample(image[None].float(), grid[None], mode=mode, padding_mode="zeros", align_corners=False)[0]


def without_distortion(frames: list, where: str) -> list:
    """``frames`` with their lens models dropped (``undistort=False``), and one warning naming the
    models ignored when there were any."""
    models = sorted({frame.distortion.model for frame in frames if frame.distortion is not None})
    if models:
        logger.warning(
            "%s: %s lens distortion ignored (undistort=False: treated as pinhole, so rays are wrong "
            "towards the image edges)",
            where,
            ", ".join(models),
        )
    return [replace(frame, distortion=None) for frame in frames]
