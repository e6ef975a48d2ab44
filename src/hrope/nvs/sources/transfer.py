"""Target-view geometry from the context views: cast the target rays into the context geometry.

A novel-view-synthesis model has no image of a target view, so a plane source that predicts
from images (or fits depth maps) has nothing to say about the target tokens. These functions
carry the context views' geometry into the target cameras instead, using only what a model has at
test time (context geometry and every view's camera):

- :func:`transfer_planes`: every context token's plane is sampled at ``samples x samples``
  points spread over its patch (on the plane), the points are moved into each target camera and
  z-buffered per target patch; a target patch takes the plane of the nearest point, expressed in
  the target camera's frame. Differentiable in the context planes (the choice of the nearest
  point is not), so learned planes get gradients through the targets too.
- :func:`transfer_depth`: the context depth maps are splatted pixel by pixel into each target
  camera with a z-buffer (the nearest surface wins), giving sparse target depth maps that can be
  fitted per patch (:meth:`hrope.Planes.from_depth`).

Conventions: views ``[0, num_context)`` are the context, the rest targets; planes are plane vectors
m = n / d in each token's camera frame (:class:`hrope.Planes`); tokens view-major, x fastest.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...cameras import Cameras
from ...geometry import invert_se3, patch_rays, pixel_rays

__all__ = ["nearest_per_cell", "transfer_planes", "transfer_depth", "MIN_DEPTH"]

MIN_DEPTH = 1e-4  # points closer than this to a camera (or behind it) are not splatted


def nearest_per_cell(depth: Tensor, cell: Tensor, valid: Tensor, num_cells: int) -> Tensor:
    """Z-buffer: for every cell the index of the valid point with the smallest depth.

    ``depth``, ``cell`` (long, in ``[0, num_cells)`` where valid) and ``valid`` are ``(B, M)``.
    Returns ``(B, num_cells)`` long point indices, -1 for cells no valid point falls in (ties:
    the lowest index).
    """
    B, M = depth.shape
    cell = torch.where(valid, cell, torch.zeros_like(cell))
    key = torch.where(valid, depth, torch.full_like(depth, float("inf")))
    best = key.new_full((B, num_cells), float("inf")).scatter_reduce(1, cell, key, reduce="amin")
    winner = valid & (key == best.gather(1, cell))
    index = torch.arange(M, device=depth.device).expand(B, M)
    chosen = cell.new_full((B, num_cells), M).scatter_reduce(1, cell, torch.where(winner, index, M), reduce="amin")
    return torch.where(chosen == M, torch.full_like(chosen, -1), chosen)


def _per_target(x: Tensor) -> Tensor:
    """``(B, Vt, Vc, M)`` -> ``(B*Vt, Vc*M)``: every target view's candidate points in one row."""
    return x.flatten(2, 3).flatten(0, 1)


def _to_targets(points: Tensor, cameras: Cameras, num_context: int) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Context-camera points ``(B, Vc, M, 3)`` in every target camera ``(B, Vt, Vc, M, 3)``, and the
    rotations R_tc ``(B, Vt, Vc, 3, 3)`` and translations t_tc ``(B, Vt, Vc, 3)`` of the moves."""
    E = cameras.world_to_cam.to(points.dtype)
    move = E[:, num_context:, None] @ invert_se3(E[:, None, :num_context])  # E_t E_c^-1: (B, Vt, Vc, 4, 4)
    R, t = move[..., :3, :3], move[..., :3, 3]
    moved = points[:, None] @ R.transpose(-1, -2) + t[..., None, :]
    return moved, (R, t)


def _image_cells(X: Tensor, K_norm: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Cell index ``(...)`` (row-major on ``grid``) and validity of target-camera points ``X (..., 3)``
    projected with ``K_norm`` (broadcastable ``(..., 3, 3)``); valid: in front and inside."""
    z = X[..., 2]
    front = z > MIN_DEPTH
    safe_z = torch.where(front, z, torch.ones_like(z))
    u = (K_norm[..., 0, 0] * X[..., 0] + K_norm[..., 0, 2] * z) / safe_z  # normalised, in [-0.5, 0.5)
    v = (K_norm[..., 1, 1] * X[..., 1] + K_norm[..., 1, 2] * z) / safe_z
    gh, gw = grid
    ix, iy = torch.floor((u + 0.5) * gw), torch.floor((v + 0.5) * gh)
    inside = front & (ix >= 0) & (ix < gw) & (iy >= 0) & (iy < gh)
    cell = (iy.clamp(0, gh - 1) * gw + ix.clamp(0, gw - 1)).long()
    return cell, inside


