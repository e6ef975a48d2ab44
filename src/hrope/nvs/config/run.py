"""A run config as one frozen, typed tree: :class:`RunConfig`, checked once when it is built.

``config.model`` is a :class:`~hrope.nvs.config.ModelConfig` (``config.model.heads``,
``config.model.predictor_options.targets``), ``config.data`` a :class:`DataSettings`,
``config.train`` a :class:`TrainSettings` and ``config.eval`` an :class:`EvalSettings`. Each section
checks its own values; :class:`RunConfig` checks the rules across sections and those that need the
data registries (kinds, loaders, the synthetic generator's settings). :meth:`RunConfig.to_dict` is
the plain form that config files, checkpoints and config hashes hold (every ``data``, ``train`` and
``eval`` key but a sparse one at its default; in ``model`` the preset, the encoding, the
predictor and the keys given), which stored runs and committed results are keyed by.
:func:`hrope.nvs.config.resolve` builds one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

from .fields import ConfigError, did_you_mean, plain_values, settings_of
from .model_config import ModelConfig
from .schema import CAPTURE_KEYS, CAPTURES_KIND, SETTINGS, DataSettings, EvalSettings, TrainSettings

__all__ = ["RunConfig", "HARMLESS_ON_RESUME", "harmless_on_resume", "synthetic_settings"]

# Keys that may differ on resume: where outputs go, how the run is executed and logged, evaluation.
HARMLESS_ON_RESUME = frozenset(
    f"{section}.{key}" for section, entries in SETTINGS.items() for key, declared in entries.items() if declared.resume
)


def _data_registries():
    """``(LOADERS, synthetic KINDS, SyntheticConfig)``, imported when a config is checked: the data
    package imports this package's fields and schema, so not at import time."""
    from ..data.real.loaders import LOADERS
    from ..data.synthetic import KINDS, SyntheticConfig

    return LOADERS, KINDS, SyntheticConfig


