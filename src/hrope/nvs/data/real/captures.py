"""`CaptureScenes`: 3-view scenes cut from posed captures (``data.kind: captures``), held in memory.

Each capture folder is one scene folder in any detectable layout (LLFF with ``masks_N/``, COLMAP,
IDR / MonoSDF, nerfstudio, ...; :mod:`hrope.nvs.data.real.loaders`). Its views are split and cut
into scenes ``(context a, context b, target)`` by :mod:`hrope.nvs.data.real.view_splits`: protocol
``views`` (every ``test_every``-th view a test target, the views half-way between them validation
targets, the rest training views) or ``captures`` (the ``held_out`` captures give the validation
and test targets, the others train on all their views); contexts are the target's two nearest
training views by the angle between optical axes.

Every view a split uses is decoded once, square centre-cropped and resized to ``image_size`` with
exact intrinsics (and kept on disk by the loaders' image cache when ``cache_dir`` is set),
optionally composited over a plain colour with its object mask (``background="composite"``), given
the ``geometry`` of :mod:`hrope.nvs.data.real.capture_geometry` (from the training views only), and
held as tensors: an example only selects three views and normalises them
(:func:`hrope.nvs.data.normalize.normalize`). **Targets never carry depth or normals**, in every
split: their depth is inf and their normals zero (the leak rule).

Training examples: one per training target, its context the 2 nearest training views
(``context_choices=2``, the default: deterministic, the protocol the benchmark scores), or 2 drawn
from its ``context_choices`` nearest at each :meth:`CaptureScenes.set_epoch`, seeded by
``(seed, index, epoch)``. Validation and test examples always take the 2 nearest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ...config.schema import BACKGROUNDS, NORMALIZATIONS
from ..normalize import normalize
from ..rng import Rng
from ..scene import Scene, SceneError
from .capture_geometry import GEOMETRY_SOURCES, with_geometry
from .depth_maps import load_frames
from .frames import Frame
from .image_cache import ImageCache
from .loaders import detect_format, scene_frames
from .view_splits import (
    DEFAULT_TEST_EVERY,
    SceneCut,
    angle_summary,
    capture_views,
    check_protocol,
    cut_captures,
)

__all__ = ["BACKGROUNDS", "CaptureScenes", "capture_folders"]

logger = logging.getLogger("hrope.nvs.data")


def capture_folders(root: str | Path) -> list[Path]:
    """``[root]`` when ``root`` is one capture folder (a detectable scene layout), else its detectable
    sub-folders, sorted by name; a :class:`SceneError` when there is none."""
    root = Path(root)
    if not root.is_dir():
        raise SceneError(f"{root}: capture folder not found")
    if detect_format(root):
        return [root]
    folders = [p for p in sorted(root.iterdir()) if p.is_dir() and detect_format(p)]
    if not folders:
        raise SceneError(f"{root}: neither a capture folder nor a folder of capture folders (no known layout)")
    return folders


@dataclass
class _Capture:
    """One capture's frames and the views a split uses, loaded: ``scene`` holds frames ``views``."""

    name: str
    frames: list[Frame]
    views: list[int]
    scene: Scene

    def row(self, view: int) -> int:
        """The position of capture view ``view`` in ``scene``."""
        return self.views.index(view)


def _require(frames: list[Frame], field: str, name: str, why: str, files: str) -> None:
    """A one-line :class:`SceneError` unless every frame has its ``field`` file."""
    missing = [frame.label for frame in frames if getattr(frame, field) is None]
    if missing:
        raise SceneError(f"capture {name}: {why} needs {files}; {len(missing)} view(s) have none (first: {missing[0]})")


