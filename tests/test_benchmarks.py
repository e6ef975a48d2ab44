"""The same-run peer of benchmarks/attention_overhead.py: PRoPE applied with the official
module's algorithm must compute exactly what hrope's ``prope`` computes, or the comparison
would time a different function."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import hrope

from helpers import random_cameras, random_qkv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from prope_einsum import prope_einsum_attention  # noqa: E402


@pytest.mark.parametrize(("views", "grid", "head_dim"), [(2, (3, 5), 32), (3, (4, 2), 64), (4, (2, 2), 48)])
def test_prope_einsum_equals_prope(views, grid, head_dim):
    cameras = random_cameras(B=2, V=views, image_size=(8 * grid[0], 8 * grid[1]), seed=views)
    q, k, v = random_qkv(2, 3, views * grid[0] * grid[1], head_dim, seed=head_dim)
    expected = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=grid)
    got = prope_einsum_attention(q, k, v, cameras=cameras, grid=grid)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, hrope.multiview_attention(q, k, v, encoding="rope2d", cameras=cameras, grid=grid))
