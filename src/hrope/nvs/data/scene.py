"""`Scene`: posed images (and optional geometry) in the project's conventions.

Shared by the synthetic generator and every real-data loader. Cameras follow DESIGN.md §2:
K in pixels of ``images``, world-to-camera OpenCV extrinsics, batch dimension 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ...cameras import Cameras
from ...errors import InputError
from ...planes import Planes

__all__ = ["Scene", "SceneError", "patch_planes"]


class SceneError(InputError):
    """A malformed scene (the message names the field)."""


@dataclass
class Scene:
    """V posed views of one scene.

    Attributes:
        images: ``(V, 3, H, W)`` float RGB in [0, 1].
        cameras: :class:`hrope.Cameras` with batch 1 and V views, for ``(H, W)`` images.
        depth: optional ``(V, H, W)`` z-depth (distance along the optical axis; 0 or inf where
            nothing is seen).
        normals: optional ``(V, 3, H, W)`` unit normals in each camera's frame, facing the camera.
        plane_m: optional ``(V, 3, H, W)`` exact plane vector m = n / d (camera frame) of the
            surface seen at each pixel (synthetic scenes).
        name: an identifier for logs and caches.
        masks: optional ``(V, H, W)`` object masks in [0, 1] (the fraction of each pixel the object
            covers; real captures that ship them, e.g. ``masks_N/``): :meth:`composite` puts the
            object over a plain background with them.
        relative_depth: optional ``(V, H, W)`` monocular depth prior known only up to an unknown
            per-view scale and shift (NaN where there is none): never metric, so nothing that reads
            ``depth`` (planes, scene normalisation) reads it.

    Batches (:func:`hrope.nvs.data.collate_scenes`) carry neither ``masks`` nor ``relative_depth``:
    the model reads neither.
    """

    images: Tensor
    cameras: Cameras
    depth: Tensor | None = None
    normals: Tensor | None = None
    plane_m: Tensor | None = None
    name: str = ""
    masks: Tensor | None = None
    relative_depth: Tensor | None = None

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.shape[1] != 3:
            raise SceneError(f"{self.name}: images must be (V, 3, H, W), got {tuple(self.images.shape)}")
        V, _, H, W = self.images.shape
        if self.cameras.batch_size != 1 or self.cameras.num_views != V:
            raise SceneError(f"{self.name}: cameras must have batch 1 and {V} views, got {self.cameras}")
        if self.cameras.image_size != (H, W):
            raise SceneError(f"{self.name}: cameras are for {self.cameras.image_size}, images are {(H, W)}")
        maps = {"depth": (V, H, W), "normals": (V, 3, H, W), "plane_m": (V, 3, H, W), "masks": (V, H, W)}
        for field, shape in {**maps, "relative_depth": (V, H, W)}.items():
            value = getattr(self, field)
            if value is not None and tuple(value.shape) != shape:
                raise SceneError(f"{self.name}: {field} must be {shape}, got {tuple(value.shape)}")

    @property
    def num_views(self) -> int:
        return self.images.shape[0]

    @property
    def image_size(self) -> tuple[int, int]:
        return self.images.shape[-2], self.images.shape[-1]

    def select_views(self, index) -> Scene:
        """The scene restricted to views ``index`` (a list, slice or tensor), in that order."""
        if isinstance(index, int):
            index = [index]
        pick = lambda x: None if x is None else x[index]  # noqa: E731
        return replace(
            self,
            images=self.images[index],
            cameras=self.cameras.select_views(index),
            depth=pick(self.depth),
            normals=pick(self.normals),
            plane_m=pick(self.plane_m),
            masks=pick(self.masks),
            relative_depth=pick(self.relative_depth),
        )

    def composite(self, background: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> Scene:
        """The scene with each image's object (``masks``) over the RGB colour ``background`` in [0, 1]:
        ``image * mask + background * (1 - mask)``; a :class:`SceneError` when it has no masks."""
        if self.masks is None:
            raise SceneError(f"{self.name}: composite needs object masks (load the scene with masks=True)")
        if len(background) != 3 or not all(0 <= float(x) <= 1 for x in background):
            raise SceneError(f"{self.name}: background must be an RGB colour in [0, 1], got {background!r}")
        colour = torch.tensor(background, dtype=self.images.dtype).view(1, 3, 1, 1)
        mask = self.masks[:, None].to(self.images.dtype)
        return replace(self, images=self.images * mask + colour * (1 - mask))

    def planes(self, patch_size: int) -> Planes | None:
        """Per-patch planes ``(1, V * H/p * W/p)`` for tokens of ``patch_size`` (see :func:`patch_planes`)."""
        add_batch = lambda x: None if x is None else x[None]  # noqa: E731
        return patch_planes(
            self.cameras, patch_size, plane_m=add_batch(self.plane_m), depth=add_batch(self.depth), name=self.name
        )


def patch_planes(
    cameras: Cameras, patch_size: int, *, plane_m: Tensor | None = None, depth: Tensor | None = None, name: str = ""
) -> Planes | None:
    """Per-patch planes ``(B, V * H/p * W/p)`` from batched maps ``plane_m (B, V, 3, H, W)`` / ``depth (B, V, H, W)``.

    Exact planes (``plane_m``) are read at the pixel just below-right of each patch centre;
    otherwise they are fitted to ``depth`` by least squares; None when neither exists.
    """
    H, W = cameras.image_size
    if H % patch_size or W % patch_size:
        raise SceneError(f"{name}: image size {(H, W)} is not divisible by patch size {patch_size}")
    if plane_m is not None:
        c = patch_size // 2
        m = plane_m[:, :, :, c::patch_size, c::patch_size]  # (B, V, 3, gh, gw)
        return Planes.from_m(m.permute(0, 1, 3, 4, 2).reshape(m.shape[0], -1, 3))
    if depth is not None:
        return Planes.from_depth(depth, cameras, patch_size)
    return None
