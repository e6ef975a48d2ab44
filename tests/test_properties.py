"""Property tests (hypothesis) of DESIGN.md's invariants not covered elsewhere: reduction to 2D
RoPE for one view, inverse identities of every geometric block, and gradients of the fast path
equal to those of the float64 reference (world-frame invariance and homography exactness are in
test_encodings.py and test_homography.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hrope
import hrope.reference
from helpers import RELATIVE, encoding_inputs, random_cameras, random_qkv

GEOMETRIC = [n for n in RELATIVE if n not in ("none", "rope2d")]
PROPERTY = settings(max_examples=15, deadline=None)


@PROPERTY
@given(
    seed=st.integers(0, 10_000),
    grid=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    head_dim=st.sampled_from([16, 32, 48, 64]),
    name=st.sampled_from(["prope", "gta", "hrope", "hrope-lift", "hrope-full"]),
)
def test_one_view_with_one_shared_block_is_rope2d(seed, grid, head_dim, name):
    """One view, all tokens sharing their geometric block (one plane, one transform):
    D_i D_j^-1 is 2D RoPE's relative rotation alone, so the output is rope2d's."""
    g = torch.Generator().manual_seed(seed)
    cameras = random_cameras(B=2, V=1, seed=seed)
    N = grid[0] * grid[1]
    q, k, v = random_qkv(2, 3, N, head_dim, seed=seed)
    normal = torch.randn(2, 1, 3, generator=g, dtype=torch.float64) * 0.4
    normal[..., 2] = -1.0
    distance = 1.0 + 3.0 * torch.rand(2, 1, 1, generator=g, dtype=torch.float64)
    planes = hrope.Planes.from_m((normal / distance).expand(2, N, 3))  # one camera-frame plane m = n / d
    G = torch.eye(4, dtype=torch.float64) + 0.3 * torch.randn(2, 1, 4, 4, generator=g, dtype=torch.float64)
    params = {"transform": G.expand(2, N, 4, 4)} if name == "hrope-full" else None
    out = hrope.multiview_attention(
        q,
        k,
        v,
        encoding=name,
        cameras=cameras,
        grid=grid,
        planes=planes if name != "hrope-full" else None,
        params=params,
    )
    rope = hrope.multiview_attention(q, k, v, encoding="rope2d", cameras=cameras, grid=grid)
    torch.testing.assert_close(out, rope, rtol=1e-9, atol=1e-9)


@PROPERTY
@given(seed=st.integers(0, 10_000), views=st.integers(1, 3), name=st.sampled_from(GEOMETRIC))
def test_geometric_blocks_and_their_inverses_multiply_to_identity(seed, views, name):
    """D D^-1 = D^-1 D = I for every token's block (closed-form SE(3)/intrinsics inverses,
    Sherman–Morrison for hrope-lift, the generic inverse for hrope-full), to float64 precision."""
    grid = (2, 3)
    cameras = random_cameras(B=2, V=views, seed=seed)
    inputs = encoding_inputs(name, cameras, grid, seed=seed)
    prepared = hrope.get_encoding(name).prepare(cameras, grid, 48, planes=inputs["planes"], **inputs["params"])
    D, D_inv = prepared.geometric_blocks()
    eye = torch.eye(D.shape[-1], dtype=D.dtype).expand_as(D)
    scale = torch.linalg.matrix_norm(D).amax() * torch.linalg.matrix_norm(D_inv).amax()
    torch.testing.assert_close(D @ D_inv, eye, rtol=0, atol=1e-13 * scale.item())
    torch.testing.assert_close(D_inv @ D, eye, rtol=0, atol=1e-13 * scale.item())


@PROPERTY
@given(seed=st.integers(0, 10_000), name=st.sampled_from(GEOMETRIC + ["rope2d"]), head_dim=st.sampled_from([16, 24]))
def test_gradients_equal_the_reference_gradients(seed, name, head_dim):
    """The fast path's custom backward (transposed banded products, block gradients) gives the
    same gradients w.r.t. q, k, v and the geometric inputs (plane vectors m, per-token depth or
    transforms) as autograd through the dense float64 reference."""
    grid = (1, 2)
    cameras = random_cameras(B=1, V=2, seed=seed)
    inputs = encoding_inputs(name, cameras, grid, seed=seed)
    qkv = [x.requires_grad_() for x in random_qkv(1, 2, 4, head_dim, seed=seed)]
    geometry = {}
    if inputs["planes"] is not None:
        geometry["m"] = inputs["planes"].m(cameras, grid).detach().requires_grad_()
    geometry.update(
        {
            p: value.clone().requires_grad_()
            for p, value in inputs["params"].items()
            if p in ("depth", "transform") and name != "hrope-se3"
        }
    )  # se3/so3 stay on their groups
    weight = torch.randn(1, 2, 4, head_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def gradients(attention):
        planes = hrope.Planes.from_m(geometry["m"]) if "m" in geometry else None
        params = dict(inputs["params"], **{p: t for p, t in geometry.items() if p != "m"})
        out = attention(*qkv, encoding=name, cameras=cameras, grid=grid, planes=planes, params=params)
        tensors = [*qkv, *geometry.values()]
        return torch.autograd.grad((out * weight).sum(), tensors)

    for fast, reference in zip(gradients(hrope.multiview_attention), gradients(hrope.reference.multiview_attention)):
        torch.testing.assert_close(fast, reference, rtol=1e-7, atol=1e-9)


def test_gradient_property_would_catch_a_wrong_backward(monkeypatch):
    """Guard for the test above: a backward that drops the transposition changes the gradients."""
    from hrope.encodings import banded

    def untransposed_backward(ctx, grad):
        x, blocks = ctx.saved_tensors
        grad_x = banded.banded_product(grad, blocks, ctx.num_blocks, ctx.rope)
        return grad_x, None, None, None, None, None, None, None

    cameras = random_cameras(B=1, V=2, seed=1)
    q = random_qkv(1, 2, 4, 16, seed=1)[0].requires_grad_()
    k, v = random_qkv(1, 2, 4, 16, seed=2)[1:]

    def grad_q(attention):
        return torch.autograd.grad(attention(q, k, v, encoding="prope", cameras=cameras, grid=(1, 2)).sum(), q)[0]

    expected = grad_q(hrope.reference.multiview_attention)
    monkeypatch.setattr(banded.TransformProduct, "backward", staticmethod(untransposed_backward))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(grad_q(hrope.multiview_attention), expected, rtol=1e-7, atol=1e-9)
