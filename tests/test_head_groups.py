"""The released URoPE head-group layout on ``worldrope`` and the RoPE half of ``hrope-lift-uv``: fast
path vs the independent float64 reference (out and gradients, loop and fold), rigid invariance,
left-out heads, the identity with ``urope``'s head groups, and the option errors."""

from __future__ import annotations

import pytest
import torch

import hrope
import hrope.reference
from hrope.encodings import EncodingError, HRoPELiftUV, WorldRoPE
from hrope.testing import random_cameras, random_planes, random_qkv, random_se3

GRID, HEADS, LEFT_OUT = (3, 4), 6, 2
N = 3 * GRID[0] * GRID[1]
# max|fast - reference| / max|reference| over out and every gradient (params and planes included),
# float64: measured <= 3.2e-14 (worldrope; the depth gradients), <= 1.2e-14 (hrope-lift-uv), <= 2e-14
# under a world-frame change; bound 1e-12, 30x margin.
BOUND = 1e-12


def _scene(seed: int = 3) -> tuple[hrope.Cameras, dict[str, torch.Tensor], hrope.Planes]:
    cameras = random_cameras(B=1, V=3, image_size=(24, 32), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    params = {
        "depth": 1 + 4 * torch.rand(1, N, generator=gen, dtype=torch.float64),
        "depth_split": torch.rand(1, N, generator=gen, dtype=torch.float64),
        "depth_sigma": 0.3 * torch.rand(1, N, 2, generator=gen, dtype=torch.float64),
    }
    return cameras, params, random_planes(1, N, seed=seed)


def _run(attention, encoding, cameras, d: int, params=None, planes=None) -> list[torch.Tensor]:
    """out and the gradients of sum(out * weight) w.r.t. q, k, v and the per-token inputs."""
    q, k, v = (x.requires_grad_() for x in random_qkv(1, HEADS, N, d, seed=4))
    params = {name: p.clone().requires_grad_() for name, p in (params or {}).items()}
    if planes is not None:
        planes = hrope.Planes(planes.normal.clone().requires_grad_(), planes.depth.clone().requires_grad_())
    out = attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params=params, planes=planes)
    inputs = [q, k, v, *params.values(), *([] if planes is None else [planes.normal, planes.depth])]
    weight = random_qkv(1, HEADS, N, d, seed=5)[0]
    return [out.detach(), *torch.autograd.grad((out * weight).sum(), inputs)]


def _relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want))


def _case(name: str, d: int = 16, **options) -> tuple:
    cameras, params, planes = _scene()
    encoding = hrope.get_encoding(name, layout="head_groups", leaveout_heads=LEFT_OUT, **options)
    inputs = {"planes": planes} if name == "hrope-lift-uv" else {"params": params}
    return encoding, cameras, d, inputs


CASES = [
    ("worldrope", {"footprint": False}, 16),
    ("worldrope", {"footprint": True}, 32),
    ("hrope-lift-uv", {}, 16),
    ("hrope-lift-uv", {}, 48),
]


@pytest.mark.parametrize("name,options,d", CASES)
@pytest.mark.parametrize("execution", ["loop", "fold"])
def test_fast_path_matches_the_reference_with_gradients(name, options, d, execution):
    encoding, cameras, d, inputs = _case(name, d, execution=execution, **options)
    fast = _run(hrope.multiview_attention, encoding, cameras, d, **inputs)
    ref = _run(hrope.reference.multiview_attention, encoding, cameras, d, **inputs)
    assert _relative_error(fast, ref) < BOUND
    assert all(g.abs().max() > 1e-6 for g in fast[1:])  # every input gets a gradient
    interleaved = hrope.get_encoding(name, **options)
    assert _relative_error(fast[:1], _run(hrope.multiview_attention, interleaved, cameras, d, **inputs)[:1]) > 1e-3