@dataclass(frozen=True)
class RunConfig:
    """One run's settings, checked (module doc). Build it with :func:`hrope.nvs.config.resolve`
    (or :func:`~hrope.nvs.config.load_config`); :func:`~hrope.nvs.config.update_config` gives a
    changed copy."""

    model: ModelConfig
    data: DataSettings
    train: TrainSettings
    eval: EvalSettings

    def __post_init__(self) -> None:
        data, train = self.data, self.train
        if data.context_gap is not None and data.context_gap[0] < data.num_context - 1:
            raise ConfigError(
                f"data.context_gap {data.context_gap} must have low >= data.num_context - 1 = "
                f"{data.num_context - 1} (distinct context frames)"
            )
        if train.perceptual_weight and train.perceptual_loss == "vgg19" and not train.vgg19_weights:
            raise ConfigError("train.perceptual_loss vgg19 needs local VGG-19 weights in train.vgg19_weights")
        if train.perceptual_weight and train.perceptual_loss == "lpips" and not self.eval.lpips_weights:
            raise ConfigError("train.perceptual_weight > 0 needs local LPIPS weights in eval.lpips_weights")
        self._check_data()

    def _check_data(self) -> None:
        """The rules of ``data.kind``: a known kind, and only the keys it reads."""
        loaders, synthetic, _ = _data_registries()
        data = self.data
        self._check_capture_keys()
        if data.kind in synthetic:
            if data.root or data.eval_root or data.eval_index or data.depth != "none":
                raise ConfigError(
                    f"data.root, data.eval_root, data.eval_index and data.depth are for real data, not the "
                    f"synthetic kind {data.kind!r} (which renders exact depth)"
                )
            for section, count in (("data", data.num_scenes), ("eval", self.eval.num_scenes)):
                if count is None:
                    raise ConfigError(f"{section}.num_scenes must be a number for synthetic data")
            synthetic_settings(data)
            return
        if data.kind == CAPTURES_KIND:
            self._check_captures()
            return
        if data.kind not in loaders:
            raise ConfigError(
                f"unknown data.kind {data.kind!r}; expected room, object, {CAPTURES_KIND} or one of {sorted(loaders)}"
            )
        if self.eval.split == "val":
            raise ConfigError(
                f"eval.split 'val' (validation scenes) is for the synthetic kinds ({', '.join(synthetic)}) and "
                f"{CAPTURES_KIND!r}, "
                f"not {data.kind!r}; hold out scenes in data.eval_root instead"
            )
        loader = loaders[data.kind]
        if not data.root:
            raise ConfigError(f"data.root is required for data.kind {data.kind!r} (the dataset folder)")
        if data.eval_index and not loader.evaluation_index:
            indexed = ", ".join(repr(name) for name, entry in loaders.items() if entry.evaluation_index)
            raise ConfigError(f"data.eval_index is for data.kind {indexed}, not {data.kind!r}")
        if data.depth != "none" and not loader.scene_folders:
            raise ConfigError(
                f"data.depth {data.depth!r} is for scene folders (COLMAP, nerfstudio), not data.kind "
                f"{data.kind!r}; use none"
            )
        if data.image_factor is not None and not loader.scene_folders:
            folders = sorted(name for name, entry in loaders.items() if entry.scene_folders)
            raise ConfigError(
                f"data.image_factor is for the scene-folder kinds ({', '.join(folders)}), not "
                f"{data.kind!r}; set it to null"
            )

    def _check_capture_keys(self) -> None:
        """The keys only ``data.kind: captures`` reads stay at their defaults for the other kinds."""
        if self.data.kind == CAPTURES_KIND:
            return
        declared = settings_of(DataSettings)
        for key in CAPTURE_KEYS:
            if getattr(self.data, key) != declared[key].default:
                raise ConfigError(f"data.{key} is for data.kind {CAPTURES_KIND!r}, not {self.data.kind!r}")

    def _check_captures(self) -> None:
        """The rules of ``data.kind: captures`` (docs/real_data.md); the capture names are checked
        against the folders when the dataset is built."""
        data = self.data
        if not data.root:
            raise ConfigError(
                f"data.root is required for data.kind {CAPTURES_KIND!r} (a capture folder or a folder of them)"
            )
        unused = {
            "data.eval_root": data.eval_root,
            "data.eval_index": data.eval_index,
            "data.context_gap": data.context_gap,
        }
        for key, value in unused.items():
            if value is not None:
                raise ConfigError(
                    f"{key} is not read by data.kind {CAPTURES_KIND!r} (data.protocol splits the views); set it to null"
                )
        if data.depth != "none":
            raise ConfigError(
                f"data.depth {data.depth!r} is not read by data.kind {CAPTURES_KIND!r}; use data.geometry"
            )
        if data.view_sampling != "uniform":
            raise ConfigError(f"data.view_sampling {data.view_sampling!r} is not read by data.kind {CAPTURES_KIND!r}")
        if data.num_context != 2 or data.num_target != 1:
            raise ConfigError(
                f"data.kind {CAPTURES_KIND!r} cuts scenes of 2 context views and 1 target; got data.num_context "
                f"{data.num_context}, data.num_target {data.num_target}"
            )
        if data.protocol == "views" and data.held_out:
            raise ConfigError(
                f"data.held_out {data.held_out} is for data.protocol 'captures' (protocol 'views' holds out views)"
            )
        if data.protocol == "captures" and not data.held_out:
            raise ConfigError("data.protocol 'captures' needs data.held_out: the names of the held-out capture folders")
        for name, every in data.test_every_by_capture.items():
            if isinstance(every, bool) or not isinstance(every, int) or every < 3:
                raise ConfigError(f"data.test_every_by_capture.{name} must be an integer >= 3, got {every!r}")

    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        """The config of a plain form ``{section: {key: value}}`` (every key of ``data``,
        ``train`` and ``eval``, a sparse one at its default where left out; the model keys given)."""
        data = DataSettings(**values["data"])
        train = TrainSettings(**values["train"])
        evaluation = EvalSettings(**values["eval"])
        return cls(ModelConfig.from_dict(values["model"]), data, train, evaluation)

    def to_dict(self) -> dict:
        """The plain form (a fresh copy): what ``config.yaml``, checkpoints and config hashes hold."""
        plain = {"model": self.model.section()}
        plain.update({section: plain_values(getattr(self, section)) for section in ("data", "train", "eval")})
        return copy.deepcopy(plain)


def harmless_on_resume(key: str, config: RunConfig) -> bool:
    """Whether ``key`` (``"section.key"``) may differ when a run resumes under ``config``: the keys
    of :data:`HARMLESS_ON_RESUME`, and ``eval.lpips_weights`` / ``eval.lpips_net`` unless an LPIPS
    perceptual loss trains with them."""
    if key in ("eval.lpips_weights", "eval.lpips_net"):
        return not (config.train.perceptual_weight and config.train.perceptual_loss == "lpips")
    return key in HARMLESS_ON_RESUME


def synthetic_settings(data: DataSettings):
    """The :class:`hrope.nvs.data.SyntheticConfig` of ``data.synthetic`` (its overrides of the defaults)."""
    _, _, generator_settings = _data_registries()
    values = data.synthetic or {}
    known = [f.name for f in fields(generator_settings)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown data.synthetic keys {unknown}; {did_you_mean(unknown[0], known, 'data.synthetic.')}"
            f"known: {sorted(known)}"
        )
    try:
        return generator_settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except ValueError as error:
        raise ConfigError(f"data.synthetic: {error}") from None
