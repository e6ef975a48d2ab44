"""The options of each parameter source (``model.predictor_options``), declared once: one frozen
:class:`SourceOptions` class per source (:data:`SOURCE_OPTIONS`), read and checked by
:func:`source_options`.

``targets`` (what target tokens, which have no image, get; :class:`hrope.nvs.sources.ParameterSource`)
takes per source the choices of :data:`SOURCE_TARGETS`, the first its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .fields import Field, PredictorError, did_you_mean, given_field, given_values, setting, settings_of

__all__ = [
    "PLANE_DECODERS",
    "TARGETS",
    "SCOPES",
    "FITS",
    "FALLBACKS",
    "ALIGNS",
    "DEFAULT_MAX_INVERSE_DISTANCE",
    "SOURCE_TARGETS",
    "PREDICTORS",
    "SourceOptions",
    "LearnedOptions",
    "BackboneOptions",
    "ExternalOptions",
    "OracleOptions",
    "SOURCE_OPTIONS",
    "source_options",
]

PLANE_DECODERS = ("direct", "normal-depth")  # hrope.nvs.sources.parameter_specs
TARGETS = ("hidden", "neutral", "transfer")  # what target tokens (no image) get: hrope.nvs.sources.ParameterSource
SCOPES = ("context", "all")
ALIGNS = ("median", "none")
FITS = ("least-squares", "robust")  # how planes are fitted to depth: hrope.nvs.sources.plane_fitting
FALLBACKS = ("median", "infinity")  # what a patch without a clean fit gets
# Known geometry (oracle, external): planes closer to the camera centre than 1/2 of the context
# baseline (scenes are normalised to a unit baseline) are moved out to that distance. Measured in
# docs/notebook.md ("Why geometry hurts on `object`"): uncapped, a few such planes destabilise
# training (object -0.95 dB, room +0.47 dB with transferred context depth; capped +0.05 and +0.80).
DEFAULT_MAX_INVERSE_DISTANCE = 2.0
# the parameter sources (model.predictor) and the targets each accepts; the first is its default
SOURCE_TARGETS = {
    "learned": TARGETS,
    "backbone": ("neutral", "transfer"),
    "external": ("neutral", "transfer"),
    "oracle": ("neutral", "transfer"),
}
PREDICTORS = tuple(SOURCE_TARGETS)

_COUNT = Field("int", low=1)
_OPTIONAL_PATH = Field("path", nullable=True)


def _targets(source: str):
    return setting(
        SOURCE_TARGETS[source][0],
        Field("str", choices=SOURCE_TARGETS[source]),
        "target tokens' values: hidden (own prediction), neutral or transfer (from the context "
        "views); choices and default per source: SOURCE_TARGETS",
    )


def _plane_decoder():
    return setting(
        None,
        Field("str", choices=PLANE_DECODERS, nullable=True),
        "plane head decoding: direct or normal-depth (null: the encoding's default)",
    )


def _scope():
    return setting(
        "context",
        Field("str", choices=SCOPES),
        "views whose geometry is read: context, or all (the targets' own too; no targets option)",
    )


def _max_inverse_distance():
    return setting(
        DEFAULT_MAX_INVERSE_DISTANCE,
        Field("float", above=0, nullable=True),
        "cap on |m|: planes nearer than 1 / cap move out to it (null: no cap)",
    )


def _module():
    return setting(
        None,
        Field("module", nullable=True),
        "backbone or depth model: an nn.Module or an import path 'package.module:factory'",
    )


def _module_kwargs():
    return setting({}, Field("mapping"), "keyword arguments of the module factory")


def _checkpoint():
    return setting(None, _OPTIONAL_PATH, "local weights file loaded into the module")


@dataclass(frozen=True)
class SourceOptions:
    """``model.predictor_options`` of one parameter source (a subclass per source,
    :data:`SOURCE_OPTIONS`): every option with its value, ``given`` the ones the config names."""

    source: ClassVar[str]
    targets: str  # every source's first option, its default per source (SOURCE_TARGETS)
    given: tuple[str, ...] | None = given_field()

    def to_dict(self) -> dict:
        """The options as the config writes them: the given ones."""
        return given_values(self)


@dataclass(frozen=True)
class LearnedOptions(SourceOptions):
    """``learned``: planes (or other per-token values) from a zero-initialised head on the tokens."""

    source: ClassVar[str] = "learned"
    plane_decoder: str | None = _plane_decoder()
    per_layer: bool = setting(True, Field("bool"), "one head per layer (false: once, on the first block's input)")
    per_head: bool = setting(False, Field("bool"), "one set of values per attention head (relative encodings)")
    targets: str = _targets("learned")


@dataclass(frozen=True)
class BackboneOptions(SourceOptions):
    """``backbone``: a trainable head on a frozen feature backbone (``module``, required)."""

    source: ClassVar[str] = "backbone"
    plane_decoder: str | None = _plane_decoder()
    targets: str = _targets("backbone")
    module: object = _module()
    module_kwargs: dict = _module_kwargs()
    checkpoint: str | None = _checkpoint()
    feature_dim: int | None = setting(
        None, Field("int", low=1, nullable=True), "channels C of the backbone's features (required)"
    )
    hidden_dim: int = setting(64, _COUNT, "hidden width of the backbone's trainable head")


@dataclass(frozen=True)
class ExternalOptions(SourceOptions):
    """``external``: planes fitted to depth maps (the data's, or a frozen depth model's)."""

    source: ClassVar[str] = "external"
    targets: str = _targets("external")
    scope: str = _scope()
    use_normals: bool = setting(True, Field("bool"), "use the data's normals when present")
    depth: str = setting(
        "data",
        Field("str", choices=("data", "model")),
        "depth from the data (data.depth) or a frozen depth model (module)",
    )
    fit: str = setting("least-squares", Field("str", choices=FITS), "per-patch plane fit: least-squares or robust")
    min_points: int = setting(5, Field("int", low=3), "fewest valid pixels a patch's plane is fitted from")
    inlier_threshold: float = setting(0.02, Field("float", above=0), "robust fit: inlier distance (scene units)")
    fallback: str = setting(
        "median",
        Field("str", choices=FALLBACKS),
        "plane of a patch without enough points: median (fronto-parallel) or infinity",
    )
    depth_noise: int = setting(
        0,
        Field("int", low=0, high=3),
        "simulated depth-estimator noise on the data's depth: 0 (off) to 3 (poor), hrope.nvs.sources.user_depth",
    )
    depth_sparse: int = setting(
        0,
        Field("int", low=0),
        "keep this many SfM-like points of the data's depth per view (0: all), hrope.nvs.sources.user_depth",
    )
    module: object = _module()
    module_kwargs: dict = _module_kwargs()
    checkpoint: str | None = _checkpoint()
    align: str = setting(
        "median",
        Field("str", choices=ALIGNS),
        "depth model output: median (scaled to the data's depth per view) or none (scene units)",
    )
    max_inverse_distance: float | None = _max_inverse_distance()


@dataclass(frozen=True)
class OracleOptions(SourceOptions):
    """``oracle``: the dataset's ground-truth planes (synthetic data)."""

    source: ClassVar[str] = "oracle"
    targets: str = _targets("oracle")
    scope: str = _scope()
    max_inverse_distance: float | None = _max_inverse_distance()


