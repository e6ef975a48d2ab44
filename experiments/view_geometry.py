"""Geometry of a held-out view for the geometry sweep (experiments/geometry_sweep.py): how far a target
view turns from its context views, and how slanted the surface seen at each of its pixels is.

Conventions (DESIGN.md §2): world-to-camera OpenCV extrinsics, so a camera looks along ``+z`` of its
frame; its viewing direction in the world is the third row of ``R``. These are analysis quantities
read from the ground truth of the rendered scenes; no model sees them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hrope.cameras import Cameras
from hrope.geometry import pixel_rays

__all__ = [
    "SLANT_EDGES",
    "viewing_directions",
    "nearest_context_angle",
    "nearest_context_distance",
    "surface_slant",
    "quantile_edges",
    "bin_index",
]

SLANT_EDGES = (0.0, 30.0, 60.0, 90.0)  # degrees: frontal, oblique, grazing


def viewing_directions(cameras: Cameras) -> Tensor:
    """World-frame unit optical axes ``(B, V, 3)`` (the camera's ``+z`` axis: ``R^T e_z``)."""
    return cameras.R[..., 2, :]


def nearest_context_angle(cameras: Cameras, num_context: int) -> Tensor:
    """Degrees ``(B, V - num_context)``: for each target view (views ``num_context:``), the smallest
    angle between its viewing direction and a context view's (views ``:num_context``)."""
    axes = viewing_directions(cameras).double()
    cosine = torch.einsum("btk,bck->btc", axes[:, num_context:], axes[:, :num_context]).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cosine)).amin(-1)


def nearest_context_distance(cameras: Cameras, num_context: int) -> Tensor:
    """``(B, V - num_context)``: each target camera centre's distance to the nearest context camera
    centre (in the scene's units; normalised scenes have a unit context baseline)."""
    centres = cameras.centers().double()
    return torch.cdist(centres[:, num_context:], centres[:, :num_context]).amin(-1)


def surface_slant(normals: Tensor, K: Tensor) -> Tensor:
    """Degrees ``(B, V, H, W)``: the angle between the surface normal seen at each pixel and the
    ray back to the camera (0: the surface faces the camera; 90: seen edge-on); NaN where no
    surface is seen (zero normal).

    Args:
        normals: ``(B, V, 3, H, W)`` normals in each camera's frame (unit, or zero where empty);
            the sign does not matter.
        K: ``(B, V, 3, 3)`` pixel intrinsics of the ``(H, W)`` images.
    """
    H, W = normals.shape[-2:]
    rays = pixel_rays(K.double(), (H, W))  # (B, V, H, W, 3)
    n = normals.double().permute(0, 1, 3, 4, 2)
    length = n.norm(dim=-1)
    cosine = (n * rays).sum(-1).abs() / (length * rays.norm(dim=-1)).clamp_min(1e-12)
    slant = torch.rad2deg(torch.acos(cosine.clamp(0.0, 1.0)))
    return torch.where(length > 0.5, slant, math.nan)


def quantile_edges(values: Tensor, bins: int) -> list[float]:
    """``bins + 1`` edges at the ``0, 1/bins, ..., 1`` quantiles of ``values`` (so each bin holds
    about the same number of values; ties can leave a bin short)."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    levels = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64)
    return torch.quantile(values.double().flatten(), levels).tolist()


def bin_index(values: Tensor, edges: list[float] | tuple[float, ...]) -> Tensor:
    """The bin of each value (int64, same shape): bin ``i`` is ``[edges[i], edges[i+1])``, the
    first and last bins open outwards (values below the first or above the last edge join them);
    NaN values get ``len(edges) - 1`` (one past the last bin)."""
    inner = torch.tensor(edges[1:-1], dtype=torch.float64, device=values.device)
    index = torch.bucketize(values.double().contiguous(), inner, right=True)
    return torch.where(values.isnan(), len(edges) - 1, index)
