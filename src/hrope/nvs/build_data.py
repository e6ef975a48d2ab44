"""Datasets of a run config: synthetic or real scenes for training and held-out evaluation.

``build_dataset(config, split)`` gives the training (``"train"``) or held-out (``"eval"``) examples
of ``config["data"]`` at the model's resolution; ``build_scene_source(config, split)`` the real-data
:class:`hrope.nvs.data.SceneSource` behind it; ``collate`` stacks examples into a batch on a device.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from .config import ConfigError, did_you_mean, setting_value
from .data.batch import collate_scenes
from .data.dataset import SceneDataset, SyntheticDataset
from .data.normalize import normalize
from .data.real.image_cache import default_cache_dir
from .data.real.loaders import LOADERS, Loader, make_source
from .data.scene import SceneError
from .data.synthetic import KINDS, SyntheticConfig
from .model import ModelConfig

__all__ = [
    "CachedDataset",
    "FirstScenes",
    "IndexedViews",
    "build_scene_source",
    "build_dataset",
    "check_synthetic_data",
    "synthetic_config",
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


def build_scene_source(config: dict, split: str = "train"):
    """The real-data :class:`hrope.nvs.data.SceneSource` of ``config["data"]`` at the model's resolution.

    ``split="eval"`` reads ``data.eval_root`` (default ``data.root``) and, for RE10K,
    ``data.eval_index``. Views are resized + centre-cropped with exact intrinsics.
    """
    data = config["data"]
    if data["kind"] not in LOADERS:
        raise ConfigError(f"unknown data.kind {data['kind']!r}; expected room, object or one of {sorted(LOADERS)}")
    loader = LOADERS[data["kind"]]
    root = (data["eval_root"] or data["root"]) if split == "eval" else data["root"]
    if not root:
        raise ConfigError(f"data.root is required for data.kind {data['kind']!r} (the dataset folder)")
    if data["eval_index"] and not loader.evaluation_index:
        indexed = ", ".join(repr(name) for name, entry in LOADERS.items() if entry.evaluation_index)
        raise ConfigError(f"data.eval_index is for data.kind {indexed}, not {data['kind']!r}")
    size = ModelConfig.from_dict(config["model"]).image_size
    if data["depth"] != "none" and not loader.scene_folders:
        raise ConfigError(
            f"data.depth {data['depth']!r} is for scene folders (COLMAP, nerfstudio), not data.kind "
            f"{data['kind']!r}; use none"
        )
    options = {
        "image_size": (size, size),
        "depth": data["depth"],
        "depth_scale": data["depth_scale"],
        **_loader_options(data, loader),
    }
    if split == "eval" and data["eval_index"]:
        options["evaluation_index"] = data["eval_index"]
    try:
        return make_source(data["kind"], root, **options)
    except SceneError as error:
        raise ConfigError(f"data.root {str(root)!r} ({data['kind']}): {error}") from None


def _loader_options(data: dict, loader: Loader) -> dict:
    """:func:`hrope.nvs.data.make_source` options of a run config's ``data`` section: the disk cache of
    decoded views (``data.cache`` on: in ``data.cache_dir``, by default
    :func:`hrope.nvs.data.real.image_cache.default_cache_dir`), decoding threads (``data.workers``), and
    for the scene-folder kinds (:attr:`hrope.nvs.data.real.loaders.Loader.scene_folders`) ``data.image_factor``
    and ``data.undistort``."""
    options = {
        "cache_dir": (data["cache_dir"] or default_cache_dir()) if data["cache"] else None,
        "workers": data["workers"],
    }
    if loader.scene_folders:
        return {**options, "image_factor": data["image_factor"], "undistort": data["undistort"]}
    if data["image_factor"] is not None:
        folders = sorted(name for name, entry in LOADERS.items() if entry.scene_folders)
        raise ConfigError(
            f"data.image_factor is for the scene-folder kinds ({', '.join(folders)}), not "
            f"{data['kind']!r}; set it to null"
        )
    return options


def build_dataset(config: dict, split: str = "train"):
    """The dataset of ``config["data"]`` (``split`` "train", "eval": the held-out test scenes, or
    "val": held-out validation scenes, synthetic kinds only).

    Synthetic kinds render ``data.num_scenes`` (train) or ``eval.num_scenes`` scenes (kept in
    memory when ``data.cache``); real kinds wrap :func:`build_scene_source` in
    :class:`hrope.nvs.data.SceneDataset` (random views, redrawn at every training step through
    ``set_epoch``; fixed views for evaluation, or the RE10K index's), limited to the first
    ``num_scenes`` scenes when that is set, and never cached.
    """
    data = config["data"]
    image_size = ModelConfig.from_dict(config["model"]).image_size
    num_scenes = data["num_scenes"] if split == "train" else config["eval"]["num_scenes"]
    gap = None if data["context_gap"] is None else tuple(data["context_gap"])
    sampling, normalization = (setting_value(data, "data", key) for key in ("view_sampling", "normalize"))
    if split == "val" and data["kind"] not in KINDS:
        raise ConfigError(
            f"eval.split 'val' (validation scenes) is for the synthetic kinds ({', '.join(KINDS)}), "
            f"not {data['kind']!r}; hold out scenes in data.eval_root instead"
        )
    if data["kind"] in KINDS:
        dataset = SyntheticDataset(
            kind=data["kind"],
            num_scenes=check_synthetic_data(config, num_scenes, split),
            seed=data["seed"],
            image_size=(image_size, image_size),
            num_context=data["num_context"],
            num_target=data["num_target"],
            split=split,
            context_gap=gap,
            config=synthetic_config(config),
            sampling=sampling,
            normalization=normalization,
        )
        return CachedDataset(dataset) if data["cache"] else dataset
    scenes: IndexedViews | SceneDataset
    if split == "eval" and data["eval_index"]:
        scenes = IndexedViews(build_scene_source(config, split), data["num_context"], normalization)
    else:
        scenes = SceneDataset(
            build_scene_source(config, split),
            data["num_context"],
            data["num_target"],
            split=split,
            seed=data["seed"],
            context_gap=gap,
            sampling=sampling,
            normalization=normalization,
        )
    if num_scenes is not None and num_scenes < len(scenes):
        return FirstScenes(scenes, int(num_scenes))
    return scenes  # never cached: real scenes are large, and training views change every step


def synthetic_config(config: dict) -> SyntheticConfig:
    """The :class:`SyntheticConfig` of ``config["data"]["synthetic"]`` (its overrides of the defaults)."""
    values = config["data"]["synthetic"] or {}
    known = [f.name for f in fields(SyntheticConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown data.synthetic keys {unknown}; {did_you_mean(unknown[0], known, 'data.synthetic.')}"
            f"known: {sorted(known)}"
        )
    try:
        overrides: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return SyntheticConfig(**overrides)
    except ValueError as error:
        raise ConfigError(f"data.synthetic: {error}") from None


def check_synthetic_data(config: dict, num_scenes: int | None, split: str) -> int:
    """``num_scenes``, after clear errors for real-data keys or a missing scene count with a
    synthetic ``data.kind``."""
    data = config["data"]
    if data["root"] or data["eval_root"] or data["eval_index"] or data["depth"] != "none":
        raise ConfigError(
            f"data.root, data.eval_root, data.eval_index and data.depth are for real data, not the "
            f"synthetic kind {data['kind']!r} (which renders exact depth)"
        )
    if num_scenes is None:
        raise ConfigError(f"{'data' if split == 'train' else 'eval'}.num_scenes must be a number for synthetic data")
    return num_scenes


def collate(scenes, num_context: int, device: torch.device):
    """A :class:`hrope.nvs.data.batch.SceneBatch` on ``device``."""
    return collate_scenes(list(scenes), num_context).to(device)
