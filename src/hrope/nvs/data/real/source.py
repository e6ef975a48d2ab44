"""`SceneSource`: an indexable collection of real scenes that skips broken ones with a counted warning.

A source has ``len(source)`` and ``source[i] -> Scene``; the generic dataset wrapper builds
examples from it. ``source[i]`` holds ``num_views`` frames chosen by :func:`select_frames` (all
frames when None); :meth:`SceneSource.num_frames` and :meth:`SceneSource.load_views` let a wrapper
choose frames itself and decode only those. A scene whose files are missing, corrupt or malformed
(any :class:`~hrope.nvs.data.SceneError`) is logged and replaced by the next loadable scene, so
training never crashes mid-epoch; ``num_skipped`` counts the distinct scenes skipped so far.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..scene import Scene, SceneError
from .depth_maps import PNG_DEPTH_SCALE, load_frames
from .frames import Frame, select_frames
from .image_cache import ImageCache

__all__ = ["SceneSource", "load_or_skip"]

logger = logging.getLogger("hrope.nvs.data")


class SceneSource:
    """Base class: subclasses implement ``__len__``, ``frames(i)``, ``scene_name(i)`` and ``describe(i)``.

    Args:
        num_views: frames per scene for ``source[i]`` (all when None).
        sampling: "even" (deterministic, evaluation) or "random" (fresh at each access, training),
            see :func:`hrope.nvs.data.real.frames.select_frames`; ``max_span`` bounds a random window.
        image_size: ``(H, W)`` to resize + centre-crop every view to (native size when None).
        skip_errors: skip malformed scenes (default); False re-raises the :class:`SceneError`.
        depth, depth_scale: where each scene's depth comes from (``none``, ``points``, ``maps``) and
            the scale of 16-bit PNG depth maps (:func:`hrope.nvs.data.real.depth_maps.load_frames`).
        cache_dir: a folder keeping each decoded view at ``image_size``
            (:class:`hrope.nvs.data.real.image_cache.ImageCache`; None: decode every time).
        workers: threads decoding the views of one scene (0 or 1: the calling thread).
        masks, priors: also read each scene's object masks (``Scene.masks``) and monocular priors
            (``Scene.relative_depth``, ``Scene.normals``; :mod:`hrope.nvs.data.real.view_maps`).
    """

    def __init__(
        self,
        *,
        num_views: int | None = None,
        sampling: str = "even",
        max_span: int | None = None,
        image_size: tuple[int, int] | None = None,
        skip_errors: bool = True,
        depth: str = "none",
        depth_scale: float = PNG_DEPTH_SCALE,
        cache_dir: str | Path | None = None,
        workers: int = 0,
        masks: bool = False,
        priors: bool = False,
    ) -> None:
        if sampling not in ("even", "random"):
            raise ValueError(f"sampling must be 'even' or 'random', got {sampling!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise SceneError(f"workers must be a non-negative integer, got {workers!r}")
        self.num_views, self.sampling, self.max_span = num_views, sampling, max_span
        self.image_size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
        self.skip_errors = skip_errors
        self.depth, self.depth_scale = depth, depth_scale
        self.cache = None if cache_dir is None else ImageCache(cache_dir)
        self.workers = workers
        self.masks, self.priors = masks, priors
        self._bad: set[int] = set()

    # ------------------------------------------------------------------ subclass interface
    def __len__(self) -> int:
        raise NotImplementedError

    def frames(self, i: int) -> list[Frame]:
        """All frames of scene ``i`` (cameras converted, images not decoded)."""
        raise NotImplementedError

    def scene_name(self, i: int) -> str:
        raise NotImplementedError

    def describe(self, i: int) -> str:
        return f"scene {self.scene_name(i)!r}"

    def views(self, i: int, num_frames: int) -> list[int]:
        """The frames ``source[i]`` holds, in order."""
        return select_frames(num_frames, self.num_views, self.sampling, max_span=self.max_span)

    # ------------------------------------------------------------------ access
    @property
    def num_skipped(self) -> int:
        return len(self._bad)

    def num_frames(self, i: int) -> int:
        return len(self.frames(i))

    def load_views(self, i: int, views: list[int]) -> Scene:
        """Scene ``i`` restricted to frames ``views`` (in that order); errors are raised."""
        return self._load(i, self.frames(i), views)

    def load(self, i: int) -> Scene:
        frames = self.frames(i)
        return self._load(i, frames, self.views(i, len(frames)))

    def _load(self, i: int, frames: list[Frame], views: list[int]) -> Scene:
        return load_frames(
            frames,
            self.scene_name(i),
            self.image_size,
            views,
            self.depth,
            self.depth_scale,
            masks=self.masks,
            priors=self.priors,
            cache=self.cache,
            workers=self.workers,
        )

    def __getitem__(self, i: int) -> Scene:
        return load_or_skip(self, i, self.load, self._bad, self.skip_errors)


def load_or_skip(source, i: int, load: Callable[[int], Scene], skipped: set[int], skip_errors: bool = True) -> Scene:
    """``load(i)``, or ``load`` of the next loadable scene when scene ``i`` raises a :class:`SceneError`.

    Skipped scene indices go into ``skipped`` (never retried) with a warning; ``skip_errors=False``
    re-raises instead. Other errors (bugs) always propagate.
    """
    n = len(source)
    if not -n <= i < n:
        raise IndexError(f"scene index {i} out of range for {n} scenes")
    i %= n
    if not skip_errors:
        return load(i)
    describe = getattr(source, "describe", lambda j: f"scene {j}")
    error = None
    for j in [(i + step) % n for step in range(n)]:
        if j in skipped:
            continue
        try:
            return load(j)
        except SceneError as failure:
            error = failure
            skipped.add(j)
            logger.warning("skipping %s (%d scene(s) skipped so far): %s", describe(j), len(skipped), failure)
    raise SceneError(f"none of the {n} scenes of {type(source).__name__} could be loaded (last error: {error})")