# the options class of each parameter source (model.predictor)
SOURCE_OPTIONS: dict[str, type[SourceOptions]] = {
    options.source: options for options in (LearnedOptions, BackboneOptions, ExternalOptions, OracleOptions)
}


def source_options(name: str, options: dict | None = None) -> SourceOptions:
    """The :class:`SourceOptions` of parameter source ``name`` from the ``options`` a config gives
    (the rest take their defaults); an unknown source or key, a value its field refuses, or options
    that contradict each other raise :class:`PredictorError` naming the key and what is accepted."""
    if name not in SOURCE_OPTIONS:
        raise PredictorError(f"unknown predictor {name!r}; available: {', '.join(PREDICTORS)}")
    declared = settings_of(SOURCE_OPTIONS[name])
    given = dict(options or {})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise PredictorError(
            f"unknown predictor_options {unknown} for predictor {name!r}; "
            f"{did_you_mean(unknown[0], declared, 'predictor_options.')}known: {sorted(declared)}"
        )
    targets = given.get("targets", SOURCE_TARGETS[name][0])
    if targets not in SOURCE_TARGETS[name]:
        raise PredictorError(
            f"predictor_options.targets must be one of {list(SOURCE_TARGETS[name])} for predictor "
            f"{name!r}, got {targets!r}"
        )
    for key, option in declared.items():
        if key in given:
            option.check.check(f"predictor_options.{key}", given[key], PredictorError)
    values = SOURCE_OPTIONS[name](**given, given=tuple(given))
    _check_source_options(values, given)
    return values


def _check_source_options(options: SourceOptions, given: dict) -> None:
    """The rules across one source's options."""
    if getattr(options, "scope", None) == "all" and "targets" in given:
        raise PredictorError(
            "predictor_options.scope 'all' reads the target views' own geometry; it takes no targets option"
        )
    if isinstance(options, ExternalOptions):
        if (options.module is not None) != (options.depth == "model"):
            raise PredictorError(
                "predictor_options.module is the depth model of depth: model (and it needs one); got "
                f"depth {options.depth!r} with module {options.module!r}"
            )
        if options.depth == "model" and (options.depth_noise or options.depth_sparse):
            raise PredictorError(
                "predictor_options.depth_noise and depth_sparse simulate a user's depth from the data's depth "
                "(depth: data); got depth 'model'"
            )
    if isinstance(options, BackboneOptions):
        if options.module is None:
            raise PredictorError(
                "the 'backbone' predictor needs predictor_options.module: an nn.Module or an import path "
                "'package.module:factory' (called with predictor_options.module_kwargs)"
            )
        if options.feature_dim is None:
            raise PredictorError("the 'backbone' predictor needs predictor_options.feature_dim (channels C)")
