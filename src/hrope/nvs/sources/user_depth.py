"""Depth as users have it: a depth-estimator noise model and sparse SfM-like points, simulated
on exact depth maps (the synthetic renderer's) for the ``external`` source.

Both take z-depth ``(B, V, H, W)`` (inf, NaN or <= 0: no depth) and the views' images
``(B, V, 3, H, W)`` in [0, 1], and act on each view alone (nothing is shared between views, so
the target views' depth is never read when only the context views are passed). Every random draw
of a view comes from its own generator seeded by :func:`view_seeds`, a hash of the view's image:
the same image always gets the same noise (a depth estimator is a function of the image), in
training and evaluation, for every model compared on the same data, whatever the global RNG.

:func:`noisy_depth` applies one of :data:`NOISE_LEVELS`, in this order (docs/data.md, "Depth as
users have it", gives the numbers and the measured errors):

1. **Smeared edges.** Where the valid depth within ``(2k+1) x (2k+1)`` pixels of a pixel spans more
   than a factor :data:`EDGE_CONTRAST` (a depth discontinuity within ``k`` pixels), its depth is
   replaced by the mean valid depth of that window (``k = max(1, round(smear * min(H, W)))``):
   both sides of a discontinuity are mixed, as an estimator's smooth output mixes them.
2. **Multiplicative noise:** ``d * exp(pixel * n + smooth * s)``, ``n`` white Gaussian per pixel,
   ``s`` a Gaussian on a :data:`SMOOTH_NODES` x :data:`SMOOTH_NODES` grid interpolated bilinearly
   over the image (low-frequency error, which a per-patch plane fit does not average away).
3. **Scale and shift** per view: ``exp(scale * a) * d + shift * b * median(d)``, ``a, b`` standard
   Gaussian, the median over the view's clean valid depth (an alignment to the right scale that is
   off by a random factor and offset).
4. **Holes:** ``holes`` discs (centres uniform over the image, radii uniform in
   ``[hole_radius / 2, hole_radius] * min(H, W)``) where depth becomes NaN.

Values <= 0 after the shift count as missing, like every invalid depth. The draws of a view do not
depend on the level (the levels scale the same draws; a level's holes are among the next level's),
so the error grows with the level view by view.

:func:`sparse_depth` keeps ``points`` pixels per view, chosen like SfM keypoints: among the pixels
with depth, drawn without replacement with probability proportional to the image gradient magnitude
(plus :data:`FLAT_WEIGHT`), each kept depth multiplied by ``exp(SPARSE_NOISE * n)``; the rest is
inf (no depth), as for COLMAP points (:mod:`hrope.nvs.data.real.colmap_points`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.rng import stream_seed

__all__ = [
    "DepthNoise",
    "NOISE_LEVELS",
    "EDGE_CONTRAST",
    "SMOOTH_NODES",
    "SPARSE_NOISE",
    "FLAT_WEIGHT",
    "view_seeds",
    "noisy_depth",
    "sparse_depth",
    "user_depth",
]


@dataclass(frozen=True)
class DepthNoise:
    """One noise level (module doc): log-normal ``scale`` sigma, ``shift`` sigma as a fraction of
    the view's median depth, ``pixel`` (white) and ``smooth`` (low-frequency) log-depth sigmas,
    ``smear`` radius as a fraction of the shorter image side, ``holes`` discs of radius at most
    ``hole_radius`` x the shorter side."""

    scale: float
    shift: float
    pixel: float
    smooth: float
    smear: float
    holes: int
    hole_radius: float


# 1: a good monocular estimator aligned per view; 3: a poor one (docs/data.md gives their measured errors)
NOISE_LEVELS = {
    1: DepthNoise(scale=0.03, shift=0.015, pixel=0.02, smooth=0.055, smear=1 / 64, holes=1, hole_radius=0.06),
    2: DepthNoise(scale=0.08, shift=0.04, pixel=0.05, smooth=0.15, smear=2 / 64, holes=3, hole_radius=0.08),
    3: DepthNoise(scale=0.16, shift=0.10, pixel=0.10, smooth=0.30, smear=3 / 64, holes=6, hole_radius=0.10),
}
MAX_HOLES = max(level.holes for level in NOISE_LEVELS.values())
EDGE_CONTRAST = 1.1  # max / min valid depth in the window above which a pixel is next to a discontinuity
SMOOTH_NODES = 5  # the low-frequency error's grid (nodes per side)
SPARSE_NOISE = 0.01  # log-depth sigma of a sparse point (triangulation error)
FLAT_WEIGHT = 1e-3  # sampling weight of a pixel without image gradient (per unit of gradient)


def view_seeds(images: Tensor) -> list[int]:
    """One seed per view of ``images (B, V, 3, H, W)`` (view-major order ``b * V + v``): a hash of
    the view's image quantised to 8 bits and subsampled to at most about 32 x 32 pixels."""
    B, V, _, H, W = images.shape
    step_h, step_w = max(1, H // 32), max(1, W // 32)
    small = (images[..., ::step_h, ::step_w].detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    return [
        stream_seed("hrope.user-depth", hashlib.blake2b(view.numpy().tobytes(), digest_size=8).hexdigest())
        for view in small.flatten(0, 1)
    ]


def _generators(images: Tensor, stream: str) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(stream_seed(seed, stream)) for seed in view_seeds(images)]


def _smear(depth: Tensor, valid: Tensor, radius: int) -> Tensor:
    """``depth (B, V, H, W)`` with pixels within ``radius`` of a discontinuity replaced by their
    window's mean valid depth (module doc, step 1)."""
    window, flat = 2 * radius + 1, lambda x: x.flatten(0, 1)[:, None]  # noqa: E731
    top = F.max_pool2d(flat(torch.where(valid, depth, -torch.inf)), window, 1, radius)
    bottom = -F.max_pool2d(flat(torch.where(valid, -depth, -torch.inf)), window, 1, radius)
    total = F.avg_pool2d(flat(torch.where(valid, depth, 0.0)), window, 1, radius)
    count = F.avg_pool2d(flat(valid.to(depth.dtype)), window, 1, radius)
    edge = valid & (top > EDGE_CONTRAST * bottom).reshape(depth.shape)
    return torch.where(edge, (total / count.clamp_min(1e-12)).reshape(depth.shape), depth)


def _noise_draws(images: Tensor) -> dict[str, Tensor]:
    """Per view (stacked ``(B, V, ...)``, float32 on CPU): the standard draws of every level."""
    B, V, _, H, W = images.shape
    draws: dict[str, list[Tensor]] = {"affine": [], "pixel": [], "smooth": [], "holes": []}
    for generator in _generators(images, "noise"):
        draws["affine"].append(torch.randn(2, generator=generator))
        draws["pixel"].append(torch.randn(H, W, generator=generator))
        draws["smooth"].append(torch.randn(SMOOTH_NODES, SMOOTH_NODES, generator=generator))
        draws["holes"].append(torch.rand(MAX_HOLES, 3, generator=generator))
    return {name: torch.stack(values).unflatten(0, (B, V)) for name, values in draws.items()}


def _holes(centres: Tensor, count: int, radius: float, size: tuple[int, int]) -> Tensor:
    """``(B, V, H, W)`` bool: the first ``count`` discs of ``centres (B, V, MAX_HOLES, 3)`` (y, x,
    radius factor in [0, 1))."""
    H, W = size
    side = min(H, W)
    y = (torch.arange(H, device=centres.device) + 0.5)[:, None]
    x = (torch.arange(W, device=centres.device) + 0.5)[None, :]
    out = torch.zeros(centres.shape[:2] + (H, W), dtype=torch.bool, device=centres.device)
    for k in range(count):
        cy, cx, r = (centres[:, :, k, i, None, None] for i in range(3))
        reach = radius * side * (0.5 + 0.5 * r)
        out |= (y - cy * H) ** 2 + (x - cx * W) ** 2 < reach**2
    return out


def noisy_depth(depth: Tensor, images: Tensor, level: int) -> Tensor:
    """``depth (B, V, H, W)`` as an estimator of :data:`NOISE_LEVELS` ``[level]`` gives it (module
    doc), seeded by the views' ``images (B, V, 3, H, W)``; ``level`` 0 returns ``depth`` itself."""
    if level == 0:
        return depth
    noise = NOISE_LEVELS[level]
    H, W = depth.shape[-2:]
    draws = {k: v.to(depth.device) for k, v in _noise_draws(images).items()}
    work = depth.float()
    valid = torch.isfinite(work) & (work > 0)
    out = _smear(work, valid, max(1, round(noise.smear * min(H, W))))
    smooth = F.interpolate(draws["smooth"].flatten(0, 1)[:, None], size=(H, W), mode="bilinear", align_corners=True)
    out = out * torch.exp(noise.pixel * draws["pixel"] + noise.smooth * smooth.reshape(depth.shape))
    median = torch.where(valid, work, torch.nan).flatten(2).nanmedian(-1).values[..., None, None]
    a, b = draws["affine"][..., 0, None, None], draws["affine"][..., 1, None, None]
    out = torch.exp(noise.scale * a) * out + noise.shift * b * median
    out = torch.where(_holes(draws["holes"], noise.holes, noise.hole_radius, (H, W)), torch.nan, out)
    return torch.where(valid, out, work).to(depth.dtype)


def sparse_depth(depth: Tensor, images: Tensor, points: int) -> Tensor:
    """``depth (B, V, H, W)`` kept at ``points`` pixels per view (all its valid pixels when it has
    fewer), chosen and perturbed as SfM points (module doc); inf elsewhere."""
    B, V, H, W = depth.shape
    gray = images.float().mean(2)  # (B, V, H, W)
    dx = F.pad(gray[..., :, 2:] - gray[..., :, :-2], (1, 1)).abs()
    dy = F.pad(gray[..., 2:, :] - gray[..., :-2, :], (0, 0, 1, 1)).abs()
    uniform, noise = [], []
    for generator in _generators(images, "sparse"):
        uniform.append(torch.rand(H * W, generator=generator))
        noise.append(torch.randn(H * W, generator=generator))
    gumbel = -torch.log(-torch.log(torch.stack(uniform).clamp(1e-12, 1 - 1e-7))).to(depth.device)
    valid = (torch.isfinite(depth) & (depth > 0)).flatten(2)
    key = torch.log((dx + dy).flatten(2) + FLAT_WEIGHT) + gumbel.reshape(B, V, H * W)  # Gumbel-top-k sampling
    key = torch.where(valid, key, -torch.inf)
    chosen = key.topk(min(points, H * W), dim=-1).indices
    keep = torch.zeros_like(valid).scatter(-1, chosen, True) & valid
    jitter = torch.exp(SPARSE_NOISE * torch.stack(noise).to(depth.device)).reshape(B, V, H * W)
    kept = torch.where(keep, depth.flatten(2) * jitter.to(depth.dtype), torch.inf)
    return kept.reshape(B, V, H, W)


def user_depth(depth: Tensor, images: Tensor, noise: int = 0, points: int = 0) -> Tensor:
    """``depth`` through :func:`noisy_depth` at level ``noise`` then, when ``points`` > 0,
    :func:`sparse_depth`; ``depth`` itself when both are 0."""
    depth = noisy_depth(depth, images, noise)
    return sparse_depth(depth, images, points) if points else depth
