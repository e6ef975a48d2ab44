"""hrope.nvs.sources.transfer: the z-buffer and the transfer of context geometry into target cameras."""

from __future__ import annotations

import torch
from _lvsm_helpers import synthetic_batch

from hrope.nvs.sources.transfer import nearest_per_cell, transfer_depth, transfer_planes

GRID = (4, 4)


def test_nearest_per_cell_picks_the_nearest_valid_point():
    depth = torch.tensor([[3.0, 1.0, 2.0, 0.5, 4.0]])
    cell = torch.tensor([[0, 0, 1, 1, 2]])
    valid = torch.tensor([[True, True, True, False, True]])  # the nearest point of cell 1 is invalid
    assert nearest_per_cell(depth, cell, valid, 4).tolist() == [[1, 2, 4, -1]]


def test_transfer_reproduces_the_target_views_own_geometry():
    """Synthetic rooms: the target's own planes / depth where a context surface is seen."""
    batch = synthetic_batch(num_scenes=2, num_views=3)
    planes = batch.planes(8)
    m = planes.m(batch.cameras, GRID)
    transferred, hit = transfer_planes(m[:, :32], batch.cameras, GRID, 2)
    assert hit.float().mean() > 0.8
    truth = m[:, 32:]
    close = (transferred - truth).norm(dim=-1) <= 1e-3 * truth.norm(dim=-1).clamp_min(1)
    assert close[hit].float().mean() > 0.6  # patches where the nearest context surface is the target's surface
    depth = transfer_depth(batch.depth[:, :2], batch.cameras, 2)
    seen = torch.isfinite(depth)
    assert 0.4 < seen.float().mean() < 1.0  # a forward splat leaves holes
    relative = ((depth - batch.depth[:, 2:]).abs() / batch.depth[:, 2:])[seen]
    assert relative.median() < 0.02


def test_transferred_planes_are_differentiable_in_the_context_planes():
    batch = synthetic_batch(num_scenes=1, num_views=3)
    m = batch.planes(8).m(batch.cameras, GRID)[:, :32].clone().requires_grad_()
    transferred, hit = transfer_planes(m, batch.cameras, GRID, 2)
    transferred[hit].sum().backward()
    assert torch.isfinite(m.grad).all() and m.grad.abs().sum() > 0


def test_a_plane_behind_every_target_ray_is_not_transferred():
    batch = synthetic_batch(num_scenes=1, num_views=3)
    m = torch.zeros(1, 32, 3)  # planes at infinity: no point to splat
    _, hit = transfer_planes(m, batch.cameras, GRID, 2)
    assert not hit.any()
