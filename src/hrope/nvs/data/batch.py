"""`SceneBatch`: B scenes with the same views and image size, stacked for training."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...cameras import Cameras
from ...planes import Planes
from .scene import Scene, SceneError, patch_planes

__all__ = ["SceneBatch", "collate_scenes"]


@dataclass
class SceneBatch:
    """A batch of multi-view examples; per example the ``num_context`` context views come first.

    Attributes:
        images: ``(B, V, 3, H, W)`` in [0, 1].
        cameras: :class:`hrope.Cameras` ``(B, V)``.
        num_context: number of context views (views ``num_context:`` are targets).
        depth: optional ``(B, V, H, W)`` z-depth (inf where nothing is seen).
        normals: optional ``(B, V, 3, H, W)`` unit normals in camera frames.
        plane_m: optional ``(B, V, 3, H, W)`` exact per-pixel plane vectors (camera frames).
        names: scene names, length B.
    """

    images: Tensor
    cameras: Cameras
    num_context: int
    depth: Tensor | None
    normals: Tensor | None
    plane_m: Tensor | None
    names: list[str]

    def planes(self, patch_size: int) -> Planes | None:
        """Per-patch planes ``(B, V * gh * gw)``, the same rule as :meth:`Scene.planes`."""
        return patch_planes(self.cameras, patch_size, plane_m=self.plane_m, depth=self.depth, name="batch")

    def to(self, device) -> SceneBatch:
        move = lambda x: None if x is None else x.to(device)  # noqa: E731
        return SceneBatch(
            self.images.to(device),
            self.cameras.to(device),
            self.num_context,
            move(self.depth),
            move(self.normals),
            move(self.plane_m),
            list(self.names),
        )


def collate_scenes(scenes: list[Scene], num_context: int) -> SceneBatch:
    """Stack scenes with equal view counts and image sizes. A geometry field is kept only when
    every scene has it (otherwise None)."""
    if not scenes:
        raise SceneError("collate_scenes needs at least one scene")
    first = scenes[0]
    for scene in scenes[1:]:
        if scene.num_views != first.num_views or scene.image_size != first.image_size:
            raise SceneError(
                f"cannot batch {scene.name} ({scene.num_views} views of {scene.image_size}) with "
                f"{first.name} ({first.num_views} views of {first.image_size})"
            )
    if not 1 <= num_context <= first.num_views:
        raise SceneError(f"num_context must be in 1..{first.num_views}, got {num_context}")

    def stack(field: str) -> Tensor | None:
        values = [getattr(scene, field) for scene in scenes]
        return None if any(v is None for v in values) else torch.stack(values)

    cameras = Cameras(
        torch.cat([s.cameras.K for s in scenes]),
        torch.cat([s.cameras.world_to_cam for s in scenes]),
        first.image_size,
        validate=False,
    )
    return SceneBatch(
        torch.stack([s.images for s in scenes]),
        cameras,
        num_context,
        stack("depth"),
        stack("normals"),
        stack("plane_m"),
        [s.name for s in scenes],
    )
