"""`ImageCache`: every view decoded once, at the resolution training uses, kept on disk.

A real capture's frames are multi-megapixel JPEGs; decoding them at every training step made a
step on a real scene several times slower than on a synthetic one. With a cache, a view is
decoded, undistorted and resized + centre-cropped once, and later reads load its pixels.

- **Where.** Any folder (``data.cache_dir``); the default, :func:`default_cache_dir`, is the
  user's cache folder (``$XDG_CACHE_HOME/hrope/images``, else ``~/.cache/hrope/images``), never the
  dataset folder.
- **Key.** The SHA-256 of: the image file's resolved path, size in bytes and modification time
  in nanoseconds (for images held in memory, e.g. RealEstate10K chunks: the SHA-256 of their
  bytes), the target image size, the lens model, intrinsics and intrinsics size when the view is
  undistorted, the background colour alpha is composited over, and :data:`FORMAT_VERSION`. An
  edited, replaced or touched file gets a new key; old entries stay on disk unused (delete the
  folder to reclaim the space). Bump :data:`FORMAT_VERSION` when the decoding pipeline changes.
- **Format.** ``KEY[:2]/KEY.npy``: one numpy record (read with ``allow_pickle=False``, so never
  unpickled) of two fields, ``image`` (``uint8 (H, W, 3)``) and ``source_size`` (the ``(H, W)``
  the file was decoded at, from which the loader recomputes the intrinsics).
- **Safety.** An entry is written to a temporary file in its folder, then moved into place
  (``os.replace``, atomic): a crash or a second writer (threads, DDP ranks) never leaves a partial
  entry under a key. An unreadable entry counts as a miss and is rewritten. A folder that cannot
  be written (a full or read-only file system, a path through a file) logs one warning naming it
  and the cache stops writing (views are then decoded every time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
from torch import Tensor

from ...running.atomic import StorageError, atomic_open

__all__ = ["FORMAT_VERSION", "default_cache_dir", "ImageCache"]

logger = logging.getLogger("hrope.nvs.data")

FORMAT_VERSION = 2


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hrope/images``, or ``~/.cache/hrope/images`` without that variable."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hrope" / "images"


def _source(image: Path | bytes | Tensor) -> list | str | None:
    """What identifies an image's content: ``[path, bytes, mtime_ns]`` of a file (None when it
    cannot be read), the SHA-256 of encoded bytes."""
    if isinstance(image, Path):
        try:
            path = image.resolve()
            stat = path.stat()
        except OSError:
            return None
        return [str(path), stat.st_size, stat.st_mtime_ns]
    data = image.numpy().tobytes() if isinstance(image, Tensor) else image
    return hashlib.sha256(data).hexdigest()


class ImageCache:
    """Decoded views under ``folder`` (``~`` expanded; module doc): :meth:`key`, :meth:`get`, :meth:`put`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser()
        self.writable = True

    def key(
        self,
        image: Path | bytes | Tensor,
        image_size: tuple[int, int] | None,
        lens: list | None = None,
        background: tuple | None = None,
    ) -> str | None:
        """The key of ``image`` decoded for ``image_size``, undistorted by ``lens`` (JSON-able: model,
        coefficients, K, intrinsics size) and composited on ``background``; None when its file
        cannot be read."""
        source = _source(image)
        if source is None:
            return None
        parts = [FORMAT_VERSION, source, image_size and list(image_size), lens, background and list(background)]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.npy"

    def get(self, key: str) -> tuple[np.ndarray, tuple[int, int]] | None:
        """``(pixels uint8 (H, W, 3), source (H, W))`` stored under ``key``; None on a miss or an
        unreadable entry."""
        try:
            entry = np.load(self.path(key), allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if entry.shape != () or entry.dtype.names != ("source_size", "image"):
            return None
        pixels, size = entry["image"], entry["source_size"]
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[-1] != 3 or size.shape != (2,):
            return None
        return pixels, (int(size[0]), int(size[1]))

    def put(self, key: str, pixels: np.ndarray, source_size: tuple[int, int]) -> None:
        """Store ``pixels`` (uint8 ``(H, W, 3)``) decoded from a ``source_size`` image, atomically."""
        if not self.writable:
            return
        entry = np.zeros((), dtype=[("source_size", np.int64, (2,)), ("image", np.uint8, pixels.shape)])
        entry["source_size"], entry["image"] = source_size, pixels
        try:  # not fsynced: an entry a power loss empties reads as a miss
            with atomic_open(self.path(key), "wb", durable=False) as file:
                np.save(file, entry, allow_pickle=False)
        except (StorageError, OSError) as error:  # a full or read-only file system, a path through a file
            self.writable = False
            logger.warning("image cache %s cannot be written; views are decoded every time: %s", self.folder, error)
