"""The banded product (the fast path of every relative encoding) against dense per-token matrices."""

from __future__ import annotations

import functools

import pytest
import torch

import hrope
from helpers import encoding_inputs, random_cameras, random_qkv
from hrope.encodings.banded import banded_operator, banded_product, inverse_rope, rope_diagonals
from hrope.encodings.layout import HeadLayout, patch_index_rope_angles

GRID = (2, 3)


def dense_transform(layout: HeadLayout, blocks, angles, rope_sign: float) -> torch.Tensor:
    """D ``(B, V, P, head_dim, head_dim)`` written out entry by entry: M tiled, identity, then
    R(sign θ) rotating channel pairs (f, f + F) of each axis block ``[a_x | b_x | a_y | b_y]``."""
    B, V, P = blocks.shape[0], blocks.shape[1], angles.shape[0]
    d, b, F = layout.head_dim, layout.block, layout.num_freqs
    D = torch.zeros(B, V, P, d, d, dtype=torch.float64)
    for n in range(layout.num_blocks):
        D[..., n * b : (n + 1) * b, n * b : (n + 1) * b] = blocks.expand(B, V, P, b, b)
    for c in range(layout.tiled_dim, layout.geo_dim):
        D[..., c, c] = 1.0
    for axis in range(2 if layout.rope else 0):
        for f in range(F):
            a = layout.geo_dim + 2 * F * axis + f
            theta = rope_sign * angles[:, axis, f]
            D[..., a, a], D[..., a, a + F] = theta.cos(), -theta.sin()
            D[..., a + F, a], D[..., a + F, a + F] = theta.sin(), theta.cos()
    return D


