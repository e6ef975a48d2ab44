"""What the model sees, as plain 3D data: camera frusta with their images and per-patch planes as quads.

:func:`build_scene` turns one multi-view example (images, cameras, per-token planes) into a
:class:`Scene3D` of numpy arrays in world coordinates, with no viewer involved, so it can be
tested on its own; :mod:`hrope.nvs.viz.viewer3d` draws it with viser. :func:`run_scene` reads a
trained run (its model's planes on a held-out scene) and :func:`capture_scene` a scene folder
(its cameras, and planes fitted to its depth when it has some).

Conventions: OpenCV camera axes (x right, y down, z forward), world-to-camera poses, planes as
m = n / d in each token's camera frame (:class:`hrope.Planes`); the last view is the target.
Each token's quad is its patch's footprint on its plane: the plane cut by the four corner rays of
the patch, shrunk towards the centre by :data:`QUAD_SHRINK` so neighbours stay apart. A token
whose plane does not cross all four corner rays in front of the camera, closer than
``max_depth``, gets no quad (the plane at infinity, m = 0, never does).

Colours: ``normal`` is ``(n + 1) / 2`` of the camera-frame normal facing the camera (as in
``hrope viz planes``); ``error`` is the angle between the token's normal and the ground truth's,
0 to :data:`MAX_ERROR_DEG` degrees on matplotlib's ``viridis`` (0: dark purple, 45 and more: yellow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...cameras import Cameras
from ...geometry import patch_rays
from ...planes import Planes
from .figures import VizError

__all__ = [
    "Frustum",
    "Quads",
    "Scene3D",
    "COLOURINGS",
    "build_scene",
    "patch_quads",
    "rotation_to_wxyz",
    "run_scene",
    "capture_scene",
    "is_run",
]

COLOURINGS = ("normal", "error")
QUAD_SHRINK = 0.9
MAX_ERROR_DEG = 45.0
CONTEXT_COLOUR = (40, 40, 40)
TARGET_COLOUR = (220, 30, 30)
CORNERS = ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0))  # patch corners (x, y), in order around it


@dataclass(frozen=True)
class Frustum:
    """One camera: vertical ``fov`` (radians), ``aspect`` (W / H), camera-to-world rotation as a
    quaternion ``wxyz (4,)`` and centre ``position (3,)``, its ``image (H, W, 3)`` uint8 and RGB
    ``colour``; ``target``: whether it is the target view."""

    name: str
    fov: float
    aspect: float
    wxyz: np.ndarray
    position: np.ndarray
    image: np.ndarray
    colour: tuple[int, int, int]
    target: bool


@dataclass(frozen=True)
class Quads:
    """A group of patch quads: ``corners (Q, 4, 3)`` in world coordinates (in order around the
    quad), ``colours (Q, 3)`` uint8 and the ``tokens (Q,)`` they belong to (index into the
    group's views, view-major)."""

    name: str
    corners: np.ndarray
    colours: np.ndarray
    tokens: np.ndarray

    @property
    def faces(self) -> np.ndarray:
        """Two triangles per quad ``(2Q, 3)`` into ``corners.reshape(-1, 3)``, both windings (visible from both
        sides)."""
        base = 4 * np.arange(len(self.corners))[:, None]
        front = np.concatenate([base + [0, 1, 2], base + [0, 2, 3]])
        return np.concatenate([front, front[:, ::-1]])

    def face_colours(self, opacity: float = 1.0) -> np.ndarray:
        """RGBA ``(4Q, 4)`` uint8 of :attr:`faces`, in their order."""
        alpha = np.full((len(self.colours), 1), round(255 * opacity), dtype=np.uint8)
        return np.tile(np.concatenate([self.colours, alpha], 1), (4, 1))


@dataclass(frozen=True)
class Scene3D:
    """Everything the viewer draws, plus a viewpoint: the world ``up`` direction (the cameras' mean
    -y axis), the point to ``look_at`` and an ``eye`` position that sees the cameras and planes."""

    frusta: list[Frustum]
    quads: list[Quads]
    up: np.ndarray
    look_at: np.ndarray
    eye: np.ndarray
    frustum_scale: float
    notes: list[str] = field(default_factory=list)


def rotation_to_wxyz(R: np.ndarray) -> np.ndarray:
    """A rotation matrix ``(3, 3)`` -> unit quaternion ``(w, x, y, z)`` with w >= 0 (Shepperd's method:
    the branch of the largest diagonal term keeps the square root well away from zero)."""
    m = np.asarray(R, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * math.sqrt(1.0 + trace)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] >= m[1, 1] and m[0, 0] >= m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] >= m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    out = np.asarray(q) / np.linalg.norm(q)
    return out if out[0] >= 0 else -out


