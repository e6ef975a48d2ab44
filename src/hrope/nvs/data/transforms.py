"""Resize and centre-crop images with their intrinsics updated exactly.

Pixel convention (the project's, and COLMAP's, nerfstudio's, PyTorch3D's): an image of size
``(H, W)`` covers the continuous rectangle ``[0, W] x [0, H]``; pixel ``(row i, column j)`` has
its centre at ``(x, y) = (j + 0.5, i + 0.5)``; ``K`` maps camera points to these coordinates.

Resizing ``(H, W) -> (H', W')`` maps ``x -> x * W'/W`` and ``y -> y * H'/H`` exactly (bilinear
interpolation with ``align_corners=False`` samples the source at ``(j' + 0.5) * W/W'``), so
``fx, cx`` scale by ``W'/W`` and ``fy, cy`` by ``H'/H``. Cropping at ``(top, left)`` shifts
``cx -= left`` and ``cy -= top``.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn.functional as F
from torch import Tensor

from ...cameras import Cameras
from .scene import Scene, SceneError

__all__ = ["scale_intrinsics", "crop_intrinsics", "resize_crop_plan", "resize_crop", "resize_crop_scene"]


def scale_intrinsics(K: Tensor, from_size: tuple[int, int], to_size: tuple[int, int]) -> Tensor:
    """Intrinsics ``(..., 3, 3)`` of an image of ``from_size (H, W)`` rescaled to ``to_size``."""
    sx = to_size[1] / from_size[1]
    sy = to_size[0] / from_size[0]
    out = K.clone()
    out[..., 0, :] = K[..., 0, :] * sx
    out[..., 1, :] = K[..., 1, :] * sy
    return out


def crop_intrinsics(K: Tensor, top: int, left: int) -> Tensor:
    """Intrinsics ``(..., 3, 3)`` of the crop whose top-left corner is pixel ``(top, left)``."""
    out = K.clone()
    out[..., 0, 2] = K[..., 0, 2] - left
    out[..., 1, 2] = K[..., 1, 2] - top
    return out


def resize_crop_plan(from_size: tuple[int, int], to_size: tuple[int, int]) -> tuple[tuple[int, int], int, int]:
    """``(resized (H, W), top, left)``: the smallest resize covering ``to_size``, then a centre crop.

    The scale is ``max(H'/H, W'/W)``; the other side is rounded to whole pixels (so the two axes
    may scale by slightly different factors, which the intrinsics record exactly).
    """
    (H, W), (Ht, Wt) = from_size, to_size
    if min(H, W, Ht, Wt) <= 0:
        raise SceneError(f"image sizes must be positive, got {from_size} -> {to_size}")
    scale = max(Ht / H, Wt / W)
    Hr, Wr = max(Ht, round(H * scale)), max(Wt, round(W * scale))
    return (Hr, Wr), (Hr - Ht) // 2, (Wr - Wt) // 2


def _resample(x: Tensor, size: tuple[int, int], mode: str) -> Tensor:
    """``(N, C, H, W)`` -> ``(N, C, *size)``; antialiased when shrinking."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    if mode == "nearest":
        return F.interpolate(x, size=size, mode="nearest-exact")
    shrinking = size[0] < x.shape[-2] or size[1] < x.shape[-1]
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=shrinking)


def resize_crop(images: Tensor, K: Tensor, to_size: tuple[int, int], mode: str = "bilinear") -> tuple[Tensor, Tensor]:
    """Resize + centre-crop ``images (V, C, H, W)`` to ``to_size``; ``K (V, 3, 3)`` updated exactly.

    ``mode`` is "bilinear" (colours) or "nearest" (depth, normals, plane maps).
    """
    size = (images.shape[-2], images.shape[-1])
    (Hr, Wr), top, left = resize_crop_plan(size, to_size)
    resized = _resample(images, (Hr, Wr), mode)
    out = resized[..., top : top + to_size[0], left : left + to_size[1]]
    K_out = crop_intrinsics(scale_intrinsics(K, size, (Hr, Wr)), top, left)
    return out, K_out


def resize_crop_scene(scene: Scene, image_size: tuple[int, int]) -> Scene:
    """``scene`` resized + centre-cropped to ``image_size (H, W)``.

    Colours and object masks are resampled bilinearly (antialiased when shrinking) and clamped to
    [0, 1]; depth, relative depth, normals and plane maps with nearest neighbour (their values are
    per-camera quantities that a change of intrinsics leaves unchanged).
    """
    image_size = (int(image_size[0]), int(image_size[1]))
    if scene.image_size == image_size:
        return scene
    images, K = resize_crop(scene.images, scene.cameras.K[0], image_size)
    cameras = Cameras(K[None], scene.cameras.world_to_cam, image_size, validate=False)

    def geometry(x: Tensor | None, channels: bool, mode: str = "nearest") -> Tensor | None:
        if x is None:
            return None
        out, _ = resize_crop(x if channels else x[:, None], scene.cameras.K[0], image_size, mode=mode)
        return out if channels else out[:, 0]

    masks = geometry(scene.masks, False, "bilinear")
    return replace(
        scene,
        images=images.clamp(0, 1),
        cameras=cameras,
        depth=geometry(scene.depth, False),
        normals=geometry(scene.normals, True),
        plane_m=geometry(scene.plane_m, True),
        masks=None if masks is None else masks.clamp(0, 1),
        relative_depth=geometry(scene.relative_depth, False),
    )
