"""Planes and cameras: conversions, plane fitting, world-frame forms."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import hrope
from hrope.geometry import invert_intrinsics, invert_se3, patch_rays
from hrope.planes import MIN_GRAZING_COS
from helpers import random_cameras, random_planes, random_se3


def test_normal_and_depth_round_trip():
    cameras = random_cameras(B=2, V=2, seed=0)
    planes = random_planes(2, 12, seed=0)
    normal, depth = hrope.Planes.from_m(planes.m(cameras, (2, 3))).normal_and_depth(cameras, (2, 3))
    torch.testing.assert_close(depth, planes.depth)
    torch.testing.assert_close(normal, planes.normal)  # random_planes face the camera (n_z < 0)


def test_depth_point_lies_on_plane():
    cameras = random_cameras(B=1, V=2, seed=1)
    planes = random_planes(1, 12, seed=1)
    m = planes.m(cameras, (2, 3))
    rays = patch_rays(cameras.normalized_K(), (2, 3)).flatten(1, 2)
    points = planes.depth[..., None] * rays
    torch.testing.assert_close((m * points).sum(-1), torch.ones(1, 12, dtype=torch.float64))


def test_world_normal_and_kappa_describe_the_same_points():
    cameras = random_cameras(B=1, V=2, seed=2)
    planes = random_planes(1, 12, seed=2)
    n_w, kappa = planes.world_normal_and_kappa(cameras, (2, 3))
    rays = patch_rays(cameras.normalized_K(), (2, 3)).flatten(1, 2)
    X_c = planes.depth[..., None] * rays
    c2w = invert_se3(cameras.world_to_cam).repeat_interleave(6, dim=1)
    X_w = (c2w[..., :3, :3] @ X_c[..., None]).squeeze(-1) + c2w[..., :3, 3]
    torch.testing.assert_close(kappa * (n_w * X_w).sum(-1), torch.ones(1, 12, dtype=torch.float64))
    torch.testing.assert_close(n_w.norm(dim=-1), torch.ones(1, 12, dtype=torch.float64))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_plane_fit_recovers_exact_planes_from_depth(seed):
    """A depth map of one plane per patch is fitted exactly (Planes.from_depth)."""
    patch, grid = 4, (2, 3)
    H, W = patch * grid[0], patch * grid[1]
    cameras = random_cameras(B=1, V=2, image_size=(H, W), seed=seed)
    truth = random_planes(1, 12, seed=seed)
    m = truth.m(cameras, grid).reshape(1, 2, grid[0], grid[1], 3)
    m_pix = m.repeat_interleave(patch, 2).repeat_interleave(patch, 3)  # (1, V, H, W, 3)
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    pix = torch.stack([xs, ys, torch.ones_like(xs)], -1).double()
    rays = torch.einsum("bvij,hwj->bvhwi", invert_intrinsics(cameras.K), pix)
    depth = 1.0 / (m_pix * rays).sum(-1)
    assume(bool(((depth > 0) & (depth < 100)).all()))  # every pixel sees its plane in front, not grazing
    cos = (m_pix * rays).sum(-1).abs() / (m_pix.norm(dim=-1) * rays.norm(dim=-1))
    assume(bool((cos > 2 * MIN_GRAZING_COS).all()))  # no pixel near the grazing clamp of from_depth
    fitted = hrope.Planes.from_depth(depth, cameras, patch)
    torch.testing.assert_close(fitted.m(cameras, grid), truth.m(cameras, grid), rtol=1e-5, atol=1e-6)


def test_plane_fit_ignores_invalid_pixels():
    cameras = random_cameras(B=1, V=1, image_size=(4, 4), seed=3)
    truth = hrope.Planes.from_m(torch.tensor([[[0.1, -0.05, 0.4]]], dtype=torch.float64))
    ys, xs = torch.meshgrid(torch.arange(4) + 0.5, torch.arange(4) + 0.5, indexing="ij")
    rays = torch.einsum(
        "ij,hwj->hwi", invert_intrinsics(cameras.K)[0, 0], torch.stack([xs, ys, torch.ones_like(xs)], -1).double()
    )
    depth = (1.0 / (rays @ truth._m[0, 0]))[None, None].clone()
    depth[0, 0, 0, 0] = float("nan")
    depth[0, 0, 1, 2] = 0.0
    fitted = hrope.Planes.from_depth(depth, cameras, 4)
    torch.testing.assert_close(fitted.m(cameras, (1, 1)), truth._m, rtol=1e-5, atol=1e-7)


def test_camera_helpers():
    cameras = random_cameras(B=2, V=3, seed=4)
    c2w = cameras.cam_to_world()
    torch.testing.assert_close(cameras.world_to_cam @ c2w, torch.eye(4, dtype=torch.float64).expand(2, 3, 4, 4))
    torch.testing.assert_close(cameras.centers(), c2w[..., :3, 3])
    sub = cameras.select_views([2, 0])
    torch.testing.assert_close(sub.K, cameras.K[:, [2, 0]])
    G = random_se3(generator=torch.Generator().manual_seed(0))
    moved = cameras.transform_world(G)
    # the same camera centre, expressed in the new frame: G^-1 c
    c_new = (
        torch.linalg.inv(G) @ torch.cat([cameras.centers(), torch.ones(2, 3, 1, dtype=torch.float64)], -1)[..., None]
    ).squeeze(-1)[..., :3]
    torch.testing.assert_close(moved.centers(), c_new)
    assert cameras.to(dtype=torch.float32).K.dtype == torch.float32
    K_hat = cameras.normalized_K()
    torch.testing.assert_close(K_hat[..., 0, 0], cameras.K[..., 0, 0] / 48)
    torch.testing.assert_close(K_hat[..., 1, 2], cameras.K[..., 1, 2] / 32 - 0.5)
