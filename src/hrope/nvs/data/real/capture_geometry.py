"""Geometry of a capture's views as users have it (``data.geometry``): none, SfM points, or priors aligned to them.

:func:`with_geometry` gives the loaded views of one capture ``depth`` (and ``normals``) from one of
:data:`GEOMETRY_SOURCES`:

- ``none``: nothing (the views keep no depth and no normals).
- ``sfm``: the sparse z-depth of the points triangulated from the capture's **training views only**
  with their known poses (:func:`hrope.nvs.data.real.sfm.triangulate`, cached on disk; the views
  used are part of its key), projected into each view with its final cameras (after the crop and
  resize; :func:`hrope.nvs.data.real.sfm.sparse_depth`); inf where no point is seen.
- ``priors``: each view's monocular depth prior (``Scene.relative_depth``) aligned by a robust
  scale and shift to that view's SfM sparse depth (:func:`hrope.nvs.data.real.prior_alignment.align_depth`;
  inf where the prior is missing or the view could not be aligned), and the prior normals
  (``Scene.normals``, camera axes) as they are.

Views that are not training views get no depth and zero normals (they observe no point); the
dataset also strips them from every target (the leak rule, :mod:`hrope.nvs.data.real.captures`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from collections.abc import Sequence

import torch
from torch import Tensor

from ...config.schema import GEOMETRY_SOURCES
from ..scene import Scene, SceneError
from .frames import Frame
from .prior_alignment import align_depth
from .sfm import sparse_depth, triangulate

__all__ = ["GEOMETRY_SOURCES", "with_geometry", "sfm_depth", "prior_depth"]


def sfm_depth(
    frames: Sequence[Frame], views: Sequence[int], training: Sequence[int], scene: Scene, cache_dir: str | Path | None
) -> Tensor:
    """``(V, H, W)`` sparse z-depth of ``scene`` (frames ``views`` of ``frames``, at its final
    cameras) of the points triangulated from ``frames[training]`` only; inf where none is seen, and
    in every view not in ``training`` (:func:`hrope.nvs.data.real.sfm.sparse_depth`)."""
    points = triangulate(list(frames), training, cache_dir=cache_dir, name=scene.name)
    return sparse_depth(points, scene, views)


def prior_depth(relative: Tensor, sparse: Tensor) -> Tensor:
    """``(V, H, W)`` ``relative`` depth priors aligned per view to ``sparse`` z-depth; inf where
    the prior is missing or its view could not be aligned."""
    aligned = align_depth(relative, torch.where(torch.isfinite(sparse), sparse, torch.nan)).depth
    return torch.where(torch.isfinite(aligned) & (aligned > 0), aligned, torch.inf)


def with_geometry(
    scene: Scene,
    frames: Sequence[Frame],
    views: Sequence[int],
    training: Sequence[int],
    source: str,
    cache_dir: str | Path | None = None,
) -> Scene:
    """``scene`` (the frames ``views`` of ``frames``, loaded with ``priors=True`` for ``priors``)
    with the depth and normals of ``source`` (module doc), its ``relative_depth`` dropped."""
    if source not in GEOMETRY_SOURCES:
        raise SceneError(f"{scene.name}: geometry must be one of {', '.join(GEOMETRY_SOURCES)}, got {source!r}")
    if source == "none":
        return replace(scene, depth=None, normals=None, relative_depth=None)
    depth = sfm_depth(frames, views, training, scene, cache_dir)
    if source == "sfm":
        return replace(scene, depth=depth, normals=None, relative_depth=None)
    if scene.relative_depth is None or scene.normals is None:
        raise SceneError(f"{scene.name}: geometry 'priors' needs a depth and a normal prior per view")
    seen = torch.tensor([v in set(training) for v in views])[:, None, None]
    aligned = torch.where(seen, prior_depth(scene.relative_depth, depth), torch.inf)
    normals = torch.where(seen[:, None], scene.normals, torch.zeros_like(scene.normals))
    return replace(scene, depth=aligned, normals=normals, relative_depth=None)
