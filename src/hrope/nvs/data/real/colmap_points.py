"""Sparse depth from a COLMAP model's 3D points (``points3D.txt`` / ``.bin`` + the images' tracks).

``points3D.txt`` lines: ``POINT3D_ID X Y Z R G B ERROR TRACK[]`` (world coordinates; the track is
not read here; ``points3D.bin`` holds the same records, :mod:`hrope.nvs.data.real.colmap_binary`).
Which points an image observes comes from its POINTS2D line in ``images.txt`` (``x y POINT3D_ID``
triples; ``POINT3D_ID`` -1 means no 3D point) or its 2D points in ``images.bin``, which
:func:`hrope.nvs.data.real.colmap.read_colmap_frames` keeps on every frame (``Frame.tracks``).

:func:`with_point_depth` projects every view's observed points with the scene's FINAL cameras
(after any resize / crop the loader applied, before scene normalisation), so the sparse depth
lines up with the images and :func:`hrope.nvs.data.normalize_scene` rescales it like every
other depth: a point goes to the pixel its projection falls in, with its z-depth; the nearest
point wins a pixel; every other pixel is ``inf``. A point at a pixel centre is reproduced
exactly by back-projecting that pixel; elsewhere it moves sideways by under half a pixel.

:func:`write_colmap_model` writes a :class:`Scene` with depth (e.g. a synthetic one) as a COLMAP
text model with points sampled from its depth maps: fixtures for tests and the walkthrough.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ...running.atomic import save_image, write_text
from ..scene import Scene, SceneError
from .colmap import _check_count, _floats, _integer, _read_model_file
from .colmap_binary import read_points3d_bin
from .frames import Frame

__all__ = [
    "MIN_PLANE_POINTS",
    "read_points3d",
    "observed_points",
    "point_depth",
    "with_point_depth",
    "rotation_to_quaternion",
    "write_colmap_model",
]

MIN_PLANE_POINTS = 3  # a plane needs three points: a scene whose every view sees fewer is an error


def read_points3d(path: str | Path) -> tuple[Tensor, Tensor]:
    """``(ids (M,) int64 sorted, xyz (M, 3) float64 world)`` of ``points3D.txt`` or ``points3D.bin``
    (cached per file version)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as error:
        raise SceneError(
            f"{path}: cannot read the COLMAP points (data.depth 'points' needs points3D{path.suffix} next to "
            f"images{path.suffix}): {error}"
        ) from error
    return _read_points3d(path, stat.st_mtime_ns, stat.st_size)


def _text_points(path: Path) -> tuple[Tensor, Tensor]:
    """``(ids, xyz)`` of ``points3D.txt`` in file order."""
    lines, declared = _read_model_file(path, "points")
    found: list[int] = []
    rows: list[list[float]] = []
    for n, line in lines:
        if not line:
            continue
        tokens, where = line.split(), f"{path}:{n}"
        if len(tokens) < 8:
            raise SceneError(f"{where}: expected 'POINT3D_ID X Y Z R G B ERROR TRACK[]', got {line!r}")
        found.append(_integer(tokens[0], where, "POINT3D_ID"))
        point = _floats(tokens[1:4], where, "X Y Z")
        if not np.isfinite(point).all():
            raise SceneError(f"{where}: field X Y Z must be finite, got {' '.join(tokens[1:4])}")
        rows.append(point)
    _check_count(path, "points", declared, len(found))
    return torch.tensor(found, dtype=torch.int64), torch.tensor(rows, dtype=torch.float64).reshape(-1, 3)


def _binary_points(path: Path) -> tuple[Tensor, Tensor]:
    """``(ids, xyz)`` of ``points3D.bin`` in file order."""
    ids, xyz = read_points3d_bin(path)
    bad = np.flatnonzero(~np.isfinite(xyz).all(1))
    if len(bad):
        raise SceneError(f"{path} record {bad[0]}: field X Y Z must be finite, got {xyz[bad[0]].tolist()}")
    return torch.from_numpy(ids), torch.from_numpy(xyz)


