"""Scene normalisation (DESIGN.md §2): first context camera = world frame, unit context baseline."""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Sequence

import torch

from ...cameras import Cameras
from .scene import Scene, SceneError

__all__ = ["normalize_scene", "context_baseline"]

MIN_BASELINE = 1e-8


def context_baseline(scene: Scene, context_indices: Sequence[int]) -> float:
    """Distance between the first two context camera centres, or the largest distance from the
    first context camera when there are more than two; 0 for a single context view."""
    centres = scene.cameras.centers()[0, list(context_indices)].double()
    return float((centres[1:] - centres[0]).norm(dim=-1).max()) if len(centres) > 1 else 0.0


def normalize_scene(scene: Scene, context_indices: Sequence[int]) -> Scene:
    """The same scene re-expressed so that camera ``context_indices[0]`` is the world frame
    (identity world-to-camera) and the context baseline (:func:`context_baseline`) is 1.

    World and camera coordinates are divided by the baseline: translations and ``depth`` shrink by
    it and ``plane_m = n / d`` grows by it; intrinsics, normals, images, masks and ``relative_depth``
    (whose scale is unknown anyway) are unchanged. With a single context view only the frame
    changes. Raises :class:`SceneError` (a ValueError) for an empty context or coincident context
    cameras.
    """
    context_indices = list(context_indices)
    if not context_indices:
        raise SceneError(f"{scene.name}: normalize_scene needs at least one context view")
    baseline = context_baseline(scene, context_indices)
    if len(context_indices) > 1 and baseline < MIN_BASELINE:
        raise SceneError(
            f"{scene.name}: context cameras {context_indices} coincide (baseline {baseline:g}); "
            "cannot scale the baseline to 1"
        )
    scale = 1.0 / baseline if len(context_indices) > 1 else 1.0
    E = scene.cameras.world_to_cam.double()
    # A generic float64 inverse: stored (float32) rotations are orthonormal only to ~1e-7, and this
    # makes the first context camera exactly the identity.
    world_to_cam = E @ torch.linalg.inv(E[:, context_indices[0]])[:, None]
    world_to_cam[..., :3, 3] *= scale
    cameras = Cameras(scene.cameras.K, world_to_cam.to(scene.cameras.world_to_cam.dtype), scene.cameras.image_size)
    rescale = lambda x, s: None if x is None else x * s  # noqa: E731
    return replace(scene, cameras=cameras, depth=rescale(scene.depth, scale), plane_m=rescale(scene.plane_m, 1 / scale))
