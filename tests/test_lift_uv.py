"""``hrope-lift-uv``: fast path vs dense float64 reference (forward, gradients to q, k, v and planes),
execution modes, camera-free tokens, and its invariants and reductions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from hrope.encodings import EncodingError
from hrope.encodings.layout import HeadLayout
from hrope.geometry import make_se3
from hrope.testing import random_cameras, random_planes, random_qkv, random_rotation

NAME = "hrope-lift-uv"


def attention(q, k, v, cameras, grid, planes, reference=False, **kwargs):
    fn = hrope.reference.multiview_attention if reference else hrope.multiview_attention
    return fn(q, k, v, encoding=kwargs.pop("encoding", NAME), cameras=cameras, grid=grid, planes=planes, **kwargs)


def scene(B=2, V=3, grid=(2, 3), heads=2, head_dim=48, seed=0, dtype=torch.float64):
    N = V * grid[0] * grid[1]
    cameras = random_cameras(B, V, seed=seed, dtype=dtype)
    planes = random_planes(B, N, seed=seed, dtype=dtype)
    return cameras, planes, random_qkv(B, heads, N, head_dim, seed=seed, dtype=dtype)


# ----------------------------------------------------------------------------------- fast == reference
@pytest.mark.parametrize("head_dim", [16, 20, 48])
def test_fast_matches_reference_float64(head_dim):
    cameras, planes, (q, k, v) = scene(head_dim=head_dim)
    fast = attention(q, k, v, cameras, (2, 3), planes)
    ref = attention(q, k, v, cameras, (2, 3), planes, reference=True)
    assert (fast - ref).abs().max() < 1e-12  # measured 3.2e-14


def test_fast_matches_reference_float32():
    cameras, planes, (q, k, v) = scene(seed=1)
    ref = attention(q, k, v, cameras, (2, 3), planes, reference=True)
    cams32 = hrope.Cameras(cameras.K.float(), cameras.world_to_cam.float(), cameras.image_size)
    planes32 = hrope.Planes(planes.normal.float(), planes.depth.float())
    fast = attention(q.float(), k.float(), v.float(), cams32, (2, 3), planes32)
    assert (fast.double() - ref).abs().max() < 3e-5  # measured 9.2e-6


def test_gradients_match_reference_including_planes():
    cameras, planes, (q, k, v) = scene(B=1, V=2, seed=2)
    grads = []
    for reference in (False, True):
        inputs = [x.clone().requires_grad_() for x in (q, k, v, planes.normal, planes.depth)]
        out = attention(*inputs[:3], cameras, (2, 3), hrope.Planes(*inputs[3:]), reference=reference)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        grads.append([x.grad for x in inputs])
    for fast, ref in zip(*grads):
        assert (fast - ref).abs().max() < 1e-11  # measured 8.9e-14 (3.4e-13 on other inputs)
    assert grads[0][4].abs().max() > 1e-3  # the planes get a gradient


@pytest.mark.parametrize("execution", ["loop", "fold"])
def test_gradcheck_float64(execution):
    cameras, planes, (q, k, v) = scene(B=1, V=2, grid=(1, 2), heads=1, head_dim=16, seed=3)
    inputs = [x.clone().requires_grad_() for x in (q, k, v, planes.normal, planes.depth)]
    encoding = hrope.get_encoding(NAME, execution=execution)

    def f(q, k, v, normal, depth):
        return attention(q, k, v, cameras, (1, 2), hrope.Planes(normal, depth), encoding=encoding)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


def test_loop_fold_and_recompute_agree():
    cameras, planes, (q, k, v) = scene(seed=4)
    loop = attention(q, k, v, cameras, (2, 3), planes)
    for options in ({"execution": "fold"}, {"recompute": True}):
        other = attention(q, k, v, cameras, (2, 3), planes, encoding=hrope.get_encoding(NAME, **options))
        assert (other - loop).abs().max() < 1e-12


def test_precompute_then_apply_per_query_view():
    """apply_q / apply_kv / apply_o of one query view (the relative part restricted to that view)
    give that view's rows of attention()."""
    cameras, planes, (q, k, v) = scene(seed=9)
    t = hrope.get_encoding(NAME).prepare(cameras, (2, 3), 48, planes=planes)
    full = t.attention(q, k, v)
    P = 6
    for c in range(3):
        k_c, v_c = t.apply_kv(k, v, c)
        o_c = torch.nn.functional.scaled_dot_product_attention(t.apply_q(q[:, :, c * P : (c + 1) * P], c), k_c, v_c)
        assert (t.apply_o(o_c, c) - full[:, :, c * P : (c + 1) * P]).abs().max() < 1e-12


