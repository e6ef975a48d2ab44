"""The disk cache of :func:`hrope.nvs.data.real.sfm.triangulate`: SfM points stored once per input.

- **Key.** The SHA-256 of: :data:`FORMAT_VERSION`, pycolmap's version, the settings, the list of
  views, and per view the SHA-256 of its image file's bytes with its camera as the loader gives it
  (K, intrinsics size, world-to-camera, lens model, background). Any edited image or camera, another
  choice of views or another setting gets a new key; old files stay unused (delete them to reclaim
  the space).
- **Format.** ``CAPTURE-KEY.safetensors`` (the capture's name, then 32 hex digits of the key):
  tensors ``xyz (P, 3)`` float64, ``cameras (T, 4, 4)`` float64 (world-to-camera of the T
  triangulated views), ``observed_counts (T,)`` int64, ``observed_points (N,)`` int64 and
  ``observed_pixels (N, 2)`` float64 (each view's observations one after the other, in view order);
  metadata ``format``, ``key``, ``views`` and ``stats`` (JSON). Safetensors holds raw arrays and a
  JSON header only: reading one never runs code from the file.
- **Safety.** Written atomically (:mod:`hrope.nvs.running.atomic`): a reader sees a whole file or
  none. A file at the key's path that is not such a file (unreadable, truncated, another format, a
  pickle, a wrong shape or dtype, non-finite numbers, point indices out of range, another key or
  views) is an error naming the file and saying to delete it: it is never silently replaced, since a
  damaged cache says something about the disk or the folder. A cache that cannot be written logs one
  warning and the points are returned uncached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import torch
from torch import Tensor

from ...running.atomic import StorageError, atomic_path
from ..scene import SceneError
from .frames import Frame

__all__ = ["FORMAT_VERSION", "SfmCacheError", "cache_key", "cache_path", "save_points", "load_points"]

logger = logging.getLogger("hrope.nvs.data")

FORMAT_VERSION = 1
_FORMAT = "hrope-sfm"
_TENSORS = {  # name -> (dtype, trailing shape)
    "xyz": (torch.float64, (3,)),
    "cameras": (torch.float64, (4, 4)),
    "observed_counts": (torch.int64, ()),
    "observed_points": (torch.int64, ()),
    "observed_pixels": (torch.float64, (2,)),
}


class SfmCacheError(SceneError):
    """A file in the SfM cache that is not a valid cache entry (module doc)."""


def _image_digest(frame: Frame) -> str:
    """SHA-256 of the frame's encoded image (its file's bytes, or the bytes it holds)."""
    if isinstance(frame.image, Path):
        try:
            data = frame.image.read_bytes()
        except OSError as error:
            raise SceneError(f"{frame.label}: cannot read image {frame.image}: {error}") from error
    else:
        data = frame.image if isinstance(frame.image, bytes) else frame.image.numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def cache_key(frames: list[Frame], views: list[int], settings: dict, version: str) -> str:
    """The key (64 hex digits) of triangulating ``frames`` (the listed views' frames, in order)."""
    parts: list = [FORMAT_VERSION, version, settings, views]
    for frame in frames:
        lens = frame.distortion and [frame.distortion.kind, list(frame.distortion.coefficients)]
        camera = [frame.K.tolist(), frame.intrinsics_size and list(frame.intrinsics_size), frame.world_to_cam.tolist()]
        parts.append([_image_digest(frame), camera, lens, frame.background and list(frame.background)])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def cache_path(cache_dir: str | Path, name: str, key: str) -> Path:
    """Where the points of ``key`` live: ``cache_dir/NAME-KEY32.safetensors``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "capture"
    return Path(cache_dir).expanduser() / f"{safe}-{key[:32]}.safetensors"


def save_points(path: Path, key: str, views: list[int], tensors: dict[str, Tensor], stats: dict) -> None:
    """Write one cache entry atomically; a storage fault logs a warning (the points stay uncached)."""
    from safetensors.torch import save_file

    metadata = {"format": _FORMAT, "key": key, "views": json.dumps(views), "stats": json.dumps(stats)}
    try:
        with atomic_path(path) as temporary:
            save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, temporary, metadata=metadata)
    except (StorageError, OSError) as error:
        logger.warning("SfM cache %s cannot be written; the points are not cached: %s", path, error)


def _bad(path: Path, what: str) -> SfmCacheError:
    return SfmCacheError(f"{path}: not a valid SfM cache file ({what}); delete it and run again to recompute it")


def _read(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as file:
            metadata = file.metadata() or {}
            return {name: file.get_tensor(name) for name in file.keys()}, metadata
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise _bad(path, f"unreadable: {str(error).splitlines()[0][:200]}") from error


def _check_tensors(path: Path, tensors: dict[str, Tensor], count: int) -> None:
    if set(tensors) != set(_TENSORS):
        raise _bad(path, f"tensors {sorted(tensors)}, expected {sorted(_TENSORS)}")
    for name, (dtype, trailing) in _TENSORS.items():
        tensor = tensors[name]
        if tensor.dtype != dtype or tensor.dim() != 1 + len(trailing) or tuple(tensor.shape[1:]) != trailing:
            expected = f"{str(dtype).removeprefix('torch.')} (N{''.join(f', {size}' for size in trailing)})"
            found = f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
            raise _bad(path, f"{name} is {found}, expected {expected}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise _bad(path, f"{name} has non-finite values")
    counts, points = tensors["observed_counts"], tensors["observed_points"]
    if len(counts) != count or len(tensors["cameras"]) != count:
        raise _bad(path, f"{len(counts)} views' observations and {len(tensors['cameras'])} cameras for {count} views")
    if (counts < 0).any() or int(counts.sum()) != len(points) or len(points) != len(tensors["observed_pixels"]):
        raise _bad(path, "the observation counts disagree with the observations")
    if len(points) and (int(points.min()) < 0 or int(points.max()) >= len(tensors["xyz"])):
        raise _bad(path, f"point indices outside 0..{len(tensors['xyz']) - 1}")


def load_points(path: Path, key: str, views: list[int]) -> tuple[dict[str, Tensor], dict] | None:
    """``(tensors, stats)`` of the entry at ``path``; None when there is none; an
    :class:`SfmCacheError` naming the file when it is not a valid entry for ``key`` and ``views``."""
    if not path.exists():
        return None
    tensors, metadata = _read(path)
    if metadata.get("format") != _FORMAT or metadata.get("key") != key:
        raise _bad(path, "another format or key")
    try:
        stored_views, stats = json.loads(metadata["views"]), json.loads(metadata["stats"])
    except (KeyError, ValueError) as error:
        raise _bad(path, "metadata views / stats missing or not JSON") from error
    if stored_views != views or not isinstance(stats, dict):
        raise _bad(path, f"views {stored_views}, expected {views}")
    _check_tensors(path, tensors, len(views))
    return tensors, stats
