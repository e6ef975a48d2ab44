"""Scene normalisation: the world frame and unit of every example.

``context`` (the default, DESIGN.md §2; RayRoPE / PRoPE): the first context camera is the world
frame and the context baseline is 1 (:func:`normalize_scene`). ``lvsm`` (LVSM's RealEstate10K
pipeline): the average camera of all the example's views is the world frame and the camera
centres fit in [-1/1.35, 1/1.35] (:func:`normalize_lvsm`). :func:`normalize` picks one by name
(``data.normalize``).
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...cameras import Cameras
from ..config.schema import NORMALIZATIONS
from .scene import Scene, SceneError

__all__ = [
    "NORMALIZATIONS",
    "LVSM_SCALE",
    "normalize",
    "normalize_scene",
    "normalize_lvsm",
    "average_pose",
    "context_baseline",
]

LVSM_SCALE = 1.35  # LVSM's scene_scale_factor: the largest camera coordinate becomes 1 / 1.35
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
    return _reexpressed(scene, E @ torch.linalg.inv(E[:, context_indices[0]])[:, None], scale)


def _reexpressed(scene: Scene, world_to_cam: Tensor, scale: float) -> Scene:
    """``scene`` with the float64 poses ``world_to_cam (1, V, 4, 4)`` of a new world frame, then
    world and camera coordinates multiplied by ``scale``: translations and ``depth`` by it,
    ``plane_m = n / d`` by its inverse; intrinsics, normals and images unchanged."""
    K, size = scene.cameras.K, scene.cameras.image_size
    rescaled = Cameras(K, world_to_cam, size, validate=False).rescaled(scale).world_to_cam
    cameras = Cameras(K, rescaled.to(scene.cameras.world_to_cam.dtype), size)
    rescale = lambda x, s: None if x is None else x * s  # noqa: E731
    return replace(scene, cameras=cameras, depth=rescale(scene.depth, scale), plane_m=rescale(scene.plane_m, 1 / scale))


def average_pose(cam_to_world: Tensor) -> Tensor:
    """LVSM's average camera ``(4, 4)`` (camera-to-world, OpenCV axes) of poses ``(V, 4, 4)``: its
    centre is the mean camera centre, its forward axis (z) the normalised mean forward axis, its
    right axis (x) the normalised cross product of the mean down axis (y) and z, its down axis
    z x right."""
    forward = F.normalize(cam_to_world[:, :3, 2].mean(0), dim=0)
    right = F.normalize(torch.linalg.cross(cam_to_world[:, :3, 1].mean(0), forward), dim=0)
    pose = torch.eye(4, dtype=cam_to_world.dtype)
    pose[:3, :3] = torch.stack([right, torch.linalg.cross(forward, right), forward], dim=-1)
    pose[:3, 3] = cam_to_world[:, :3, 3].mean(0)
    return pose


def normalize_lvsm(scene: Scene) -> Scene:
    """The same scene re-expressed as LVSM normalises an example: its :func:`average_pose` over all
    views (context and targets: they are the example's input cameras) becomes the world frame, then
    coordinates are divided by :data:`LVSM_SCALE` times the largest absolute coordinate of a camera
    centre, so the centres lie in [-1/1.35, 1/1.35]^3 (rescaled like :func:`normalize_scene`).
    Raises :class:`SceneError` when all camera centres coincide. Computed in float64."""
    E = scene.cameras.world_to_cam.double()
    average = average_pose(torch.linalg.inv(E[0]))
    world_to_cam = E @ average  # cam-to-world in the new frame: average^-1 @ cam-to-world
    extent = float((torch.linalg.inv(average) @ torch.linalg.inv(E[0]))[:, :3, 3].abs().max())
    if extent < MIN_BASELINE:
        raise SceneError(f"{scene.name}: all {scene.num_views} camera centres coincide; cannot scale the scene")
    return _reexpressed(scene, world_to_cam, 1.0 / (LVSM_SCALE * extent))


def normalize(scene: Scene, context_indices: Sequence[int], mode: str = "context") -> Scene:
    """The scene normalised by ``mode`` (:data:`NORMALIZATIONS`): ``context`` is
    :func:`normalize_scene` on ``context_indices``, ``lvsm`` is :func:`normalize_lvsm`."""
    if mode not in NORMALIZATIONS:
        raise ValueError(f"normalisation must be one of {NORMALIZATIONS}, got {mode!r}")
    return normalize_scene(scene, context_indices) if mode == "context" else normalize_lvsm(scene)
