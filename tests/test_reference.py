"""The dense reference (`hrope.reference.multiview_attention`) against the fast path on its edges:
the documented `hrope` plane clamps and SDPA's keyword options (is_causal, dropout_p, enable_gqa)."""

from __future__ import annotations

import pytest
import torch

import hrope
import hrope.reference
from helpers import random_cameras, random_planes, random_qkv
from hrope.encodings.homography import HRoPE

GRID = (2, 2)
P = GRID[0] * GRID[1]


def fast_and_reference(encoding, q, k, v, cameras, planes=None, **kw):
    fast = hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID, planes=planes, **kw)
    ref = hrope.reference.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID,
                                              planes=planes, **kw)
    return fast, ref


def planes_with_view1(cameras, m_view1):
    """Random ordinary planes for view 0; view 1's P tokens get ``m_view1(t) (B, P, 3)`` from its t."""
    m = random_planes(1, 2 * P, seed=7).m(cameras, GRID).clone()
    t = cameras.t[:, 1:2].expand(-1, P, -1)
    m[:, P:] = m_view1(t)
    return hrope.Planes.from_m(m)


def through_world_origin(offset):
    """Planes with s = 1 - m·t = ``offset`` (0: the plane contains the world origin)."""
    return lambda t: (1.0 - offset) * t / (t * t).sum(-1, keepdim=True)


def very_close(t):
    """|m| = 1e3 (a plane 1e-3 units away), orthogonal to t so that s = 1 - m·t = 1."""
    direction = torch.linalg.cross(t, torch.tensor([0.3, -0.5, 1.0], dtype=t.dtype).expand_as(t))
    return 1e3 * direction / direction.norm(dim=-1, keepdim=True)


CLAMPED = {
    "origin-exact": through_world_origin(0.0),
    "origin-near": through_world_origin(0.01),
    "origin-near-negative": through_world_origin(-0.02),
    "huge-m": very_close,
}
ENCODINGS = {
    "hrope": lambda: "hrope",
    "hrope-lift4": lambda: hrope.get_encoding("hrope", lift4=True),
    "hrope-custom-bounds": lambda: HRoPE(min_world_offset_ratio=0.2, max_inverse_distance=10.0),
}


@pytest.mark.parametrize("encoding", ENCODINGS.values(), ids=ENCODINGS.keys())
@pytest.mark.parametrize("m_view1", CLAMPED.values(), ids=CLAMPED.keys())
def test_reference_applies_the_documented_hrope_plane_clamps(encoding, m_view1):
    cameras = random_cameras(B=1, V=2, seed=11)
    planes = planes_with_view1(cameras, m_view1)
    q, k, v = random_qkv(1, 2, 2 * P, 36, seed=11)
    fast, ref = fast_and_reference(encoding(), q, k, v, cameras, planes)
    assert ref.dtype == torch.float64 and torch.isfinite(ref).all()
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_clamp_cases_really_are_clamped():
    """Each plane set above is out of the documented bounds, so the clamps change it."""
    cameras = random_cameras(B=1, V=2, seed=11)
    enc = HRoPE()
    t = cameras.t.repeat_interleave(P, dim=1)
    for m_view1 in CLAMPED.values():
        m = planes_with_view1(cameras, m_view1).m(cameras, GRID)
        assert (enc.clamp_planes(m, t)[:, P:] - m[:, P:]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------ SDPA options
@pytest.mark.parametrize("name", ["prope", "hrope", "urope"])
def test_is_causal_matches_fast_path_and_explicit_tril_mask(name):
    cameras = random_cameras(B=1, V=2, seed=3)
    planes = random_planes(1, 2 * P, seed=3) if name == "hrope" else None
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=3)
    fast, ref = fast_and_reference(name, q, k, v, cameras, planes, is_causal=True)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
    tril = torch.ones(2 * P, 2 * P, dtype=torch.bool).tril()
    explicit = hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID,
                                                   planes=planes, attn_mask=tril)
    torch.testing.assert_close(ref, explicit, rtol=0, atol=0)
    unmasked = hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID,
                                                   planes=planes)
    assert not torch.allclose(ref, unmasked)


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_dropout_must_be_zero(name):
    cameras = random_cameras(B=1, V=2, seed=4)
    q, k, v = random_qkv(1, 1, 2 * P, 24, seed=4)
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID}
    with pytest.raises(ValueError, match="dropout_p must be 0.0.*cannot reproduce random dropout"):
        hrope.reference.multiview_attention(q, k, v, dropout_p=0.1, **kwargs)
    torch.testing.assert_close(hrope.reference.multiview_attention(q, k, v, dropout_p=0.0, **kwargs),
                               hrope.reference.multiview_attention(q, k, v, **kwargs), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_is_causal_with_attn_mask_is_an_error(name):
    cameras = random_cameras(B=1, V=2, seed=5)
    q, k, v = random_qkv(1, 1, 2 * P, 24, seed=5)
    mask = torch.ones(2 * P, 2 * P, dtype=torch.bool)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        hrope.reference.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=GRID, attn_mask=mask,
                                            is_causal=True)


@pytest.mark.parametrize("name", ["prope", "urope"])
def test_enable_gqa_repeats_key_value_heads(name):
    cameras = random_cameras(B=1, V=2, seed=6)
    q, k, v = random_qkv(1, 4, 2 * P, 24, seed=6)
    k, v = k[:, :2], v[:, :2]
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID}
    grouped = hrope.reference.multiview_attention(q, k, v, enable_gqa=True, **kwargs)
    repeated = hrope.reference.multiview_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                   **kwargs)
    torch.testing.assert_close(grouped, repeated, rtol=0, atol=0)
    # the fast path with grouped heads (transforms act per token, the same on every head)
    fast = hrope.multiview_attention(q, k, v, enable_gqa=True, **kwargs)
    torch.testing.assert_close(fast, grouped, rtol=1e-9, atol=1e-9)
    with pytest.raises(hrope.EncodingError, match="share one shape"):
        hrope.multiview_attention(q, k, v, **kwargs)  # fewer k/v heads need enable_gqa=True
    with pytest.raises(hrope.EncodingError, match="share one shape"):
        hrope.multiview_attention(q[:, :3], k, v, enable_gqa=True, **kwargs)  # 3 is not a multiple of 2
    # equal head counts: a no-op
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=6)
    fast, ref = fast_and_reference(name, q, k, v, cameras, enable_gqa=True)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)


def test_reference_returns_float64_for_float32_inputs():
    cameras = random_cameras(B=1, V=2, seed=8, dtype=torch.float32)
    q, k, v = random_qkv(1, 2, 2 * P, 24, seed=8, dtype=torch.float32)
    planes = random_planes(1, 2 * P, seed=8, dtype=torch.float32)
    fast, ref = fast_and_reference("hrope", q, k, v, cameras, planes)
    assert fast.dtype == torch.float32 and ref.dtype == torch.float64
    assert (fast.double() - ref).abs().max() <= 2e-4 * ref.abs().max()


def test_fast_path_rejects_causal_with_mask_like_the_reference():
    cameras = random_cameras(B=1, V=2, image_size=(16, 16), seed=3)
    q, k, v = random_qkv(1, 2, 2 * 4, 16, seed=3)
    mask = torch.ones(8, 8, dtype=torch.bool)
    for encoding in ("prope", "urope"):
        with pytest.raises(hrope.EncodingError, match="not both"):
            hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=(2, 2), attn_mask=mask,
                                      is_causal=True)