@functools.lru_cache(maxsize=8)
def _read_points3d(path: Path, mtime_ns: int, size: int) -> tuple[Tensor, Tensor]:
    ids, xyz = _binary_points(path) if path.suffix == ".bin" else _text_points(path)
    ids, order = ids.sort()
    if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
        raise SceneError(f"{path}: field POINT3D_ID {int(ids[1:][ids[1:] == ids[:-1]][0])} repeats")
    return ids, xyz[order]


def _point_ids(points2d: str | Tensor, label: str) -> Tensor:
    """The POINT3D_IDs ``(N,)`` int64 of a POINTS2D line (text) or of a binary image's points."""
    if isinstance(points2d, Tensor):
        return points2d
    tokens = points2d.split()
    if len(tokens) % 3:
        raise SceneError(f"{label}: field POINTS2D must be 'x y POINT3D_ID' triples, got {len(tokens)} numbers")
    return torch.tensor([_integer(token, label, "POINTS2D POINT3D_ID") for token in tokens[2::3]], dtype=torch.int64)


def observed_points(points3d: str | Path, points2d: str | Tensor, label: str) -> Tensor:
    """World points ``(M, 3)`` float64 that one image observes: the distinct valid ``POINT3D_ID`` s of its
    POINTS2D (a text line, or a binary model's ids) looked up in ``points3d``; ``label`` names the image
    in errors."""
    wanted = _point_ids(points2d, label).unique()
    wanted = wanted[wanted != -1]
    ids, xyz = read_points3d(points3d)
    row = torch.searchsorted(ids, wanted).clamp_max(max(len(ids) - 1, 0))
    missing = wanted[(ids[row] != wanted) if len(ids) else torch.ones_like(wanted, dtype=torch.bool)]
    if len(missing):
        raise SceneError(
            f"{label}: field POINTS2D refers to POINT3D_ID {int(missing[0])}, which {points3d} "
            f"does not hold ({len(missing)} such id(s))"
        )
    return xyz[row]


