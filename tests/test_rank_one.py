"""hrope.nn's rank-one rest of ``hrope-lift`` (A_t = I - ĉ_c u_t^T per tile, then RoPE) equals
the banded product of the per-token blocks G_c^-1 D_t, forward and gradients, with and without
RoPE; the module built on it matches the float64 reference (tests/test_nn.py)."""

from __future__ import annotations

import pytest
import torch

import hrope
from hrope.encodings import HeadLayout, TokenTransform, get_encoding
from hrope.nn.rank_one import RankOneRest
from hrope.testing import encoding_inputs, random_cameras

torch.set_num_threads(1)
B, V, GRID, HEADS, HEAD_DIM = 2, 3, (2, 3), 3, 40  # 40: 5 tiles, identity channels, RoPE
N = V * GRID[0] * GRID[1]
APPLY = ("apply_q", "apply_k", "apply_v", "apply_o")


def transforms(m: torch.Tensor, rope: bool) -> tuple[RankOneRest, TokenTransform]:
    """The rank-one rest and the banded transform of G^-1 D (blocks in float64) for planes ``m``."""
    encoding = get_encoding("hrope-lift")
    cameras = random_cameras(B, V, dtype=torch.float64)
    planes = hrope.Planes.from_m(m)
    D, D_inv = encoding.lifts(cameras, GRID, planes)
    G, G_inv = encoding.view_factor(cameras)
    layout = HeadLayout(HEAD_DIM, block=4, rope=rope)
    common = {"batch_size": B, "device": torch.device("cpu")}
    banded = TokenTransform(layout, V, GRID, G_inv[:, :, None] @ D, D_inv @ G[:, :, None], **common)
    rope_only = TokenTransform(HeadLayout(HEAD_DIM, block=0, rope=rope), V, GRID, **common)
    centre, plane = encoding.rank_one_rest(cameras, GRID, planes)
    return RankOneRest(rope_only, centre, plane, layout.num_blocks), banded


def planes_m() -> torch.Tensor:
    cameras = random_cameras(B, V, dtype=torch.float64)
    planes = encoding_inputs("hrope-lift", cameras, GRID, dtype=torch.float64)["planes"]
    return planes.m(cameras, GRID, torch.float64).detach()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "no_rope"])
def test_rank_one_rest_equals_the_banded_blocks(rope):
    rest, banded = transforms(planes_m(), rope)
    x = torch.randn(B, HEADS, N, HEAD_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for name in APPLY:
        want = getattr(banded, name)(x)
        assert relative_error(getattr(rest, name)(x), want) <= 1e-13  # measured <= 4.8e-16
        # float32 x (geometry cast to it): rounding, measured <= 1.4e-7 (the banded blocks' own: <= 5.5e-8); 20x margin
        assert relative_error(getattr(rest, name)(x.float()).double(), want) <= 3e-6
    if not rope:  # the input is not written when there is no RoPE pass to copy it
        before = x.clone()
        rest.apply_k(x)
        assert torch.equal(x, before)


def test_rank_one_rest_gradients_equal_the_banded_blocks():
    """float64 gradients to x and to the planes m (through ĉ, u and through G^-1 D)."""
    x = torch.randn(B, HEADS, N, HEAD_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = []
    for path in (0, 1):
        m = planes_m().requires_grad_()
        xs = x.clone().requires_grad_()
        prepared = transforms(m, rope=True)[path]
        loss = sum(getattr(prepared, name)(xs).square().sum() for name in APPLY)
        grads.append(torch.autograd.grad(loss, [xs, m]))
    for got, want in zip(*grads, strict=True):
        assert relative_error(got, want) <= 1e-13  # measured <= 2.6e-16


def test_the_folded_module_uses_the_rank_one_rest():
    cameras = random_cameras(B, V, dtype=torch.float64)
    geometry = encoding_inputs("hrope-lift", cameras, GRID, dtype=torch.float64)
    factors = hrope.nn.factorize("hrope-lift", cameras, GRID, HEAD_DIM, fold=True, **geometry)
    assert isinstance(factors.residual, RankOneRest)