class CaptureScenes:
    """Normalised 3-view examples (2 context views, then the target) of posed captures (module doc).

    Args:
        captures: capture folders (their names must differ).
        protocol: ``views`` or ``captures`` (:mod:`hrope.nvs.data.real.view_splits`).
        split: ``train``, ``val`` or ``eval`` (the test targets).
        image_size: the model's square side (or ``(H, W)``).
        geometry: ``none``, ``sfm`` or ``priors`` (:mod:`hrope.nvs.data.real.capture_geometry`).
        background: ``photo`` (as taken) or ``composite`` (the masked object over ``background_color``,
            an RGB colour in [0, 1]; needs object masks).
        held_out: capture names (folder names) held out by protocol ``captures``.
        test_every: per capture (an int for all, or ``{name: int}`` with :data:`DEFAULT_TEST_EVERY`
            for the others); at least 3.
        seed: the seed of the drawn contexts (``context_choices > 2``).
        num_context: 2 (the only value supported).
        context_choices: training contexts are 2 of the target's this many nearest training views.
        normalization: ``context`` or ``lvsm`` (:func:`hrope.nvs.data.normalize.normalize`).
        image_factor, undistort: as :func:`hrope.nvs.data.real.loaders.scene_frames` takes them.
        cache_dir: an :class:`ImageCache` folder for the decoded views (None: none).
        sfm_cache_dir: where triangulated points are kept (:mod:`hrope.nvs.data.real.sfm`).
        workers: threads decoding a capture's views.
    """

    def __init__(
        self,
        captures: Sequence[str | Path],
        protocol: str = "views",
        split: str = "train",
        image_size: int | tuple[int, int] = 64,
        geometry: str = "none",
        background: str = "photo",
        held_out: Sequence[str] = (),
        test_every: int | Mapping[str, int] = DEFAULT_TEST_EVERY,
        seed: int = 0,
        *,
        num_context: int = 2,
        context_choices: int = 2,
        background_color: Sequence[float] = (1.0, 1.0, 1.0),
        normalization: str = "context",
        image_factor: int | None = None,
        undistort: bool = True,
        cache_dir: str | Path | None = None,
        sfm_cache_dir: str | Path | None = None,
        workers: int = 0,
    ) -> None:
        if num_context != 2:
            raise SceneError(f"captures: scenes have 2 context views, got num_context {num_context}")
        if isinstance(context_choices, bool) or not isinstance(context_choices, int) or context_choices < 2:
            raise SceneError(f"context_choices must be an integer >= 2, got {context_choices!r}")
        if geometry not in GEOMETRY_SOURCES:
            raise SceneError(f"geometry must be one of {', '.join(GEOMETRY_SOURCES)}, got {geometry!r}")
        if background not in BACKGROUNDS:
            raise SceneError(f"background must be one of {', '.join(BACKGROUNDS)}, got {background!r}")
        if normalization not in NORMALIZATIONS:
            raise SceneError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}")
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.image_size: tuple[int, int] = (int(size[0]), int(size[1]))
        self.protocol, self.split, self.geometry, self.background = protocol, split, geometry, background
        self.held_out, self.seed, self.num_context = list(held_out), seed, num_context
        self.context_choices, self.normalization, self.epoch = context_choices, normalization, 0
        folders = [Path(c) for c in captures]
        names = [folder.name for folder in folders]
        if len(set(names)) < len(names) or not names:
            raise SceneError(f"captures must be one or more folders with distinct names, got {names}")
        check_protocol(names, protocol, self.held_out)
        self.test_every = self._test_every(names, test_every)
        frames = {f.name: scene_frames(f, image_factor=image_factor, undistort=undistort) for f in folders}
        poses = {name: torch.stack([frame.world_to_cam for frame in frames[name]]) for name in names}
        self._pairs = cut_captures(
            poses, split, protocol=protocol, held_out=self.held_out, test_every=self.test_every, choices=context_choices
        )
        self.cuts: list[SceneCut] = [cut for cut, _ in self._pairs]
        loading = {"cache": None if cache_dir is None else ImageCache(cache_dir), "workers": workers}
        used = {cut.capture for cut in self.cuts}
        self.captures = {
            name: self._load(name, frames[name], tuple(background_color), sfm_cache_dir, loading)
            for name in names
            if name in used
        }

    @staticmethod
    def _test_every(names: list[str], test_every: int | Mapping[str, int]) -> dict[str, int]:
        if not isinstance(test_every, Mapping):
            return {name: test_every for name in names}
        unknown = sorted(set(test_every) - set(names))
        if unknown:
            raise SceneError(f"test_every names {unknown}, which are not captures; the captures are {sorted(names)}")
        return {name: test_every.get(name, DEFAULT_TEST_EVERY) for name in names}

    def _load(
        self, name: str, frames: list[Frame], color: tuple, sfm_cache_dir: str | Path | None, loading: dict
    ) -> _Capture:
        """Decode the views the split's scenes use, composite them, give them geometry."""
        views = sorted({v for (cut, pool) in self._pairs if cut.capture == name for v in (cut.target, *pool)})
        chosen = [frames[v] for v in views]
        composite, priors = self.background == "composite", self.geometry == "priors"
        if composite:
            _require(chosen, "mask", name, "background 'composite'", "object masks (masks_N/ or mask/)")
        if priors:
            _require(chosen, "depth_prior", name, "geometry 'priors'", "monocular depth priors (*_depth.npy)")
            _require(chosen, "normal_prior", name, "geometry 'priors'", "monocular normal priors (*_normal.npy)")
        scene = load_frames(frames, name, self.image_size, views, masks=composite, priors=priors, **loading)
        if composite:
            scene = replace(scene.composite(color), masks=None)
        context = capture_views(len(frames), name, self.protocol, self.held_out, self.test_every[name])["context"]
        scene = with_geometry(scene, frames, views, context, self.geometry, sfm_cache_dir)
        return _Capture(name, frames, views, scene)

    def __len__(self) -> int:
        return len(self.cuts)

    def set_epoch(self, epoch: int) -> None:
        """Draw the training contexts of ``epoch`` (with ``context_choices > 2``; otherwise nothing changes)."""
        self.epoch = epoch

    def context(self, index: int) -> tuple[int, int]:
        """The context views of example ``index`` (capture view indices, nearest first)."""
        cut, pool = self._pairs[index]
        if self.split != "train" or self.context_choices == 2:
            return cut.context
        picks = sorted(Rng("captures-context", self.seed, index, self.epoch).permutation(len(pool))[:2])
        return pool[picks[0]], pool[picks[1]]

    def __getitem__(self, index: int) -> Scene:
        if not -len(self) <= index < len(self):
            raise IndexError(f"scene index {index} out of range for {len(self)} scenes")
        index %= len(self)
        cut = self.cuts[index]
        capture = self.captures[cut.capture]
        scene = capture.scene.select_views([capture.row(v) for v in (*self.context(index), cut.target)])
        no_depth = torch.tensor([False, False, True])
        scene = replace(
            scene,
            name=f"{cut.capture}/{cut.target:03d}",
            depth=None if scene.depth is None else scene.depth.masked_fill(no_depth[:, None, None], torch.inf),
            normals=None if scene.normals is None else scene.normals.masked_fill(no_depth[:, None, None, None], 0.0),
        )
        return normalize(scene, [0, 1], self.normalization)

    def angles(self) -> dict:
        """Min / median / max angles (degrees) of this split's scenes (:func:`angle_summary`)."""
        return angle_summary(self.cuts)

    def describe(self) -> dict:
        """The split's protocol, its scenes per capture with their angles, and over all captures."""
        per_capture = {
            name: {
                "scenes": sum(cut.capture == name for cut in self.cuts),
                "views_loaded": len(capture.views),
                "test_every": self.test_every[name],
                "angles": angle_summary([cut for cut in self.cuts if cut.capture == name]),
            }
            for name, capture in self.captures.items()
        }
        return {
            "split": self.split,
            "protocol": self.protocol,
            "held_out": self.held_out,
            "geometry": self.geometry,
            "background": self.background,
            "image_size": list(self.image_size),
            "captures": per_capture,
            "angles": self.angles(),
        }