def point_depth(points: Tensor, K: Tensor, world_to_cam: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Sparse z-depth ``(H, W)`` float32 of world ``points (M, 3)`` seen by the camera ``K (3, 3)``
    (pixels of ``image_size``), ``world_to_cam (4, 4)``: each point in front of the camera goes to
    the pixel its projection falls in, the nearest one per pixel; ``inf`` elsewhere."""
    H, W = image_size
    points = points.double()
    X = points @ world_to_cam[:3, :3].double().T + world_to_cam[:3, 3].double()
    z = X[:, 2]
    front = z > 0
    uv = (X @ K.double().T)[:, :2] / torch.where(front, z, torch.ones_like(z))[:, None]
    column, row = uv.floor().long().unbind(-1)
    inside = front & (column >= 0) & (column < W) & (row >= 0) & (row < H)
    depth = torch.full((H * W,), float("inf"), dtype=torch.float64)
    depth.scatter_reduce_(0, (row * W + column)[inside], z[inside], reduce="amin")
    return depth.reshape(H, W).float()


def with_point_depth(scene: Scene, frames: list[Frame]) -> Scene:
    """``scene`` with ``depth`` the sparse depth of each view's COLMAP points (module doc);
    ``frames`` are its views' frames, in order. A :class:`SceneError` when a frame has no COLMAP
    tracks, and when no view sees :data:`MIN_PLANE_POINTS` points (the message gives the counts)."""
    depths, sources = [], []
    for v, frame in enumerate(frames):
        if frame.tracks is None:
            raise SceneError(
                f"{frame.label}: data.depth 'points' needs a COLMAP model (points3D.txt and the "
                "images' POINTS2D); this frame has none"
            )
        sources.append(frame.tracks[0])
        points = observed_points(*frame.tracks, frame.label)
        depths.append(point_depth(points, scene.cameras.K[0, v], scene.cameras.world_to_cam[0, v], scene.image_size))
    depth = torch.stack(depths)
    counts = torch.isfinite(depth).flatten(1).sum(1).tolist()
    if max(counts) < MIN_PLANE_POINTS:
        raise SceneError(
            f"{scene.name}: too few SfM points for any plane: its {len(counts)} view(s) see {counts} "
            f"point(s) (a plane needs {MIN_PLANE_POINTS}; points from {sources[0]})"
        )
    return replace(scene, depth=depth)


def rotation_to_quaternion(R: Tensor) -> Tensor:
    """The unit quaternion ``(w, x, y, z)`` (w >= 0) of a rotation ``R (3, 3)``; inverse of
    :func:`hrope.nvs.data.real.colmap.quaternion_to_rotation`."""
    R = R.double()
    w = (1 + R.trace()).clamp_min(0).sqrt() / 2
    xyz = (
        1 + torch.stack([R[0, 0] - R[1, 1] - R[2, 2], R[1, 1] - R[0, 0] - R[2, 2], R[2, 2] - R[0, 0] - R[1, 1]])
    ).clamp_min(0).sqrt() / 2
    signs = torch.stack([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]]).sign()
    return torch.cat([w[None], xyz * torch.where(signs == 0, 1.0, signs)])


def write_colmap_model(scene: Scene, folder: str | Path, points_per_view: int = 200, seed: int = 0) -> Path:
    """Write ``scene`` (with ``depth``) as a COLMAP text model: ``folder/images/NNN.png``,
    ``folder/sparse/0/{cameras,images,points3D}.txt`` (one PINHOLE camera per view).

    Each view contributes ``points_per_view`` points at the centres of pixels drawn at random
    (``seed``) among those with finite depth, lifted to the world with its depth and observed by
    that view only. Returns ``folder``.
    """
    if scene.depth is None:
        raise SceneError(f"{scene.name}: write_colmap_model needs a scene with depth")
    folder = Path(folder)
    model = folder / "sparse" / "0"
    generator = torch.Generator().manual_seed(seed)
    H, W = scene.image_size
    cameras: list[str] = []
    images: list[str] = []
    points: list[str] = []
    for v in range(scene.num_views):
        K, E = scene.cameras.K[0, v].double(), scene.cameras.world_to_cam[0, v].double()
        name = f"{v:03d}.png"
        array = (scene.images[v].permute(1, 2, 0) * 255).round().byte().numpy()
        save_image(Image.fromarray(array), folder / "images" / name)
        cameras.append(f"{v + 1} PINHOLE {W} {H} {K[0, 0]:.17g} {K[1, 1]:.17g} {K[0, 2]:.17g} {K[1, 2]:.17g}")
        q, t = rotation_to_quaternion(E[:3, :3]).tolist(), E[:3, 3].tolist()
        images.append(f"{v + 1} {' '.join(f'{x:.17g}' for x in q + t)} {v + 1} {name}")
        pixels = torch.isfinite(scene.depth[v]).flatten().nonzero()[:, 0]
        pixels = pixels[torch.randperm(len(pixels), generator=generator)[:points_per_view]]
        row, column = pixels // W, pixels % W
        centre = torch.stack([column + 0.5, row + 0.5, torch.ones_like(row)], -1).double()
        camera = (centre @ torch.linalg.inv(K).T) * scene.depth[v].flatten()[pixels].double()[:, None]
        world = (camera - E[:3, 3]) @ E[:3, :3]  # R^T (X - t)
        colours = (scene.images[v].flatten(1)[:, pixels].T * 255).round().long().tolist()
        track = []
        for k, (point, colour) in enumerate(zip(world.tolist(), colours)):
            point_id = len(points) + 1
            points.append(
                f"{point_id} {' '.join(f'{x:.17g}' for x in point)} {' '.join(map(str, colour))} 0 {v + 1} {k}"
            )
            track.append(f"{centre[k, 0]:g} {centre[k, 1]:g} {point_id}")
        images.append(" ".join(track))
    write_text(model / "cameras.txt", f"# Number of cameras: {len(cameras)}\n" + "\n".join(cameras) + "\n")
    write_text(model / "images.txt", f"# Number of images: {scene.num_views}\n" + "\n".join(images) + "\n")
    write_text(model / "points3D.txt", f"# Number of points: {len(points)}\n" + "\n".join(points) + "\n")
    return folder