def patch_quads(
    m: Tensor, cameras: Cameras, grid: tuple[int, int], max_depth: float = 100.0
) -> tuple[np.ndarray, np.ndarray]:
    """The patch quads of planes ``m (V*P, 3)`` seen by ``cameras`` (batch 1, V views).

    Returns ``corners (V*P, 4, 3)`` in world coordinates and ``valid (V*P,)``: whether the plane
    crosses the patch's four corner rays in front of the camera, closer than ``max_depth``.
    """
    V = cameras.num_views
    K = cameras.normalized_K(torch.float64)[0]  # (V, 3, 3)
    m = m.detach().double().cpu().reshape(V, -1, 3)
    rays = torch.stack([patch_rays(K[None], grid, offset)[0] for offset in CORNERS], 2)  # (V, P, 4, 3)
    inverse_depth = (m[:, :, None] * rays).sum(-1)  # m·r̂ = 1 / z
    valid = (inverse_depth > 1.0 / max_depth).all(-1)
    points = rays / torch.where(inverse_depth > 0, inverse_depth, torch.ones_like(inverse_depth))[..., None]
    centre = points.mean(2, keepdim=True)
    points = centre + QUAD_SHRINK * (points - centre)
    to_world = cameras.to(dtype=torch.float64).cam_to_world().cpu()[0]  # (V, 4, 4)
    world = points @ to_world[:, None, :3, :3].transpose(-1, -2) + to_world[:, None, None, :3, 3]
    return world.reshape(-1, 4, 3).numpy(), valid.reshape(-1).numpy()


def _normals(m: Tensor, cameras: Cameras, grid: tuple[int, int]) -> np.ndarray:
    """Unit camera-frame normals facing the camera ``(V*P, 3)`` of planes ``m (V*P, 3)``."""
    normals, _ = Planes.from_m(m.detach().double().cpu()[None]).normal_and_depth(cameras.to(dtype=torch.float64), grid)
    return normals[0].numpy()


