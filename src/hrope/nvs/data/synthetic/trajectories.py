"""Camera trajectories (RealEstate10K-like walks, CO3D-like orbits) and random intrinsics.

Trajectories are virtual videos of ``config.num_frames`` frames, returned as world-to-camera
``(F, 4, 4)`` float64 matrices (OpenCV axes; world y points down, see :mod:`.layouts`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ....geometry import invert_se3, make_se3
from ..rng import Rng
from .config import SyntheticConfig
from .layouts import _OBJECT_ENCLOSURE, Layout

__all__ = ["look_rotation", "room_trajectory", "object_trajectory", "sample_intrinsics"]

ROOM_END_MARGIN = 1.0  # the walk stays this far from the end walls (metres)


def look_rotation(forward: Tensor, roll: Tensor) -> Tensor:
    """Camera-to-world rotations ``(F, 3, 3)`` looking along ``forward (F, 3)``, upright up to ``roll (F,)``."""
    z = forward / forward.norm(dim=-1, keepdim=True)
    up = torch.tensor([0.0, -1.0, 0.0], dtype=z.dtype).expand_as(z)
    x = torch.linalg.cross(z, up)
    x = x / x.norm(dim=-1, keepdim=True)
    y = torch.linalg.cross(z, x)
    c, s = torch.cos(roll)[:, None], torch.sin(roll)[:, None]
    return torch.stack([c * x + s * y, -s * x + c * y, z], -1)


def _world_to_cam(centres: Tensor, forward: Tensor, roll: Tensor) -> Tensor:
    return invert_se3(make_se3(look_rotation(forward, roll), centres))


def _wave(rng: Rng, frames: Tensor, amplitude: float, cycles: tuple[float, float] = (0.3, 1.5)) -> Tensor:
    """A random sinusoid ``(F,)`` of ``amplitude`` with ``cycles`` periods over the video."""
    cycles_, phase = rng.scalar(*cycles), rng.scalar(0, 2 * math.pi)
    return amplitude * torch.sin(2 * math.pi * cycles_ * frames / frames.numel() + phase)


def room_trajectory(rng: Rng, layout: Layout, config: SyntheticConfig) -> Tensor:
    """A forward walk along the room's corridor with a turning heading and a looking-around gaze."""
    if layout.room is None:
        raise ValueError("room_trajectory needs a room layout (Layout.room)")
    F = config.num_frames
    needed = config.room_speed[0] * (F - 1) + 2 * ROOM_END_MARGIN
    if needed > config.room_length[0]:
        raise ValueError(
            f"impossible trajectory: {F} frames at >= {config.room_speed[0]} m/frame need a room of "
            f"{needed:.2f} m but SyntheticConfig.room_length starts at {config.room_length[0]} m"
        )
    width, length, height = layout.room
    frames = torch.arange(F, dtype=torch.float64)
    fit = (length - 2 * ROOM_END_MARGIN) / (F - 1)
    speed = rng.scalar(config.room_speed[0], min(config.room_speed[1], fit))
    x0 = rng.scalar(-config.corridor / 2, config.corridor / 2)
    heading = _wave(rng, frames, math.radians(rng.scalar(0, config.room_turn_deg)))
    while True:  # shrink the turns until the walk stays in the corridor (a straight walk always does)
        steps = torch.cat([frames.new_zeros(1), torch.full((F - 1,), speed, dtype=torch.float64)])
        x = x0 + torch.cumsum(steps * torch.sin(heading), 0)
        if float(x.abs().max()) <= config.corridor:
            break
        heading = heading / 2
    z = -length / 2 + ROOM_END_MARGIN + torch.cumsum(steps * torch.cos(heading), 0)
    y = -rng.scalar(*config.camera_height) + _wave(rng, frames, 0.03, (2, 6))
    yaw = heading + _wave(rng, frames, math.radians(rng.scalar(0, config.room_look_deg)))
    pitch = math.radians(rng.scalar(-8, 8)) + _wave(rng, frames, math.radians(5))
    roll = _wave(rng, frames, math.radians(2))
    if rng.scalar() < 0.5:  # walk the other way: turn the path 180 degrees about the room's vertical axis
        x, z, yaw = -x, -z, yaw + math.pi
    forward = torch.stack([torch.sin(yaw) * torch.cos(pitch), -torch.sin(pitch), torch.cos(yaw) * torch.cos(pitch)], -1)
    return _world_to_cam(torch.stack([x, y, z], -1), forward, roll)


def object_trajectory(rng: Rng, layout: Layout, config: SyntheticConfig) -> Tensor:
    """One orbit around the object, cameras on a sphere cap looking (roughly) at its centre."""
    if layout.target is None or layout.radius is None:
        raise ValueError("object_trajectory needs an object layout (Layout.target and Layout.radius)")
    target, radius = layout.target, layout.radius
    F = config.num_frames
    frames = torch.arange(F, dtype=torch.float64)
    low, high = (math.radians(a) for a in config.object_elevation_deg)
    elevation = (rng.scalar(low, high) + _wave(rng, frames, math.radians(8))).clamp(low, high)
    distance = radius * rng.scalar(*config.object_distance) * (1 + _wave(rng, frames, 0.08))
    azimuth = rng.scalar(0, 2 * math.pi) + rng.sign() * 2 * math.pi * frames / F
    offset = torch.stack(
        [torch.cos(elevation) * torch.sin(azimuth), -torch.sin(elevation), torch.cos(elevation) * torch.cos(azimuth)],
        -1,
    )
    centres = target + distance[:, None] * offset
    too_far = float(centres[:, [0, 2]].abs().max()) > _OBJECT_ENCLOSURE - 0.3
    if too_far or float(centres[:, 1].min()) < -0.7 * _OBJECT_ENCLOSURE:
        raise ValueError(
            f"impossible trajectory: the orbit (distance {config.object_distance} object radii) "
            "leaves the room the object stands in"
        )
    jitter = torch.stack([_wave(rng, frames, 0.1 * radius) for _ in range(3)], -1)
    roll = _wave(rng, frames, math.radians(3))
    return _world_to_cam(centres, target + jitter - centres, roll)


def sample_intrinsics(rng: Rng, config: SyntheticConfig, image_size: tuple[int, int], num_views: int) -> Tensor:
    """Pixel intrinsics ``(V, 3, 3)`` with random field of view, fy/fx and principal point."""
    H, W = image_size
    draws = num_views if config.per_view_intrinsics else 1
    fov = torch.deg2rad(rng.uniform(*config.fov_deg, (draws,)))
    fx = W / 2 / torch.tan(fov / 2)
    j, pj = config.focal_aspect_jitter, config.principal_point_jitter
    K = torch.zeros(draws, 3, 3, dtype=torch.float64)
    K[:, 0, 0] = fx
    K[:, 1, 1] = fx * (1 + rng.uniform(-j, j, (draws,)))
    K[:, 0, 2] = W * (0.5 + rng.uniform(-pj, pj, (draws,)))
    K[:, 1, 2] = H * (0.5 + rng.uniform(-pj, pj, (draws,)))
    K[:, 2, 2] = 1.0
    return K.expand(num_views, 3, 3).clone()
