"""Procedural scene layouts made of quads: a furnished `room` and a planar-solid `object`.

World axes are OpenCV-like with y pointing down: the floor is y = 0 and heights are negative y.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..rng import Rng
from .config import SyntheticConfig
from .render import Quads

__all__ = ["Layout", "room_layout", "object_layout"]

UP = (0.0, -1.0, 0.0)
_OBJECT_ENCLOSURE = 8.0  # half-size of the room an object stands in (metres)


@dataclass
class Layout:
    """Quads plus what the trajectories need.

    ``texture_kinds`` has one entry ("photo", "procedural", "any") per texture index; ``room`` is
    ``(width, length, height)`` for rooms; ``target``/``radius`` are the object's centre and
    bounding radius for objects.
    """

    quads: Quads
    texture_kinds: list[str]
    room: tuple[float, float, float] | None = None
    target: Tensor | None = None
    radius: float | None = None


def _vec(*xs) -> Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def _yaw(angle: float) -> Tensor:
    """Rotation about the vertical (y) axis."""
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)


def _random_rotation(rng: Rng) -> Tensor:
    q = torch.randn(4, generator=rng.generator, dtype=torch.float64)
    w, x, y, z = q / q.norm()
    return torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)]),
            torch.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)]),
            torch.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]),
        ]
    )


class _QuadBuilder:
    """Accumulates quads and their textures, then packs them into :class:`Quads`."""

    def __init__(self, rng: Rng) -> None:
        self.rng = rng
        self.rows: list[tuple] = []
        self.texture_kinds: list[str] = []
        light = rng.uniform(-1, 1, (3,))
        light[1] = -abs(float(light[1])) - 0.5  # mostly from above
        self.light = light / light.norm()

    def texture(self, kind: str = "any") -> int:
        self.texture_kinds.append(kind)
        return len(self.texture_kinds) - 1

    def add(
        self,
        centre: Tensor,
        axis_u: Tensor,
        axis_v: Tensor,
        texture: int,
        *,
        front: Tensor | None = None,
        two_sided: bool = False,
        tile: float | None = None,
    ) -> None:
        """Add a quad; ``front`` orients it, ``tile`` is the texture tile size in metres (None: the
        texture covers the quad exactly once)."""
        if front is not None and float(torch.linalg.cross(axis_u, axis_v) @ front) < 0:
            axis_u, axis_v = axis_v, axis_u
        if tile is None:
            scale, offset = (0.5, 0.5), (0.5, 0.5)
        else:
            scale = (float(axis_u.norm()) / tile, float(axis_v.norm()) / tile)
            offset = (self.rng.scalar(0, 2), self.rng.scalar(0, 2))
        normal = torch.linalg.cross(axis_u, axis_v)
        brightness = 0.6 + 0.4 * abs(float(normal @ self.light)) / float(normal.norm())
        self.rows.append((centre, axis_u, axis_v, two_sided, texture, scale, offset, brightness))

    def cuboid(self, centre: Tensor, rotation: Tensor, half: Tensor, texture: int, tile: float) -> None:
        """A closed box (six one-sided outward faces)."""
        for i in range(3):
            j, k = (i + 1) % 3, (i + 2) % 3
            for sign in (1.0, -1.0):
                normal = sign * rotation[:, i]
                self.add(
                    centre + half[i] * normal,
                    half[j] * rotation[:, j],
                    half[k] * rotation[:, k],
                    texture,
                    front=normal,
                    tile=tile,
                )

    def build(self) -> Quads:
        columns = list(zip(*self.rows))
        return Quads(
            centre=torch.stack(columns[0]),
            axis_u=torch.stack(columns[1]),
            axis_v=torch.stack(columns[2]),
            two_sided=torch.tensor(columns[3]),
            texture=torch.tensor(columns[4]),
            texture_scale=torch.tensor(columns[5], dtype=torch.float64),
            texture_offset=torch.tensor(columns[6], dtype=torch.float64),
            brightness=torch.tensor(columns[7], dtype=torch.float64),
        )


def _box_room(b: _QuadBuilder, width: float, length: float, height: float, tile: tuple[float, float]) -> None:
    """Floor, ceiling and four walls of ``[-w/2, w/2] x [-h, 0] x [-l/2, l/2]``, facing inwards."""
    rng = b.rng
    half_w, half_h, half_l = width / 2, height / 2, length / 2
    b.add(_vec(0, 0, 0), _vec(half_w, 0, 0), _vec(0, 0, half_l), b.texture(), front=_vec(*UP), tile=rng.scalar(*tile))
    b.add(
        _vec(0, -height, 0),
        _vec(half_w, 0, 0),
        _vec(0, 0, half_l),
        b.texture("procedural"),
        front=_vec(0, 1, 0),
        tile=rng.scalar(*tile),
    )
    for sign in (1.0, -1.0):
        b.add(
            _vec(sign * half_w, -half_h, 0),
            _vec(0, half_h, 0),
            _vec(0, 0, half_l),
            b.texture(),
            front=_vec(-sign, 0, 0),
            tile=rng.scalar(*tile),
        )
        b.add(
            _vec(0, -half_h, sign * half_l),
            _vec(half_w, 0, 0),
            _vec(0, half_h, 0),
            b.texture(),
            front=_vec(0, 0, -sign),
            tile=rng.scalar(*tile),
        )


def room_layout(rng: Rng, config: SyntheticConfig) -> Layout:
    """A furnished room: boxes (some stacked), boards leaning on the side walls, pictures."""
    b = _QuadBuilder(rng)
    width, length, height = (
        rng.scalar(*config.room_width),
        rng.scalar(*config.room_length),
        rng.scalar(*config.room_height),
    )
    _box_room(b, width, length, height, tile=(0.6, 1.8))
    free = width / 2 - config.corridor - 0.1  # room between the corridor and a side wall
    for _ in range(rng.integer(2, 4)):
        side, z = rng.sign(), rng.scalar(-length / 2 + 0.6, length / 2 - 0.6)
        reach = min(free / 2, 0.8)
        side_max = reach / math.sqrt(2)
        half = _vec(rng.scalar(0.15, side_max), rng.scalar(0.2, 0.6), rng.scalar(0.15, side_max))
        radius = float(half[[0, 2]].norm())
        rotation = _yaw(rng.angle(30))
        centre = _vec(side * (width / 2 - radius - 0.05), -float(half[1]), z)
        b.cuboid(centre, rotation, half, b.texture(), tile=rng.scalar(0.3, 1.0))
        if rng.scalar() < 0.35:  # a smaller box on top
            top = half * _vec(rng.scalar(0.4, 0.9), rng.scalar(0.5, 1.0), rng.scalar(0.4, 0.9))
            on_top = centre + _vec(0, -float(half[1] + top[1]), 0)
            b.cuboid(on_top, rotation @ _yaw(rng.angle(20)), top, b.texture(), tile=rng.scalar(0.3, 1.0))
    for _ in range(rng.integer(1, 2)):  # boards leaning on a side wall
        side, z = rng.sign(), rng.scalar(-length / 2 + 0.6, length / 2 - 0.6)
        half_len, tilt = rng.scalar(0.5, 1.0), math.radians(rng.scalar(10, 25))
        bottom = _vec(side * (width / 2 - 2 * half_len * math.sin(tilt)), 0, z)
        top = _vec(side * width / 2, -2 * half_len * math.cos(tilt), z)
        b.add(
            (bottom + top) / 2,
            (top - bottom) / 2,
            _vec(0, 0, rng.scalar(0.2, 0.5)),
            b.texture(),
            two_sided=True,
            tile=rng.scalar(0.3, 1.0),
        )
    for _ in range(rng.integer(1, 3)):  # pictures hung on a wall
        half_w, half_h = rng.scalar(0.2, 0.6), rng.scalar(0.2, 0.45)
        y = -rng.scalar(1.2, min(1.8, height - half_h - 0.1))
        if rng.scalar() < 0.5:
            side = rng.sign()
            centre = _vec(side * (width / 2 - 0.03), y, rng.scalar(-length / 2 + 1, length / 2 - 1))
            axis_u, front = _vec(0, 0, half_w), _vec(-side, 0, 0)
        else:
            side = rng.sign()
            centre = _vec(rng.scalar(-width / 2 + 0.7, width / 2 - 0.7), y, side * (length / 2 - 0.03))
            axis_u, front = _vec(half_w, 0, 0), _vec(0, 0, -side)
        b.add(centre, axis_u, _vec(0, half_h, 0), b.texture("photo"), front=front)
    return Layout(b.build(), b.texture_kinds, room=(width, length, height))


def object_layout(rng: Rng, config: SyntheticConfig) -> Layout:
    """A cluster of boxes (upright or tumbled) and slanted boards on the floor of a large room."""
    b = _QuadBuilder(rng)
    e = _OBJECT_ENCLOSURE
    _box_room(b, 2 * e, 2 * e, 0.75 * e, tile=(0.8, 2.5))
    corners = []
    for _ in range(rng.integer(*config.object_boxes)):
        half = rng.uniform(*config.object_box_half_size, (3,))
        rotation = _random_rotation(rng) if rng.scalar() < config.object_tumble_probability else _yaw(rng.angle(180))
        angle, dist = rng.scalar(0, 2 * math.pi), rng.scalar(0, config.object_spread)
        centre = _vec(dist * math.cos(angle), 0, dist * math.sin(angle))
        box = (
            centre
            + (
                torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=torch.float64)
                * half
            )
            @ rotation.T
        )
        lift = float(box[:, 1].max())  # rest on the floor
        centre, box = centre - _vec(0, lift, 0), box - _vec(0, lift, 0)
        b.cuboid(centre, rotation, half, b.texture(), tile=rng.scalar(0.15, 0.6))
        corners.append(box)
    for _ in range(rng.integer(*config.object_boards)):  # slanted boards leaning into the cluster
        rotation = _random_rotation(rng)
        axis_u, axis_v = rotation[:, 0] * rng.scalar(0.1, 0.35), rotation[:, 1] * rng.scalar(0.1, 0.35)
        angle = rng.scalar(0, 2 * math.pi)
        centre = _vec(0.3 * math.cos(angle), 0, 0.3 * math.sin(angle))
        lowest = float(axis_u[1].abs() + axis_v[1].abs())
        centre = centre - _vec(0, lowest, 0)
        b.add(centre, axis_u, axis_v, b.texture(), two_sided=True, tile=rng.scalar(0.15, 0.6))
        corners.append(torch.stack([centre + su * axis_u + sv * axis_v for su in (-1, 1) for sv in (-1, 1)]))
    points = torch.cat(corners)
    target = (points.amax(0) + points.amin(0)) / 2
    radius = float((points - target).norm(dim=-1).max())
    return Layout(b.build(), b.texture_kinds, target=target, radius=radius)