def case(head_dim: int, block: int, rope: bool, per_token: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    layout = HeadLayout(head_dim, block=block, rope=rope)
    B, heads, V, P = 2, 3, 2, GRID[0] * GRID[1]
    blocks = torch.randn(B, V, P if per_token else 1, block, block, generator=g, dtype=torch.float64)
    angles = patch_index_rope_angles(GRID, layout.num_freqs)
    x = torch.randn(B, heads, V, P, head_dim, generator=g, dtype=torch.float64)
    tables = rope_diagonals(angles) if rope else None
    return layout, blocks, angles, x, tables


@pytest.mark.parametrize("head_dim", [32, 48, 64, 96])
@pytest.mark.parametrize("block", [3, 4])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("rope_sign", [1.0, -1.0])
def test_matches_dense_matrices(head_dim, block, per_token, rope, rope_sign):
    """D x, with R(-θ) from the swapped tables of R(θ), and D^T x from the same tables."""
    layout, blocks, angles, x, tables = case(head_dim, block, rope, per_token)
    if rope and rope_sign < 0:
        tables = inverse_rope(tables)
    D = dense_transform(layout, blocks, angles, rope_sign)
    y = banded_product(x, blocks, layout.num_blocks, tables)
    torch.testing.assert_close(y, torch.einsum("bvpij,bhvpj->bhvpi", D, x), rtol=1e-12, atol=1e-12)
    transposed = banded_operator(blocks, layout.num_blocks, tables, head_dim).transpose().apply(x)
    torch.testing.assert_close(transposed, torch.einsum("bvpji,bhvpj->bhvpi", D, x), rtol=1e-12, atol=1e-12)


def test_precomputed_operator_is_used_and_keeps_block_gradients():
    """An operator passed in is what gets applied (a different one changes y), and gradients
    still reach the blocks."""
    layout, blocks, angles, x, tables = case(32, 4, True, per_token=True)
    blocks.requires_grad_()
    operator = banded_operator(blocks.detach(), layout.num_blocks, tables, 32)
    y = banded_product(x, blocks, layout.num_blocks, tables, operator)
    torch.testing.assert_close(y, banded_product(x, blocks, layout.num_blocks, tables))
    other = banded_operator(2 * blocks.detach(), layout.num_blocks, tables, 32)
    assert not torch.allclose(banded_product(x, blocks, layout.num_blocks, tables, other), y)
    (grad,) = torch.autograd.grad(y.sum(), blocks)
    (expected,) = torch.autograd.grad(banded_product(x, blocks, layout.num_blocks, tables).sum(), blocks)
    torch.testing.assert_close(grad, expected)
    assert grad.abs().sum() > 0


def test_identity_operator_is_rejected():
    with pytest.raises(ValueError, match="identity"):
        banded_operator(None, 0, None, 16)


def test_rope_only_and_float32():
    layout, blocks, angles, x, tables = case(64, 4, True, per_token=False)
    layout = HeadLayout(64, block=0)
    y = banded_product(x.float(), None, 0, tuple(t.float() for t in tables))
    D = dense_transform(layout, blocks[..., :0, :0], angles, 1.0)
    # measured worst 2.4e-7 (one float32 ulp of the largest |y|, 3.6)
    torch.testing.assert_close(y, torch.einsum("bvpij,bhvpj->bhvpi", D, x).float(), rtol=1e-6, atol=1e-6)
    assert y.dtype == torch.float32


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("block", [3, 4])
def test_gradients_in_input_and_blocks(per_token, block):
    """First and second derivatives w.r.t. x and the blocks match finite differences."""
    layout, blocks, angles, x, tables = case(16, block, True, per_token)
    x = x[:1, :2].clone().requires_grad_()
    blocks = blocks[:1].clone().requires_grad_()

    def f(x, blocks):
        return banded_product(x, blocks, layout.num_blocks, inverse_rope(tables))

    assert torch.autograd.gradcheck(f, (x, blocks))
    assert torch.autograd.gradgradcheck(f, (x, blocks))


def test_gradient_is_the_transposed_product():
    """The input gradient of D x is D^T g: the same product with M^T and R(-θ)."""
    layout, blocks, angles, x, tables = case(48, 3, True, per_token=True)
    x.requires_grad_()
    grad = torch.randn_like(x)
    banded_product(x, blocks, layout.num_blocks, tables).backward(grad)
    D = dense_transform(layout, blocks, angles, 1.0)
    torch.testing.assert_close(x.grad, torch.einsum("bvpji,bhvpj->bhvpi", D, grad), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["rope2d", "prope", "cape", "hrope", "hrope-lift"])
def test_projection_layout_inputs(name):
    """q, k, v as transposed views of a (B, N, heads, head_dim) projection (not contiguous) give
    the same outputs and input gradients as contiguous copies."""
    grid = (2, 3)
    cameras = random_cameras(B=2, V=2, seed=5)
    inputs = encoding_inputs(name, cameras, grid, seed=5)
    g = torch.Generator().manual_seed(5)
    projected = torch.randn(3, 2, 12, 4, 32, generator=g, dtype=torch.float64)  # (qkv, B, N, heads, d)
    views = [t.transpose(1, 2).requires_grad_() for t in projected.clone()]
    copies = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in projected]
    assert not views[0].is_contiguous()
    outs = [
        hrope.multiview_attention(*qkv, encoding=name, cameras=cameras, grid=grid, **inputs) for qkv in (views, copies)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for out in outs:
        out.square().sum().backward()
    for a, b in zip(views, copies):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_prepared_transform_builds_each_operator_once(monkeypatch):
    """q, k, v, o and a second layer share two operator builds (D and D^-1), per dtype."""
    from hrope.encodings import base

    builds = []
    monkeypatch.setattr(base, "banded_operator", lambda *args: builds.append(args) or banded_operator(*args))
    cameras = random_cameras(B=1, V=2, seed=3)
    inputs = encoding_inputs("hrope-lift", cameras, GRID, seed=3)
    prepared = hrope.get_encoding("hrope-lift").prepare(cameras, GRID, 32, planes=inputs["planes"])
    q, k, v = random_qkv(1, 2, 12, 32, seed=3)
    for _layer in range(2):
        prepared.attention(q, k, v)
    assert len(builds) == 2
    prepared.attention(q.float(), k.float(), v.float())
    assert len(builds) == 4


def test_reused_transform_passes_gradients_to_the_planes():
    """One prepared transform used by two layers gives the plane the same gradient as one
    transform per layer, also after a no-grad call cached its tables."""
    cameras = random_cameras(B=1, V=2, seed=4)
    inputs = encoding_inputs("hrope", cameras, GRID, seed=4)
    m = inputs["planes"].m(cameras, GRID).detach().requires_grad_()
    q, k, v = random_qkv(1, 2, 12, 32, seed=4)
    encoding = hrope.get_encoding("hrope")

    def two_layers(shared: bool):
        prepare = functools.partial(encoding.prepare, cameras, GRID, 32, planes=hrope.Planes.from_m(m))
        first = prepare()
        with torch.no_grad():
            first.attention(q.float(), k.float(), v.float())
        second = first if shared else prepare()
        out = second.attention(first.attention(q, k, v).float(), k.float(), v.float())
        return torch.autograd.grad(out.square().sum(), m)[0]

    shared, separate = two_layers(True), two_layers(False)
    assert shared.abs().sum() > 0
    torch.testing.assert_close(shared, separate, rtol=1e-5, atol=1e-7)
