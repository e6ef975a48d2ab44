"""HRoPE's two forms: plane-induced homography exactness, reductions, clamps (DESIGN.md §4)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
from hrope.encodings import HRoPE
from helpers import random_cameras, random_planes, random_qkv
from test_encodings import world_plane_as_token_planes

GRID = (2, 3)


def relative(D: torch.Tensor, D_inv: torch.Tensor, i, j) -> torch.Tensor:
    """D_i D_j^-1 for per-token blocks ``(B, V, P, b, b)`` and (view, patch) indices."""
    return D[0, i[0], i[1]] @ D_inv[0, j[0], j[1]]


def project(cameras, X):
    """Homogeneous normalised pixels K̂ (R X + t) of world points ``X (M, 3)`` in every view: (V, M, 3)."""
    K = cameras.normalized_K()[0]
    X_c = cameras.R[0] @ X.T + cameras.t[0][..., None]
    return (K @ X_c).transpose(-1, -2)


def dehom(x):
    return x[..., :2] / x[..., 2:]


def random_world_plane(seed):
    g = torch.Generator().manual_seed(seed)
    n_w = torch.nn.functional.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0)
    return g, n_w, 4.0 + 2.0 * torch.rand(1, generator=g, dtype=torch.float64).item()


def points_on_plane(g, n_w, d_w, count=5):
    X = torch.randn(count, 3, generator=g, dtype=torch.float64)
    return X - ((X @ n_w) - d_w)[:, None] * n_w  # projected onto {n_w · X = d_w}


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), lift4=st.booleans(), gauge=st.sampled_from(["centroid", "world"]))
def test_hrope_homography_maps_plane_points_between_views(seed, lift4, gauge):
    cameras = random_cameras(B=1, V=3, seed=seed)
    g, n_w, d_w = random_world_plane(seed)
    planes = world_plane_as_token_planes(cameras, GRID, n_w, d_w)
    enc = HRoPE(lift4=lift4, gauge=gauge)
    D, D_inv = enc.prepare(cameras, GRID, 48, planes=planes).geometric_blocks()
    x = project(cameras, points_on_plane(g, n_w, d_w))
    for i, j in ((0, 1), (2, 0), (1, 2)):
        H = relative(D, D_inv, (i, 1), (j, 4))[:3, :3]
        torch.testing.assert_close(dehom(x[j] @ H.T), dehom(x[i]), rtol=0, atol=1e-6)
    # unit |det| (SL(3) up to sign)
    torch.testing.assert_close(torch.linalg.det(D[..., :3, :3]).abs(), torch.ones(D.shape[:3], dtype=D.dtype))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_hrope_lift_block_is_the_key_planes_homography(seed):
    """Top-left 3x3 of D_i D_j^-1 = K̂_i (R_ij + t_ij m_j^T) K̂_j^-1 exactly, for arbitrary planes."""
    cameras = random_cameras(B=1, V=2, seed=seed)
    planes = random_planes(1, 12, seed=seed)
    D, D_inv = hrope.get_encoding("hrope-lift").prepare(cameras, GRID, 32, planes=planes).geometric_blocks()
    m = planes.m(cameras, GRID).reshape(2, 6, 3)
    K = cameras.normalized_K()[0]
    E = cameras.world_to_cam[0]
    E_ij = E[0] @ torch.linalg.inv(E[1])
    R_ij, t_ij = E_ij[:3, :3], E_ij[:3, 3]
    for p_i, p_j in ((0, 5), (3, 2)):
        expected = K[0] @ (R_ij + torch.outer(t_ij, m[1, p_j])) @ torch.linalg.inv(K[1])
        torch.testing.assert_close(relative(D, D_inv, (0, p_i), (1, p_j))[:3, :3], expected, rtol=1e-10, atol=1e-10)
    # det D = det K̂: never singular
    torch.testing.assert_close(torch.linalg.det(D[0, :, 0]), torch.linalg.det(K))


def test_hrope_lift_same_plane_maps_points_at_infinity_row_to_zero():
    """For two tokens on one plane the full 4x4 maps (x_j, 0) to (x_i, 0)."""
    cameras = random_cameras(B=1, V=2, seed=3)
    g, n_w, d_w = random_world_plane(3)
    planes = world_plane_as_token_planes(cameras, GRID, n_w, d_w)
    D, D_inv = hrope.get_encoding("hrope-lift").prepare(cameras, GRID, 32, planes=planes).geometric_blocks()
    x = project(cameras, points_on_plane(g, n_w, d_w))
    M = relative(D, D_inv, (0, 0), (1, 3))
    mapped = torch.cat([x[1], torch.zeros(len(x[1]), 1, dtype=x.dtype)], -1) @ M.T
    torch.testing.assert_close(mapped[:, 3], torch.zeros(len(x[1]), dtype=x.dtype), rtol=0, atol=1e-10)
    torch.testing.assert_close(dehom(mapped[:, :3]), dehom(x[0]), rtol=0, atol=1e-6)


def test_hrope_lift_with_zero_planes_is_prope_exactly():
    cameras = random_cameras(B=2, V=3, seed=1)
    q, k, v = random_qkv(2, 2, 18, 64)
    zero = hrope.Planes.from_m(torch.zeros(2, 18, 3, dtype=torch.float64))
    lift = hrope.multiview_attention(q, k, v, encoding="hrope-lift", cameras=cameras, grid=GRID, planes=zero)
    prope = hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=GRID)
    torch.testing.assert_close(lift, prope, rtol=0, atol=1e-13)


# --------------------------------------------------------------------------- clamps
@pytest.mark.parametrize("gauge", ["centroid", "world"])
def test_hrope_clamps_plane_through_the_gauge_origin_and_stays_finite(gauge):
    """s = 1 - m·t = 0 (the plane contains the gauge's origin; t in the gauge) is clamped to |s| = eps."""
    cameras = random_cameras(B=1, V=2, seed=4)
    enc = HRoPE(gauge=gauge)
    t = enc.poses(cameras, GRID)[1].expand(1, 2, 6, 3).reshape(1, 12, 3)
    if gauge == "world":
        torch.testing.assert_close(t, cameras.t.repeat_interleave(6, dim=1), rtol=0, atol=0)
    m = t / (t * t).sum(-1, keepdim=True)  # m·t = 1
    clamped = enc.clamp_planes(m, t)
    s = 1 - (clamped * t).sum(-1)
    torch.testing.assert_close(s.abs(), torch.full_like(s, enc.min_world_offset_ratio))
    q, k, v = random_qkv(1, 2, 12, 48)
    out = hrope.multiview_attention(q, k, v, encoding=enc, cameras=cameras, grid=GRID, planes=hrope.Planes.from_m(m))
    assert torch.isfinite(out).all()
    D, _ = enc.prepare(cameras, GRID, 48, planes=hrope.Planes.from_m(m)).geometric_blocks()
    assert torch.linalg.cond(D).max() < 1e4


def test_hrope_clamps_leave_ordinary_planes_untouched_and_bound_inverse_distance():
    cameras = random_cameras(B=1, V=2, seed=5)
    t = cameras.t.repeat_interleave(6, dim=1) * 0.1
    enc = HRoPE()
    m = torch.randn(1, 12, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5
    torch.testing.assert_close(enc.clamp_planes(m, t), m, rtol=0, atol=0)
    huge = m / m.norm(dim=-1, keepdim=True) * 1e6
    assert enc.clamp_planes(huge, torch.zeros_like(t)).norm(dim=-1).max() <= enc.max_inverse_distance * (1 + 1e-12)


@pytest.mark.parametrize("name", ["hrope", "hrope-lift"])
def test_plane_seen_edge_on_through_camera_centre_is_finite(name):
    """A normal perpendicular to the patch-centre ray (the plane contains the camera centre)."""
    cameras = random_cameras(B=1, V=2, seed=6)
    from hrope.geometry import patch_rays

    rays = patch_rays(cameras.normalized_K(), GRID).flatten(1, 2)
    normal = torch.cross(rays, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64).expand_as(rays), dim=-1)
    planes = hrope.Planes(normal, torch.ones(1, 12, dtype=torch.float64))
    m = planes.m(cameras, GRID)
    assert torch.isfinite(m).all()
    q, k, v = random_qkv(1, 2, 12, 48)
    out = hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, planes=planes)
    assert torch.isfinite(out).all()
