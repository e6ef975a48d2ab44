"""Synthetic planar scenes with exact geometry: `make_scene`.

``make_scene(seed, index, kind)`` builds a procedural layout (``room`` or ``object``), a camera
trajectory of ``config.num_frames`` frames, random intrinsics and textures, all from independent
random streams keyed by ``(seed, index)``, and renders the requested frames exactly (see
:mod:`hrope.nvs.data.synthetic.render`). The layout and trajectory do not depend on which frames, how many
views or what image size are requested, so any subset of frames shows the same scene.

Preview: ``python -m hrope.nvs.data.synthetic.preview OUT.png``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ....cameras import Cameras
from ..rng import Rng
from ..scene import Scene
from .config import SyntheticConfig
from .layouts import Layout, object_layout, room_layout
from .render import render
from .textures import MipTextures, make_texture
from .trajectories import object_trajectory, room_trajectory, sample_intrinsics

__all__ = ["KINDS", "make_scene", "scene_setup", "default_frames", "texture_size_for"]

KINDS = {"room": (room_layout, room_trajectory), "object": (object_layout, object_trajectory)}
DEFAULT_SPAN = 100  # default frames cover this many frames of the video (a wide context pair)


def texture_size_for(image_size: tuple[int, int], config: SyntheticConfig) -> int:
    """The configured texture size, or the power of two >= 2 x the larger image side (64..512)."""
    if config.texture_size is not None:
        return config.texture_size
    target = 2 * max(image_size)
    return min(512, max(64, 1 << (target - 1).bit_length()))


def default_frames(num_views: int, config: SyntheticConfig) -> list[int]:
    """``num_views`` evenly spaced frames over the first ``DEFAULT_SPAN`` frames of the video."""
    span = min(DEFAULT_SPAN, config.num_frames - 1)
    return torch.linspace(0, span, num_views).round().long().tolist()


def _check_request(kind: str, num_views: int, image_size, frames, patch_size, config) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if num_views < 1:
        raise ValueError(f"num_views must be >= 1, got {num_views}")
    if len(image_size) != 2 or min(image_size) < 1:
        raise ValueError(f"image_size must be a positive (H, W), got {image_size}")
    if patch_size is not None and (image_size[0] % patch_size or image_size[1] % patch_size):
        raise ValueError(f"image size {tuple(image_size)} is not divisible by patch size {patch_size}")
    if frames is not None:
        if len(frames) != num_views:
            raise ValueError(f"got {len(frames)} frames for num_views={num_views}")
        bad = [f for f in frames if not 0 <= f < config.num_frames]
        if bad:
            raise ValueError(f"frames {bad} are outside the video's 0..{config.num_frames - 1}")


def scene_setup(
    seed: int,
    index: int,
    kind: str = "room",
    num_views: int = 4,
    image_size: tuple[int, int] = (64, 64),
    *,
    frames: Sequence[int] | None = None,
    config: SyntheticConfig = SyntheticConfig(),
    patch_size: int | None = None,
) -> tuple[Layout, Cameras, MipTextures]:
    """Everything :func:`make_scene` renders: the layout, the cameras of ``frames`` and the textures."""
    _check_request(kind, num_views, image_size, frames, patch_size, config)
    frames = default_frames(num_views, config) if frames is None else [int(f) for f in frames]
    rng = Rng("hrope.synthetic", int(seed), int(index), kind)
    make_layout, make_trajectory = KINDS[kind]
    layout = make_layout(rng.child("layout"), config)
    world_to_cam = make_trajectory(rng.child("trajectory"), layout, config)[frames]
    K = sample_intrinsics(rng.child("intrinsics"), config, image_size, num_views)
    cameras = Cameras(K[None].float(), world_to_cam[None].float(), image_size)
    size = texture_size_for(image_size, config)
    texture_rng = rng.child("textures")
    textures = torch.stack(
        [
            make_texture(texture_rng, size, texture_kind, config.photo_probability)
            for texture_kind in layout.texture_kinds
        ]
    )
    return layout, cameras, MipTextures(textures)


def make_scene(
    seed: int,
    index: int,
    kind: str = "room",
    num_views: int = 4,
    image_size: tuple[int, int] = (64, 64),
    *,
    frames: Sequence[int] | None = None,
    config: SyntheticConfig = SyntheticConfig(),
    patch_size: int | None = None,
) -> Scene:
    """Scene ``index`` of the stream ``seed``, seen from ``num_views`` frames of its trajectory.

    Args:
        kind: "room" (RealEstate10K-like walk) or "object" (CO3D-like orbit).
        image_size: ``(H, W)``; the geometry is exact at any resolution.
        frames: trajectory frames to render (ints in ``[0, config.num_frames)``); default
            :func:`default_frames`.
        patch_size: optional; only checked (the image size must be divisible by it).

    Returns a :class:`Scene` with images, float32 cameras, z-depth (inf where nothing is seen),
    unit camera-frame normals facing the camera and exact per-pixel plane vectors ``plane_m``.
    Bit-identical for the same arguments. Raises ValueError for an invalid request.
    """
    layout, cameras, textures = scene_setup(
        seed, index, kind, num_views, image_size, frames=frames, config=config, patch_size=patch_size
    )
    rendering = render(layout.quads, textures, cameras)
    return Scene(
        images=rendering.images,
        cameras=cameras,
        depth=rendering.depth,
        normals=rendering.normals,
        plane_m=rendering.plane_m,
        name=f"synthetic-{kind}-{seed}-{index}",
    )
