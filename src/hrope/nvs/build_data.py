"""Datasets of a run config: synthetic or real scenes for training and held-out evaluation.

``build_dataset(config, split)`` gives the training (``"train"``) or held-out (``"eval"``) examples
of ``config.data`` at the model's resolution (``config.model.image_size``);
``build_scene_source(config, split)`` the real-data :class:`hrope.nvs.data.SceneSource` behind it;
``collate`` stacks examples into a batch on a device. The config's rules on ``data.kind`` (the keys
each kind reads) are checked when it is built (:class:`hrope.nvs.config.RunConfig`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .config import ConfigError, RunConfig, synthetic_settings
from .config.schema import CAPTURES_KIND
from .data.batch import collate_scenes
from .data.dataset import SceneDataset, SyntheticDataset
from .data.normalize import normalize
from .data.real.captures import CaptureScenes, capture_folders
from .data.real.image_cache import default_cache_dir
from .data.real.loaders import LOADERS, make_source
from .data.scene import SceneError
from .data.synthetic import KINDS

__all__ = [
    "CachedDataset",
    "FirstScenes",
    "IndexedViews",
    "build_scene_source",
    "build_captures",
    "build_dataset",
    "collate",
]


class CachedDataset:
    """Keeps every scene of ``dataset`` in memory after its first generation."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self._scenes: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        if index not in self._scenes:
            self._scenes[index] = self.dataset[index]
        return self._scenes[index]


class FirstScenes:
    """The first ``count`` examples of ``dataset`` (forwards ``set_epoch``)."""

    def __init__(self, dataset, count: int) -> None:
        self.dataset, self.count = dataset, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        if not 0 <= index < self.count:
            raise IndexError(f"scene index {index} out of range 0..{self.count - 1}")
        return self.dataset[index]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


class IndexedViews:
    """The scenes of a RealEstate10K source opened with an evaluation index (its context, then its
    targets), normalised (``normalization``: :func:`hrope.nvs.data.normalize.normalize`); the index
    must give ``num_context`` context views per scene."""

    def __init__(self, source, num_context: int, normalization: str = "context") -> None:
        self.source, self.num_context, self.normalization = source, num_context, normalization

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        context, _ = self.source.context_target(index)
        if len(context) != self.num_context:
            raise ConfigError(
                f"data.eval_index gives {len(context)} context views, data.num_context is {self.num_context}"
            )
        return normalize(self.source[index], context, self.normalization)


def build_scene_source(config: RunConfig, split: str = "train"):
    """The real-data :class:`hrope.nvs.data.SceneSource` of ``config.data`` at the model's resolution.

    ``split="eval"`` reads ``data.eval_root`` (default ``data.root``) and, for RE10K,
    ``data.eval_index``. Views are resized + centre-cropped with exact intrinsics.
    """
    data, size = config.data, config.model.image_size
    root = (data.eval_root or data.root) if split == "eval" else data.root
    assert root is not None  # RunConfig: real kinds need data.root
    options = {
        "image_size": (size, size),
        "depth": data.depth,
        "depth_scale": data.depth_scale,
        "cache_dir": (data.cache_dir or default_cache_dir()) if data.cache else None,
        "workers": data.workers,
    }
    if LOADERS[data.kind].scene_folders:
        options.update(image_factor=data.image_factor, undistort=data.undistort)
    if split == "eval" and data.eval_index:
        options["evaluation_index"] = data.eval_index
    try:
        return make_source(data.kind, root, **options)
    except SceneError as error:
        raise ConfigError(f"data.root {str(root)!r} ({data.kind}): {error}") from None


def build_captures(config: RunConfig, split: str = "train") -> CaptureScenes:
    """The :class:`hrope.nvs.data.real.captures.CaptureScenes` of ``split`` ("train", "val", "eval")
    of a ``data.kind: captures`` config, at the model's resolution, its SfM points kept in
    ``data.sfm_cache_dir`` (default: ``sfm/`` in the image cache folder, with ``data.cache``); data
    errors (a held-out name that is no capture, compositing without masks, ...) as one-line
    :class:`ConfigError`."""
    data, size = config.data, config.model.image_size
    assert data.root is not None  # RunConfig: captures need data.root
    try:
        folders = capture_folders(data.root)
        names = {folder.name for folder in folders}
        unknown = sorted(set(data.test_every_by_capture) - names)
        if unknown:
            raise SceneError(f"data.test_every_by_capture names {unknown}, which are not captures: {sorted(names)}")
        cache = Path(data.cache_dir or default_cache_dir()) if data.cache else None
        sfm_cache = data.sfm_cache_dir or (None if cache is None else cache / "sfm")
        return CaptureScenes(
            folders,
            protocol=data.protocol,
            split=split,
            image_size=size,
            geometry=data.geometry,
            background=data.background,
            held_out=data.held_out,
            test_every={name: data.test_every_by_capture.get(name, data.test_every) for name in names},
            seed=data.seed,
            context_choices=data.context_choices,
            background_color=data.background_color,
            normalization=data.normalize,
            image_factor=data.image_factor,
            undistort=data.undistort,
            cache_dir=cache,
            sfm_cache_dir=sfm_cache,
            workers=data.workers,
        )
    except SceneError as error:
        raise ConfigError(f"data.root {str(data.root)!r} ({CAPTURES_KIND}): {error}") from None


def build_dataset(config: RunConfig, split: str = "train"):
    """The dataset of ``config.data`` (``split`` "train", "eval": the held-out test scenes, or
    "val": held-out validation scenes, synthetic kinds and captures).

    Synthetic kinds render ``data.num_scenes`` (train) or ``eval.num_scenes`` scenes (kept in
    memory when ``data.cache``); real kinds wrap :func:`build_scene_source` in
    :class:`hrope.nvs.data.SceneDataset` (random views, redrawn at every training step through
    ``set_epoch``; fixed views for evaluation, or the RE10K index's), ``captures`` is
    :func:`build_captures`; both limited to the first ``num_scenes`` scenes when that is set.
    """
    data, image_size = config.data, config.model.image_size
    num_scenes = data.num_scenes if split == "train" else config.eval.num_scenes
    gap = None if data.context_gap is None else tuple(data.context_gap)
    if data.kind in KINDS:
        assert num_scenes is not None  # RunConfig: synthetic kinds count their scenes
        dataset = SyntheticDataset(
            kind=data.kind,
            num_scenes=num_scenes,
            seed=data.seed,
            image_size=(image_size, image_size),
            num_context=data.num_context,
            num_target=data.num_target,
            split=split,
            context_gap=gap,
            config=synthetic_settings(data),
            sampling=data.view_sampling,
            normalization=data.normalize,
        )
        return CachedDataset(dataset) if data.cache else dataset
    scenes: IndexedViews | SceneDataset | CaptureScenes
    if data.kind == CAPTURES_KIND:
        scenes = build_captures(config, split)
    elif split == "eval" and data.eval_index:
        scenes = IndexedViews(build_scene_source(config, split), data.num_context, data.normalize)
    else:
        scenes = SceneDataset(
            build_scene_source(config, split),
            data.num_context,
            data.num_target,
            split=split,
            seed=data.seed,
            context_gap=gap,
            sampling=data.view_sampling,
            normalization=data.normalize,
        )
    if num_scenes is not None and num_scenes < len(scenes):
        return FirstScenes(scenes, num_scenes)
    return scenes  # never cached: real scenes are large, and training views change every step


def collate(scenes, num_context: int, device: torch.device):
    """A :class:`hrope.nvs.data.batch.SceneBatch` on ``device``."""
    return collate_scenes(list(scenes), num_context).to(device)