def transfer_planes(
    m: Tensor, cameras: Cameras, grid: tuple[int, int], num_context: int, samples: int = 4
) -> tuple[Tensor, Tensor]:
    """Target-view planes from the context views' planes.

    Args:
        m: ``(B, Vc*P, 3)`` planes of the context views (the first ``num_context`` of ``cameras``).
        cameras: the ``(B, V)`` cameras, context first.
        grid: ``(grid_h, grid_w)``; P = grid_h * grid_w.
        samples: points per patch side placed on each context plane.

    Returns ``(m_target (B, Vt*P, 3), hit (B, Vt*P) bool)``: the plane of the nearest context
    surface seen through each target patch, m_t = R_tc m_c / (1 + (R_tc m_c)·t_tc) in the target
    camera's frame, and whether any context point fell in that patch (m_target is 0 where not).
    """
    B, P = cameras.batch_size, grid[0] * grid[1]
    Vc, Vt = num_context, cameras.num_views - num_context
    K = cameras.normalized_K(m.dtype)
    m_context = m.reshape(B, Vc, P, 3)
    offsets = [((i + 0.5) / samples, (j + 0.5) / samples) for j in range(samples) for i in range(samples)]
    rays = torch.stack([patch_rays(K[:, :Vc], grid, offset) for offset in offsets], 3)  # (B, Vc, P, S, 3)
    inverse_depth = (m_context[:, :, :, None] * rays).sum(-1)  # m·r̂ = 1 / z on the plane
    on_plane = inverse_depth > 1.0 / 1e4  # the plane crosses the ray in front of the camera (z < 1e4)
    points = rays / torch.where(on_plane, inverse_depth, torch.ones_like(inverse_depth))[..., None]
    moved, (R, t) = _to_targets(points.flatten(2, 3).detach(), cameras, Vc)  # (B, Vt, Vc, P*S, 3)
    cell, inside = _image_cells(moved, K[:, Vc:, None, None], grid)
    plane_t = torch.einsum("btcij,bcpj->btcpi", R, m_context)  # R_tc m_c: (B, Vt, Vc, P, 3)
    denominator = 1.0 + (plane_t * t[:, :, :, None]).sum(-1)
    facing = denominator.abs() > 1e-6  # the plane does not contain the target camera centre
    S = len(offsets)
    valid = inside & on_plane.flatten(2, 3)[:, None] & facing.repeat_interleave(S, dim=-1)  # (B, Vt, Vc, P*S)
    target_planes = plane_t / torch.where(facing, denominator, torch.ones_like(denominator))[..., None]
    winner = nearest_per_cell(_per_target(moved[..., 2]), _per_target(cell), _per_target(valid), P)  # (B*Vt, P)
    source = winner.clamp_min(0) // S  # the context token (c * P + p) of the winning point
    candidates = target_planes.flatten(0, 1).flatten(1, 2)  # (B*Vt, Vc*P, 3)
    chosen = candidates.gather(1, source[..., None].expand(-1, -1, 3))
    hit = winner >= 0
    chosen = torch.where(hit[..., None], chosen, torch.zeros_like(chosen))
    return chosen.reshape(B, Vt * P, 3), hit.reshape(B, Vt * P)


def transfer_depth(depth: Tensor, cameras: Cameras, num_context: int) -> Tensor:
    """Target z-depth maps ``(B, Vt, H, W)`` splatted from the context depth maps ``(B, Vc, H, W)``
    (one point per context pixel centre, nearest surface per target pixel); inf where no point
    lands. Not differentiable (a data-side reprojection)."""
    B, Vc, H, W = depth.shape
    Vt = cameras.num_views - num_context
    with torch.no_grad():
        K = cameras.K.to(depth.dtype)
        valid_depth = torch.isfinite(depth) & (depth > 0)
        z = torch.where(valid_depth, depth, torch.zeros_like(depth))
        points = (pixel_rays(K[:, :Vc], (H, W)) * z[..., None]).flatten(2, 3)  # (B, Vc, H*W, 3)
        moved, _ = _to_targets(points, cameras, num_context)  # (B, Vt, Vc, H*W, 3)
        K_pixels = cameras.normalized_K(depth.dtype)[:, num_context:, None, None]
        cell, inside = _image_cells(moved, K_pixels, (H, W))
        valid = inside & valid_depth.flatten(2)[:, None]
        winner = nearest_per_cell(_per_target(moved[..., 2]), _per_target(cell), _per_target(valid), H * W)
        target_z = _per_target(moved[..., 2]).gather(1, winner.clamp_min(0))
        target_z = torch.where(winner >= 0, target_z, torch.full_like(target_z, float("inf")))
    return target_z.reshape(B, Vt, H, W)
