"""SfM points of a capture, triangulated from its posed images with the cameras held fixed (pycolmap), cached.

:func:`triangulate` reads only the listed views (the caller's training views; views it is not given
are never opened), and runs COLMAP (pycolmap, the ``sfm`` extra) on them:

1. each view decoded as the loaders decode it (:func:`hrope.nvs.data.real.frames.load_view` at the
   file's own size: undistorted, alpha composited, EXIF-rotated) and handed to COLMAP as a PNG;
2. SIFT features (COLMAP's defaults, at most ``max_features`` per view);
3. matching with geometric verification (RANSAC seeded): every pair of views (``neighbours`` 0),
   or each view with its ``neighbours`` nearest views by the angle between optical axes;
4. COLMAP's point triangulator with the loader's cameras held fixed (its bundle adjustment moves
   the points only, never a pose or an intrinsic); then every observation whose reprojection
   error (measured here, float64) exceeds ``max_reprojection_error`` is dropped, and every point
   left with a track shorter than ``min_track_length`` views.

**Conventions.** COLMAP's are the project's: world-to-camera with OpenCV axes (``cam_from_world``),
K in pixels with the centre of the top-left pixel at (0.5, 0.5), keypoints in the same pixels; so
K and ``[R | t]`` pass unchanged (a PINHOLE camera ``fx fy cx cy`` per view). Points are in the
capture's world frame, as the loader's cameras are (before :func:`hrope.nvs.data.normalize_scene`).

:func:`sparse_depth` turns the points into per-view sparse depth for a loaded scene (its final
cameras, after any resize / crop): each triangulated view gets the z-depth of the points it
observes, a view that was not triangulated gets none (all ``inf``): the leak rule's guarantee.
Results are cached on disk (:mod:`hrope.nvs.data.real.sfm_cache`).
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ...config.fields import one_line
from ...running.atomic import atomic_open, write_text
from ..scene import Scene, SceneError
from .colmap_points import point_depth
from .frames import Frame, load_view
from .loaders import scene_frames
from .sfm_cache import cache_key, cache_path, load_points, save_points

__all__ = ["SfmSettings", "SfmPoints", "triangulate", "sparse_depth"]

logger = logging.getLogger("hrope.nvs.data")


@dataclass(frozen=True)
class SfmSettings:
    """What :func:`triangulate` runs (module doc); every field is part of the cache key.

    Args:
        max_features: SIFT features per view at most (COLMAP's default 8192).
        neighbours: k > 0 matches each view with its k nearest views by the angle between
            optical axes (fewer false matches and a third of the time of every pair on the NeRD
            captures: docs/real_data.md); 0 matches every pair of views.
        max_reprojection_error: pixels; observations reprojecting farther are dropped (COLMAP's default 4).
        min_track_length: views a kept point is observed in, at least (2 or more).
        min_triangulation_angle: degrees; COLMAP's least angle between rays of a new or kept point (its default 1.5).
    """

    max_features: int = 8192
    neighbours: int = 10
    max_reprojection_error: float = 4.0
    min_track_length: int = 2
    min_triangulation_angle: float = 1.5

    def __post_init__(self) -> None:
        for name, least in (("max_features", 1), ("neighbours", 0), ("min_track_length", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SceneError(f"SfmSettings.{name} must be an integer >= {least}, got {value!r}")
        for name in ("max_reprojection_error", "min_triangulation_angle"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SceneError(f"SfmSettings.{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class SfmPoints:
    """SfM points of a capture.

    Attributes:
        xyz: ``(P, 3)`` float64 world points (the capture's frame).
        views: the triangulated views (indices into the capture's frames), in the order given.
        observations: per triangulated view, ``(point (N,) int64 rows of xyz, pixel (N, 2) float64
            xy in the view's native image, pixel centres at +0.5)``.
        cameras: ``(T, 4, 4)`` float64 world-to-camera of ``views``.
        stats: ``points``, ``median_reprojection_px`` (over observations), ``mean_track_length``,
            ``median_track_length``, ``views``, ``observing_views``, ``verified_pairs`` (with 15
            inlier matches or more), ``seconds`` and ``cpu_seconds`` (all threads) of the
            triangulation (also when loaded from the cache).
    """

    xyz: Tensor
    views: tuple[int, ...]
    observations: dict[int, tuple[Tensor, Tensor]]
    cameras: Tensor
    stats: dict[str, Any]


def _pycolmap() -> Any:
    try:
        import pycolmap
    except ImportError as error:
        raise SceneError(f"SfM triangulation needs pycolmap ({one_line(error)}): pip install 'hrope[sfm]'") from error
    return pycolmap


def _pycolmap_version() -> str:
    try:
        return importlib.metadata.version("pycolmap")
    except importlib.metadata.PackageNotFoundError as error:
        raise SceneError("SfM triangulation needs pycolmap (not installed): pip install 'hrope[sfm]'") from error


def _name(view: int) -> str:
    return f"view{view:05d}.png"


def _colmap_inputs(pycolmap: Any, frames: list[Frame], views: list[int], folder: Path) -> tuple[Any, Tensor]:
    """The views written as PNGs in ``folder`` and a reconstruction of their fixed cameras (image
    and camera ids 1..T in view order); also the views' ``K (T, 3, 3)`` float64."""
    reconstruction, Ks = pycolmap.Reconstruction(), []
    for n, (view, frame) in enumerate(zip(views, frames), 1):
        image, K = load_view(frame)
        pixels = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        with atomic_open(folder / _name(view), "wb", durable=False) as handle:  # COLMAP's input, in a temporary folder
            Image.fromarray(pixels).save(handle, format="PNG")
        fx, fy, cx, cy = K[0, 0].item(), K[1, 1].item(), K[0, 2].item(), K[1, 2].item()
        height, width = pixels.shape[:2]
        camera = pycolmap.Camera(model="PINHOLE", width=width, height=height, params=[fx, fy, cx, cy], camera_id=n)
        reconstruction.add_camera_with_trivial_rig(camera)
        E = frame.world_to_cam.double().numpy()
        pose = pycolmap.Rigid3d(pycolmap.Rotation3d(E[:3, :3]), E[:3, 3])
        reconstruction.add_image_with_trivial_frame(pycolmap.Image(name=_name(view), camera_id=n, image_id=n), pose)
        Ks.append(K.double())
    return reconstruction, torch.stack(Ks)


def _database(pycolmap: Any, reconstruction: Any, path: Path) -> None:
    """A COLMAP database holding the reconstruction's cameras, rigs, frames and images under their ids."""
    database = pycolmap.Database.open(path)
    try:
        for camera in reconstruction.cameras.values():
            database.write_camera(camera, use_camera_id=True)
        for rig in reconstruction.rigs.values():
            database.write_rig(rig, use_rig_id=True)
        for frame in reconstruction.frames.values():
            database.write_frame(frame, use_frame_id=True)
        for image in reconstruction.images.values():
            database.write_image(image, use_image_id=True)
    finally:
        database.close()


def _nearest_pairs(world_to_cam: Tensor, neighbours: int) -> list[tuple[int, int]]:
    """Pairs ``(a, b)``, ``a < b``, of each view with its ``neighbours`` nearest by optical-axis angle."""
    axes = world_to_cam[:, 2, :3].double()  # the camera's +z in world axes (a row of R)
    angle = torch.arccos((axes @ axes.T).clamp(-1, 1)).fill_diagonal_(math.inf)
    nearest = angle.argsort(dim=1)[:, : min(neighbours, len(axes) - 1)]
    return sorted({(min(a, int(b)), max(a, int(b))) for a in range(len(axes)) for b in nearest[a]})


def _match(pycolmap: Any, database: Path, names: list[str], world_to_cam: Tensor, neighbours: int) -> None:
    matching = pycolmap.FeatureMatchingOptions()
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = 0
    device = pycolmap.Device.cpu
    if neighbours == 0 or neighbours >= len(names) - 1:
        pycolmap.match_exhaustive(database, matching_options=matching, verification_options=verification, device=device)
        return
    pairs = database.parent / "pairs.txt"
    write_text(pairs, "".join(f"{names[a]} {names[b]}\n" for a, b in _nearest_pairs(world_to_cam, neighbours)))
    pycolmap.match_image_pairs(
        database,
        matching_options=matching,
        pairing_options=pycolmap.ImportedPairingOptions(match_list_path=pairs),
        verification_options=verification,
        device=device,
    )


def _run_colmap(frames: list[Frame], views: list[int], settings: SfmSettings) -> tuple[Any, Tensor, int]:
    """COLMAP's triangulation of the views (module doc, steps 1-4 before the filter): the
    reconstruction, the views' K and the number of verified pairs."""
    pycolmap = _pycolmap()
    level = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 2  # errors only
    try:
        with tempfile.TemporaryDirectory(prefix="hrope-sfm-") as work:
            folder, database = Path(work) / "images", Path(work) / "database.db"
            folder.mkdir()
            reconstruction, Ks = _colmap_inputs(pycolmap, frames, views, folder)
            _database(pycolmap, reconstruction, database)
            extraction = pycolmap.FeatureExtractionOptions()
            extraction.sift.max_num_features = settings.max_features
            names = [_name(view) for view in views]
            pycolmap.extract_features(
                database, folder, image_names=names, extraction_options=extraction, device=pycolmap.Device.cpu
            )
            world_to_cam = torch.stack([frame.world_to_cam.double() for frame in frames])
            _match(pycolmap, database, names, world_to_cam, settings.neighbours)
            opened = pycolmap.Database.open(database)
            least = pycolmap.TwoViewGeometryOptions().min_num_inliers
            pairs = sum(len(geometry.inlier_matches) >= least for geometry in opened.read_two_view_geometries()[1])
            opened.close()
            options = pycolmap.IncrementalPipelineOptions()
            options.random_seed = 0
            options.triangulation.min_angle = settings.min_triangulation_angle
            options.triangulation.ignore_two_view_tracks = settings.min_track_length > 2
            options.mapper.filter_min_tri_angle = settings.min_triangulation_angle
            options.mapper.filter_max_reproj_error = settings.max_reprojection_error
            output = Path(work) / "model"
            output.mkdir()
            result = pycolmap.triangulate_points(reconstruction, database, folder, output, options=options)
    finally:
        pycolmap.logging.minloglevel = level
    return result, Ks, pairs


def _observations(result: Any, count: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(xyz (M, 3), view position (N,), point row (N,), pixel (N, 2))`` of every observation of the
    reconstruction (image ids 1..count)."""
    ids = sorted(result.points3D)
    row = {point_id: n for n, point_id in enumerate(ids)}
    xyz = torch.tensor(np.array([result.points3D[i].xyz for i in ids]).reshape(-1, 3), dtype=torch.float64)
    positions, rows, pixels = [], [], []
    for n in range(count):
        observed = result.images[n + 1].get_observation_points2D()
        positions += [n] * len(observed)
        rows += [row[point.point3D_id] for point in observed]
        pixels += [point.xy for point in observed]
    pixel = torch.tensor(np.array(pixels).reshape(-1, 2), dtype=torch.float64)
    return xyz, torch.tensor(positions, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64), pixel


def _reprojection_errors(xyz: Tensor, Ks: Tensor, world_to_cam: Tensor, position: Tensor, pixel: Tensor) -> Tensor:
    """Pixel distance ``(N,)`` of each observation from its point's projection (inf behind the camera)."""
    E = world_to_cam[position]
    X = (E[:, :3, :3] @ xyz[:, :, None])[..., 0] + E[:, :3, 3]
    uv = (Ks[position] @ X[:, :, None])[..., 0]
    error = (uv[:, :2] / uv[:, 2:] - pixel).norm(dim=1)
    return torch.where(X[:, 2] > 0, error, torch.full_like(error, math.inf))


def _filtered(xyz, Ks, world_to_cam, position, point, pixel, settings: SfmSettings) -> tuple[Tensor, ...]:
    """The observations within ``max_reprojection_error`` of points whose track (distinct views)
    keeps at least ``min_track_length``; points reindexed. Returns ``(xyz, position, point, pixel, error)``."""
    error = _reprojection_errors(xyz[point], Ks, world_to_cam, position, pixel)
    good = error <= settings.max_reprojection_error
    position, point, pixel, error = position[good], point[good], pixel[good], error[good]
    views_of = torch.zeros(len(xyz), len(Ks), dtype=torch.bool)
    views_of[point, position] = True
    kept = views_of.sum(1) >= settings.min_track_length
    new_row = torch.cumsum(kept.long(), 0) - 1
    keep = kept[point]
    return xyz[kept], position[keep], new_row[point[keep]], pixel[keep], error[keep]


def _compute(frames: list[Frame], views: list[int], settings: SfmSettings) -> tuple[dict[str, Tensor], dict]:
    """The cache entry's tensors and stats (:mod:`hrope.nvs.data.real.sfm_cache`) of a fresh triangulation."""
    start, cpu = time.perf_counter(), time.process_time()
    result, Ks, pairs = _run_colmap(frames, views, settings)
    world_to_cam = torch.stack([frame.world_to_cam.double() for frame in frames])
    observed = _observations(result, len(views))
    xyz, position, point, pixel, error = _filtered(observed[0], Ks, world_to_cam, *observed[1:], settings)
    order = torch.argsort(position, stable=True)
    track = torch.bincount(point, minlength=len(xyz)).double()
    stats = {
        "points": len(xyz),
        "median_reprojection_px": float(error.median()) if len(error) else math.nan,
        "mean_track_length": float(track.mean()) if len(xyz) else math.nan,
        "median_track_length": float(track.median()) if len(xyz) else math.nan,
        "views": len(views),
        "observing_views": int(torch.unique(position).numel()),
        "verified_pairs": int(pairs),
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_seconds": round(time.process_time() - cpu, 3),
    }
    tensors = {
        "xyz": xyz,
        "cameras": world_to_cam,
        "observed_counts": torch.bincount(position, minlength=len(views)),
        "observed_points": point[order],
        "observed_pixels": pixel[order],
    }
    return tensors, stats


def _points(tensors: dict[str, Tensor], views: list[int], stats: dict) -> SfmPoints:
    counts = tensors["observed_counts"].tolist()
    points = tensors["observed_points"].split(counts)
    pixels = tensors["observed_pixels"].split(counts)
    observations = {view: (p, x) for view, p, x in zip(views, points, pixels)}
    return SfmPoints(tensors["xyz"], tuple(views), observations, tensors["cameras"], stats)


def _checked_views(views: Sequence[int], count: int, name: str) -> list[int]:
    chosen = [int(view) for view in views]
    if len(chosen) < 2 or len(set(chosen)) != len(chosen) or any(not 0 <= v < count for v in chosen):
        raise SceneError(
            f"{name}: triangulate needs 2 or more distinct view indices in 0..{count - 1}, got {list(views)}"
        )
    return chosen


def triangulate(
    capture: str | Path | Sequence[Frame],
    views: Sequence[int],
    *,
    cache_dir: str | Path | None,
    settings: SfmSettings = SfmSettings(),
    name: str | None = None,
    image_factor: int | None = None,
) -> SfmPoints:
    """SfM points of ``views`` of ``capture`` (module doc), from the cache in ``cache_dir`` when
    there (None: no cache).

    ``capture``: a scene folder (read by :func:`hrope.nvs.data.real.loaders.scene_frames`, which
    ``image_factor`` N points at ``images_N/``) or its frames; ``views`` index those frames (2 or
    more, distinct; only these images are read). ``name`` names the capture in the cache file and
    in errors (default: the folder's name).
    A :class:`SceneError` for bad views, missing pycolmap or an invalid cache file.
    """
    if isinstance(capture, (str, Path)):
        frames = scene_frames(capture, image_factor=image_factor)
        name = name or Path(capture).resolve().name
    else:
        frames, name = list(capture), name or "capture"
    chosen = _checked_views(views, len(frames), name)
    listed = [frames[view] for view in chosen]
    path, key, stored = None, "", None
    if cache_dir is not None:
        key = cache_key(listed, chosen, asdict(settings), _pycolmap_version())
        path = cache_path(cache_dir, name, key)
        stored = load_points(path, key, chosen)
    if stored is None:
        stored = _compute(listed, chosen, settings)
        if path is not None:
            save_points(path, key, chosen, *stored)
            logger.info("%s: %d SfM points from %d views cached in %s", name, stored[1]["points"], len(chosen), path)
    return _points(stored[0], chosen, stored[1])


def _same_camera(stored: Tensor, world_to_cam: Tensor) -> bool:
    """Whether two world-to-camera transforms agree (float32 precision): same rotation and centre."""
    R, R_scene = stored[:3, :3], world_to_cam[:3, :3].double()
    centre, centre_scene = -R.T @ stored[:3, 3], -R_scene.T @ world_to_cam[:3, 3].double()
    tolerance = 1e-4 * (1 + float(centre.norm()))
    return bool((R - R_scene).abs().max() < 1e-4 and (centre - centre_scene).norm() < tolerance)


def sparse_depth(points: SfmPoints, scene: Scene, views_of_scene: Sequence[int]) -> Tensor:
    """Sparse z-depth ``(V, H, W)`` float32 of ``scene``'s views: for a triangulated view, the points
    it observes projected with the scene's final cameras (after resize / crop, before
    normalisation; :func:`hrope.nvs.data.real.colmap_points.point_depth`: nearest point per pixel);
    ``inf`` elsewhere, and everywhere in a view that was not triangulated.

    ``views_of_scene[v]`` is the capture's frame index of the scene's view ``v``. A
    :class:`SceneError` when a triangulated view's camera in the scene is not the one the points
    were triangulated with (e.g. a scene already normalised).
    """
    if len(views_of_scene) != scene.num_views:
        raise SceneError(f"{scene.name}: views_of_scene lists {len(views_of_scene)} views for {scene.num_views}")
    position = {view: n for n, view in enumerate(points.views)}
    depths = []
    for v, view in enumerate(views_of_scene):
        K, world_to_cam = scene.cameras.K[0, v], scene.cameras.world_to_cam[0, v]
        if int(view) not in position:
            depths.append(torch.full(scene.image_size, math.inf))
            continue
        if not _same_camera(points.cameras[position[int(view)]], world_to_cam):
            raise SceneError(
                f"{scene.name}: view {v} (frame {view}) has another camera than the one its SfM points were "
                "triangulated with (a normalised scene? take sparse_depth before normalize_scene)"
            )
        rows = points.observations[int(view)][0]
        depths.append(point_depth(points.xyz[rows], K, world_to_cam, scene.image_size))
    return torch.stack(depths)