@pytest.mark.parametrize("name,options,d", CASES[::2])
def test_a_world_frame_change_leaves_the_output_unchanged(name, options, d):
    encoding, cameras, d, inputs = _case(name, d, **options)
    motion = random_se3(1, generator=torch.Generator().manual_seed(6))
    moved = hrope.Cameras(cameras.K, cameras.world_to_cam @ torch.linalg.inv(motion)[:, None], cameras.image_size)
    before = _run(hrope.multiview_attention, encoding, cameras, d, **inputs)
    after = _run(hrope.multiview_attention, encoding, moved, d, **inputs)
    assert _relative_error(after, before) < BOUND


def test_left_out_heads_keep_only_what_is_not_rotated():
    """worldrope's left-out heads are plain attention; hrope-lift-uv's keep the relative half (they
    equal hrope-lift-uv with the RoPE half's rotation removed, i.e. differ from plain attention)."""
    encoding, cameras, d, inputs = _case("worldrope", footprint=False)
    out = _run(hrope.multiview_attention, encoding, cameras, d, **inputs)[0]
    q, k, v = random_qkv(1, HEADS, N, d, seed=4)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    rotated = HEADS - LEFT_OUT
    assert (out[:, rotated:] - plain[:, rotated:]).abs().max() < 1e-13
    assert (out[:, :rotated] - plain[:, :rotated]).abs().max() > 1e-3


def test_worldrope_at_urope_anchors_is_urope_head_groups():
    """One head group, every token at the anchor depth with no split or sigma and no footprint:
    worldrope's head groups are urope's (``projection="clamped"``: the query's own anchor lands on its
    patch centre, which is what urope takes, up to rounding)."""
    cameras, _, _ = _scene(seed=8)
    d, anchor = 16, 3.0
    params = {
        "depth": torch.full((1, N), anchor, dtype=torch.float64),
        "depth_split": torch.zeros(1, N, dtype=torch.float64),
        "depth_sigma": torch.zeros(1, N, 2, dtype=torch.float64),
    }
    world = hrope.get_encoding("worldrope", footprint=False, layout="head_groups", leaveout_heads=LEFT_OUT)
    urope = hrope.get_encoding(
        "urope", layout="head_groups", group_size=HEADS - LEFT_OUT, leaveout_heads=LEFT_OUT, min_depth=anchor
    )
    got = _run(hrope.multiview_attention, world, cameras, d, params=params)
    want = _run(hrope.multiview_attention, urope, cameras, d)
    assert _relative_error(got[:4], want) < BOUND  # measured 6.1e-15


def test_the_reference_builds_head_groups_without_the_fast_path(monkeypatch):
    def disabled(*args, **kwargs):
        raise AssertionError("the reference called the fast path")

    for cls in (WorldRoPE, HRoPELiftUV):
        monkeypatch.setattr(cls, "prepare", disabled)
    monkeypatch.setattr(hrope.encodings.head_groups, "head_group_transform", disabled)
    for name, options, d in CASES[1:3]:
        encoding, cameras, d, inputs = _case(name, d, **options)
        assert torch.isfinite(_run(hrope.reference.multiview_attention, encoding, cameras, d, **inputs)[0]).all()


@pytest.mark.parametrize("name", ["worldrope", "hrope-lift-uv"])
def test_head_group_options_are_checked(name):
    with pytest.raises(EncodingError, match="layout"):
        hrope.get_encoding(name, layout="groups")
    with pytest.raises(EncodingError, match="leaveout_heads"):
        hrope.get_encoding(name, layout="head_groups", leaveout_heads=-1)
    encoding, cameras, d, inputs = _case(name)
    encoding.leaveout_heads = HEADS
    with pytest.raises(EncodingError, match="heads"):
        _run(hrope.multiview_attention, encoding, cameras, d, **inputs)


def test_worldrope_head_groups_need_head_dim_divisible_by_4():
    encoding, cameras, _, inputs = _case("worldrope")
    with pytest.raises(EncodingError, match="divisible by 4"):
        encoding.prepare(cameras, GRID, 18, **inputs["params"])
