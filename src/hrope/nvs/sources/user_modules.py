"""User code behind the ``backbone`` and ``external`` sources: a module built from an import path,
with a local checkpoint loaded."""

from __future__ import annotations

import importlib
from pathlib import Path
from collections.abc import Callable

import torch
from torch import nn

from ..config import BackboneOptions, ExternalOptions
from .errors import PredictorError

__all__ = ["import_factory", "load_backbone", "user_module"]


def import_factory(path: str) -> Callable[..., nn.Module]:
    """The callable named by ``'package.module:name'`` (user code that builds a backbone or depth model)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PredictorError(f"predictor_options.module must look like 'package.module:factory', got {path!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise PredictorError(f"predictor_options.module {path!r} cannot be imported: {error}") from error


def load_backbone(module: nn.Module, checkpoint: str | Path) -> nn.Module:
    """Load a LOCAL checkpoint into ``module`` (safetensors, or a torch file with weights_only=True)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise PredictorError(f"predictor_options.checkpoint not found: {path} (a local file)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        state = loaded["state_dict"] if isinstance(loaded, dict) and "state_dict" in loaded else loaded
    module.load_state_dict(state)
    return module


def user_module(options: BackboneOptions | ExternalOptions, what: str) -> nn.Module:
    """The module of ``predictor_options.module`` (built from an import path with ``module_kwargs``),
    with the LOCAL ``checkpoint`` loaded when given; ``what`` names its user in errors."""
    module = options.module
    if isinstance(module, str):
        module = import_factory(module)(**options.module_kwargs)
    if not isinstance(module, nn.Module):
        raise PredictorError(
            f"{what} needs predictor_options.module: an nn.Module or an import path "
            "'package.module:factory' (called with predictor_options.module_kwargs)"
        )
    if options.checkpoint:
        load_backbone(module, options.checkpoint)
    return module
