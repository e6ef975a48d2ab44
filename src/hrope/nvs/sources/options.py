"""The sources by name: the source their checked options (``predictor_options``, one
:class:`hrope.nvs.config.SourceOptions` class per source) build."""

from __future__ import annotations

from ..config import BackboneOptions, ExternalOptions, LearnedOptions, OracleOptions, SourceOptions, source_options
from .backbone import BackboneSource
from .base import ParameterSource
from .errors import PredictorError
from .external import ExternalSource
from .learned import LearnedSource
from .oracle import OracleSource
from .specs import ParameterSpec
from .user_modules import user_module

__all__ = ["build_parameter_source"]


def build_parameter_source(
    name: str,
    specs: list[ParameterSpec],
    *,
    dim: int,
    num_layers: int,
    patch_size: int,
    options: SourceOptions | dict | None = None,
    depth_init: float = 1.0,
    attention_heads: int = 1,
    data_params: tuple[str, ...] = (),
) -> ParameterSource:
    """A parameter source by name with its ``options``: the :class:`hrope.nvs.config.SourceOptions` of
    ``name`` (a mapping is read by :func:`hrope.nvs.config.source_options`): for ``learned``
    (:class:`~hrope.nvs.config.LearnedOptions`) ``per_layer`` and ``per_head`` (one set of values for
    each of the ``attention_heads``); for ``backbone`` a ``module`` (nn.Module or import path
    ``'pkg.mod:factory'`` + ``module_kwargs``), a local ``checkpoint`` path, ``feature_dim`` and
    ``hidden_dim``; for ``external`` ``use_normals``, ``fit`` (+ ``min_points``,
    ``inlier_threshold``, ``fallback``) and ``depth`` (``data``, or ``model``: a depth model given
    like the backbone, + ``align``), ``depth_noise`` and ``depth_sparse`` (the data's depth as users
    have it), see :class:`ExternalSource`; for ``oracle`` and ``external`` ``scope`` and
    ``max_inverse_distance`` (:class:`GeometrySource`); every source's ``targets`` (see
    :class:`ParameterSource`); ``plane_decoder`` is read by :func:`parameter_specs`. The rules across
    the encoding and the source are :class:`hrope.nvs.config.ModelConfig`'s.
    ``depth_init``: the depth that ``external`` and ``oracle`` use for patches whose plane never
    crosses the patch-centre ray. ``data_params``: the encoding's inputs read from data
    (``Encoding.data_param_names``, e.g. rayrope's ``known_depth``); only ``external`` reads them
    (off its depth maps)."""
    if not isinstance(options, SourceOptions):
        options = source_options(name, options)
    elif options.source != name:
        raise PredictorError(f"predictor {name!r} got the options of predictor {options.source!r}")
    if isinstance(options, LearnedOptions):
        return LearnedSource(
            specs,
            dim,
            num_layers,
            options.per_layer,
            options.targets,
            attention_heads if options.per_head else 1,
        )
    if isinstance(options, OracleOptions):
        return OracleSource(specs, patch_size, depth_init, options.targets, options.scope, options.max_inverse_distance)
    if isinstance(options, ExternalOptions):
        return _external_source(specs, patch_size, depth_init, options, data_params)
    assert isinstance(options, BackboneOptions)
    return _backbone_source(specs, options)


def _external_source(
    specs: list[ParameterSpec],
    patch_size: int,
    depth_init: float,
    options: ExternalOptions,
    data_params: tuple[str, ...],
) -> ExternalSource:
    """The ``external`` source of checked ``options``."""
    depth_model = user_module(options, "predictor_options.depth 'model'") if options.depth == "model" else None
    return ExternalSource(
        specs,
        patch_size,
        use_normals=options.use_normals,
        depth_init=depth_init,
        targets=options.targets,
        scope=options.scope,
        fit=options.fit,
        min_points=options.min_points,
        inlier_threshold=options.inlier_threshold,
        fallback=options.fallback,
        depth_model=depth_model,
        align=options.align,
        max_inverse_distance=options.max_inverse_distance,
        data_params=data_params,
        depth_noise=options.depth_noise,
        depth_sparse=options.depth_sparse,
    )


def _backbone_source(specs: list[ParameterSpec], options: BackboneOptions) -> BackboneSource:
    """The ``backbone`` source of checked ``options`` (its module imported or given)."""
    module = user_module(options, "the 'backbone' predictor")
    assert options.feature_dim is not None  # BackboneOptions requires it
    return BackboneSource(specs, module, int(options.feature_dim), int(options.hidden_dim), options.targets)