def _error_colours(normals: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``(Q, 3)`` uint8: the angle between ``normals`` and ``truth`` on viridis, 0..MAX_ERROR_DEG."""
    from matplotlib import colormaps

    cosine = np.clip((normals * truth).sum(-1), -1.0, 1.0)
    degrees = np.degrees(np.arccos(cosine))
    return (colormaps["viridis"](np.clip(degrees / MAX_ERROR_DEG, 0, 1))[:, :3] * 255 + 0.5).astype(np.uint8)


def _quad_group(name, m, cameras, grid, truth, colour) -> Quads:
    """One :class:`Quads` of planes ``m (V*P, 3)`` seen by ``cameras`` (V views), coloured by normal
    or by error against ``truth (V*P, 3)``; tokens without a quad are left out."""
    corners, valid = patch_quads(m, cameras, grid)
    normals = _normals(m, cameras, grid)
    if colour == "error":
        colours = _error_colours(normals, _normals(truth, cameras, grid))
    else:
        colours = ((normals + 1) / 2 * 255 + 0.5).clip(0, 255).astype(np.uint8)
    return Quads(name, corners[valid], colours[valid], np.flatnonzero(valid))


def _frusta(images: Tensor, cameras: Cameras) -> list[Frustum]:
    """One frustum per view, the last one the target."""
    V = cameras.num_views
    H, W = cameras.image_size
    K = cameras.K.double().cpu()[0]
    to_world = cameras.to(dtype=torch.float64).cam_to_world().cpu()[0].numpy()
    pixels = (images.detach().float().cpu().clamp(0, 1).permute(0, 2, 3, 1).numpy() * 255 + 0.5).astype(np.uint8)
    frusta = []
    for v in range(V):
        target = v == V - 1
        frusta.append(
            Frustum(
                name="target" if target else f"context {v}",
                fov=2 * math.atan(H / (2 * float(K[v, 1, 1]))),
                aspect=(W * float(K[v, 1, 1])) / (H * float(K[v, 0, 0])),
                wxyz=rotation_to_wxyz(to_world[v, :3, :3]),
                position=to_world[v, :3, 3].copy(),
                image=pixels[v],
                colour=TARGET_COLOUR if target else CONTEXT_COLOUR,
                target=target,
            )
        )
    return frusta


def _viewpoint(cameras: Cameras, quads: list[Quads]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``up``, ``look_at``, ``eye`` and the frustum scale: look at the middle of the cameras and quads
    from behind, above and to the right of the cameras, far enough to see all of them."""
    to_world = cameras.to(dtype=torch.float64).cam_to_world().cpu()[0].numpy()
    centres = to_world[:, :3, 3]
    axes = to_world[:, :3, :3].mean(0)  # the cameras' mean x (right), y (down), z (forward) axes
    right, up, forward = (axis / max(np.linalg.norm(axis), 1e-9) for axis in (axes[:, 0], -axes[:, 1], axes[:, 2]))
    points = np.concatenate([centres, *[q.corners.reshape(-1, 3) for q in quads]])
    look_at = np.median(points, axis=0)
    extent = float(np.percentile(np.linalg.norm(points - look_at, axis=1), 75)) + 1e-3
    eye = look_at + extent * (1.0 * up - 2.4 * forward + 0.7 * right)
    baseline = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    spacing = float(np.median(baseline[baseline > 0])) if (baseline > 0).any() else 1.0
    return up, look_at, eye, max(0.3 * spacing, 0.08 * extent)


def build_scene(
    images: Tensor,
    cameras: Cameras,
    grid: tuple[int, int],
    num_context: int,
    context_m: Tensor | None = None,
    target_m: Tensor | None = None,
    truth_m: Tensor | None = None,
    colour: str = "normal",
) -> Scene3D:
    """The :class:`Scene3D` of one example.

    Args:
        images: ``(V, 3, H, W)`` in [0, 1]; the first ``num_context`` views are the context, the
            rest targets (only the LAST view is drawn as the target; others in between are left out).
        cameras: :class:`hrope.Cameras` with batch 1 and V views.
        grid: the patch grid ``(grid_h, grid_w)``; P = grid_h * grid_w.
        context_m: ``(num_context*P, 3)`` planes of the context tokens (None: no context quads).
        target_m: ``(P, 3)`` planes of the target tokens (None: no target quads).
        truth_m: ``(V*P, 3)`` ground-truth planes (needed by ``colour="error"``).
        colour: one of :data:`COLOURINGS`.
    """
    if colour not in COLOURINGS:
        raise VizError(f"colour must be one of {', '.join(COLOURINGS)}, got {colour!r}")
    if colour == "error" and truth_m is None:
        raise VizError("colour 'error' needs ground-truth planes; this data has none (use colour 'normal')")
    V = cameras.num_views
    if not 0 < num_context < V:
        raise VizError(f"need at least one context view and a target, got {num_context} context of {V} views")
    keep = list(range(num_context)) + [V - 1]
    cameras = cameras.select_views(keep)
    P = grid[0] * grid[1]
    truth = None if truth_m is None else truth_m.reshape(V, P, 3)[keep]
    quads = []
    if context_m is not None:
        context_cameras = cameras.select_views(list(range(num_context)))
        context_truth = None if truth is None else truth[:num_context].reshape(-1, 3)
        quads.append(_quad_group("context planes", context_m, context_cameras, grid, context_truth, colour))
    if target_m is not None:
        target_truth = None if truth is None else truth[-1]
        quads.append(_quad_group("target planes", target_m, cameras.select_views([-1]), grid, target_truth, colour))
    up, look_at, eye, scale = _viewpoint(cameras, quads)
    return Scene3D(_frusta(images[keep], cameras), quads, up, look_at, eye, scale)


def is_run(path: Path) -> bool:
    """Whether ``path`` is a run (a checkpoint file, a folder holding one, or a saved model folder)
    rather than a capture."""
    from ..running.checkpoints import CHECKPOINT_NAME
    from ..pretrained import is_pretrained

    return (
        (path.is_file() and path.suffix == ".safetensors") or (path / CHECKPOINT_NAME).is_file() or is_pretrained(path)
    )


def run_scene(checkpoint: str | Path, scene: int = 0, layer: int = -1, colour: str = "normal", device="cpu") -> Scene3D:
    """The :class:`Scene3D` of held-out scene ``scene`` of a run: its context views and first target,
    the model's planes (``layer`` of its predictions) for context and target tokens; a model
    without planes shows the data's context planes and those carried into the target
    (:func:`hrope.nvs.sources.transfer.transfer_planes`)."""
    from ..build_data import build_dataset, collate
    from ..pretrained import load_trained

    model, config = load_trained(checkpoint, device)
    dataset = build_dataset(config, "eval")
    if not 0 <= scene < len(dataset):
        raise VizError(f"scene {scene} is out of range: the run's held-out split has {len(dataset)} scenes")
    num_context = config.data.num_context
    batch = collate([dataset[scene]], num_context, torch.device(device))
    keep = list(range(num_context + 1))
    cameras = batch.cameras.select_views(keep)
    grid, p = model.config.grid, model.config.patch_size
    P = grid[0] * grid[1]
    truth = batch.planes(p)
    truth_m = None if truth is None else truth.m(batch.cameras, grid, torch.float64)[0, : (num_context + 1) * P]
    takes_planes = model.source is not None and "planes" in {s.name for s in model.source.specs}
    if not takes_planes:
        return _data_scene(batch.images[0, keep], cameras, grid, num_context, truth_m, colour)
    with torch.no_grad():
        output = model(batch)
    count = len(output.parameters)
    if not -count <= layer < count:
        raise VizError(f"layer {layer} is out of range: the model predicts planes {count} time(s)")
    m = output.parameters[layer]["planes"][0]  # the first target's sequence: (Vc+1)*P tokens
    if m.ndim == 3:  # planes per attention head: the first head's
        m = m[:, 0]
    return build_scene(
        batch.images[0, keep], cameras, grid, num_context, m[: num_context * P], m[num_context * P :], truth_m, colour
    )


def _data_scene(images, cameras, grid, num_context, truth_m, colour) -> Scene3D:
    """Context planes from the data, carried into the target; no quads without data planes."""
    from ..sources.transfer import transfer_planes

    if truth_m is None:
        return build_scene(images, cameras, grid, num_context, colour=colour)
    P = grid[0] * grid[1]
    context_m = truth_m[: num_context * P]
    carried, _ = transfer_planes(context_m[None], cameras.to(dtype=torch.float64), grid, num_context)
    return build_scene(images, cameras, grid, num_context, context_m, carried[0, -P:], truth_m, colour)


def capture_scene(
    path: str | Path,
    views: list[int] | None = None,
    image_size: int = 128,
    patch_size: int = 8,
    colour: str = "normal",
    depth: str = "none",
) -> Scene3D:
    """The :class:`Scene3D` of a scene folder (any format of :mod:`hrope.nvs.data.real.loaders`):
    ``views`` (default the first three; the last one is the target) resized and centre-cropped to
    ``image_size`` squares. With ``depth`` (``points``: COLMAP's 3D points, ``maps``: the depth maps
    named in transforms.json; :mod:`hrope.nvs.data.real.depth_maps`) the context views' planes are
    fitted to it on ``patch_size`` patches and carried into the target."""
    from ..data.real.depth_maps import load_frames
    from ..data.real.loaders import scene_frames

    views = [0, 1, 2] if views is None else views
    if len(views) < 2:
        raise VizError(f"--views needs at least two views (context, then the target), got {views}")
    if image_size % patch_size:
        raise VizError(f"--image-size {image_size} is not divisible by --patch-size {patch_size}")
    scene = load_frames(scene_frames(path), Path(path).name, (image_size, image_size), views, depth=depth)
    grid = (image_size // patch_size, image_size // patch_size)
    planes = scene.planes(patch_size)
    truth_m = None if planes is None else planes.m(scene.cameras, grid, torch.float64)[0]
    return _data_scene(scene.images, scene.cameras, grid, len(views) - 1, truth_m, colour)