def test_camera_free_tokens_match_reference():
    cameras, planes, (q, k, v) = scene(B=1, V=2, seed=5)
    N, L = q.shape[2], q.shape[2] + 3
    layout = [p for p in range(L) if p not in (0, 5, L - 1)]  # camera tokens around three others
    q, k, v = (
        torch.randn(1, 2, L, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    fast = attention(q, k, v, cameras, (2, 3), planes, camera_tokens=layout)
    ref = attention(q, k, v, cameras, (2, 3), planes, reference=True, camera_tokens=layout)
    assert len(layout) == N and (fast - ref).abs().max() < 1e-12  # measured 1e-14


# ----------------------------------------------------------------------------------- invariants
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-5, 5))
def test_invariant_to_a_global_rigid_transform(seed, shift):
    """Planes live in the token's camera frame, so moving every camera rigidly changes nothing."""
    cameras, planes, (q, k, v) = scene(B=1, V=2, heads=1, head_dim=16, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    G = make_se3(random_rotation(1, generator=gen), shift * torch.ones(1, 3, dtype=torch.float64))
    before = attention(q, k, v, cameras, (2, 3), planes)
    after = attention(q, k, v, cameras.transform_world(G), (2, 3), planes)
    assert (before - after).abs().max() < 1e-9


def test_planes_at_infinity_with_one_centre_is_prope_blocks_and_urope_rope():
    """m = 0 and cameras sharing a centre: the geometric half is prope's (K̂R lifted), and the RoPE
    half is urope's (with one centre every point on a ray projects to the same query pixel, so the
    far anchor and any urope anchor agree)."""
    B, V, grid, d = 2, 3, (2, 3), 48
    gen = torch.Generator().manual_seed(6)
    centre = torch.randn(B, 1, 3, 1, generator=gen, dtype=torch.float64)
    R = random_rotation(B, V, generator=gen)
    cameras = hrope.Cameras(random_cameras(B, V, seed=6).K, make_se3(R, -(R @ centre)[..., 0]), (32, 48))
    N = V * grid[0] * grid[1]
    planes = hrope.Planes.from_m(torch.zeros(B, N, 3, dtype=torch.float64))
    ours = hrope.get_encoding(NAME).prepare(cameras, grid, d, planes=planes)
    layout = HeadLayout(d, block=4)
    prope_blocks = hrope.get_encoding("prope").prepare(cameras, grid, d).geometric_blocks()
    assert prope_blocks is not None and ours.relative is not None
    for a, b in zip(ours.relative.geometric_blocks() or (), prope_blocks):
        assert (a - b).abs().max() < 1e-12
    urope = hrope.get_encoding("urope").prepare(cameras, grid, layout.rope_dim)
    for c in range(V):
        for a, b in zip(ours.coefficients(c), urope.coefficients(c)):
            assert (a - b).abs().max() < 1e-12


def test_rope_half_is_worldrope_at_the_plane_depth():
    """Planes in front within the depth range: the RoPE half is worldrope without footprint at z = 1/(m·r̂)."""
    cameras, planes, _ = scene(seed=8)
    grid, d = (2, 3), 48
    ours = hrope.get_encoding(NAME).prepare(cameras, grid, d, planes=planes)
    N = planes.depth.shape[1]
    zeros = torch.zeros(2, N, dtype=torch.float64)
    world = hrope.get_encoding("worldrope", footprint=False).prepare(
        cameras,
        grid,
        d // 2,
        depth=planes.depth,
        depth_split=zeros,
        depth_sigma=torch.zeros(2, N, 2, dtype=torch.float64),
    )
    for c in range(3):
        for a, b in zip(ours.coefficients(c), world.coefficients(c)):
            assert (a - b).abs().max() < 1e-12


def test_rope_positions_are_the_geometric_halfs_homography_of_the_key_pixel():
    """Both halves see the key's plane the same way: the key's RoPE position in query view c is its
    patch centre mapped by the top-left 3x3 of D_i D_j^-1 (the plane homography K̂_c (R + t mᵀ) K̂_k^-1)."""
    B, V, grid, d = 1, 3, (2, 3), 16
    cameras, planes, _ = scene(B=B, V=V, grid=grid, head_dim=d, seed=10)
    t = hrope.get_encoding(NAME).prepare(cameras, grid, d, planes=planes)
    assert t.relative is not None
    D, D_inv = (b[0].flatten(0, 1) for b in t.relative.geometric_blocks() or ())  # (N, 4, 4)
    P, size = 6, torch.tensor([3.0, 2.0], dtype=torch.float64)
    centres = torch.stack(torch.meshgrid(torch.arange(2.0), torch.arange(3.0), indexing="ij")[::-1], -1).reshape(P, 2)
    pixel = torch.cat([(centres + 0.5) / size - 0.5, torch.ones(P, 1)], -1).double().repeat(V, 1)  # (N, 3)
    checked = 0
    for c in range(V):
        H = (D[c * P] @ D_inv)[:, :3, :3]  # (N, 3, 3); the query's plane does not enter the top-left
        hom = (H @ pixel[..., None])[..., 0]
        pos = size * (hom[:, :2] / hom[:, 2:] + 0.5)
        ok = (hom[:, 2] > 0.05) & (pos > -2 * size).all(-1) & (pos < 3 * size).all(-1)
        re, im = (x[0, :, : d // 8] for x in t.coefficients(c))  # the x pairs, w_f = 100^(-f/F)
        freqs = 100.0 ** (-torch.arange(d // 8, dtype=torch.float64) / (d // 8))
        angle = pos[:, :1] * freqs
        assert (re - angle.cos())[ok].abs().max() < 1e-12 and (im - angle.sin())[ok].abs().max() < 1e-12
        checked += int(ok.sum())
    assert checked >= 24  # 30 of the 54 (key, query view) pairs land in front, inside the clamp


def test_clear_errors():
    cameras, planes, (q, k, v) = scene()
    with pytest.raises(EncodingError, match="needs planes"):
        attention(q, k, v, cameras, (2, 3), None)
    with pytest.raises(EncodingError, match="head_dim >= 8"):
        hrope.get_encoding(NAME).prepare(cameras, (2, 3), 6, planes=planes)


# ----------------------------------------------------------------------------------- NVS model
@pytest.mark.parametrize(
    "predictor, options",
    [("learned", {}), ("external", {"targets": "transfer"}), ("oracle", {}), ("oracle", {"targets": "transfer"})],
)
def test_nvs_model_with_every_plane_source(predictor, options):
    from _lvsm_helpers import SMALL_MODEL, synthetic_batch

    from hrope.nvs.model import LVSM, ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(**SMALL_MODEL, encoding=NAME, predictor=predictor, predictor_options=options, rays="world")
    model = LVSM(config)
    out = model(synthetic_batch(num_scenes=1, num_views=3))
    assert out.images.shape == (1, 1, 3, 32, 32) and torch.isfinite(out.images).all()
    out.images.mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
