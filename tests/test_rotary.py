"""hrope.nn.rotary: the in-place complex rotation on interleaved channels is the library's 2D RoPE
(the banded transform of ``rope2d``) with its channels permuted, forward and gradient."""

from __future__ import annotations

import pytest
import torch

import hrope
from hrope.nn.rotary import interleaved_order, rope_phase, rotate_
from hrope.testing import random_cameras

B, V, GRID, HEADS, HEAD_DIM = 2, 3, (3, 4), 2, 32
L = V * GRID[0] * GRID[1]


def test_interleaved_order_puts_each_rope_pair_side_by_side():
    head_dim, rope_dim = 40, 16  # 24 channels before the RoPE, F = 4 frequencies per axis
    order = interleaved_order(head_dim, rope_dim, torch.device("cpu")).tolist()
    assert sorted(order) == list(range(head_dim)) and order[:24] == list(range(24))
    F = rope_dim // 4
    for axis in (0, 1):
        for f in range(F):
            slot = 24 + 2 * (axis * F + f)
            assert order[slot : slot + 2] == [24 + 2 * axis * F + f, 24 + 2 * axis * F + F + f]


@pytest.mark.parametrize("inverse", [False, True], ids=["D", "D_inv"])
def test_rotation_is_the_library_rope_permuted(inverse):
    """rotate_ on the interleaved channels equals TokenTransform's RoPE (apply_o: R(θ); apply_k:
    R(-θ)) on the library's channels, to float64 rounding."""
    prepared = hrope.get_encoding("rope2d").prepare(random_cameras(B, V, dtype=torch.float64), GRID, HEAD_DIM)
    x = torch.randn(B, HEADS, L, HEAD_DIM, dtype=torch.float64)
    want = prepared.apply_k(x) if inverse else prepared.apply_o(x)
    rope_dim = prepared.layout.rope_dim
    order = interleaved_order(HEAD_DIM, rope_dim, x.device)
    t = x[..., order].transpose(1, 2).contiguous()  # (B, L, heads, head_dim), interleaved
    phase = rope_phase(GRID, rope_dim, prepared.rope_base, x.device, torch.float64)
    got = rotate_(t, phase, V, (0, HEADS), HEAD_DIM, rope_dim, inverse=inverse)
    assert got is t  # in place
    torch.testing.assert_close(got.transpose(1, 2)[..., order.argsort()], want, atol=1e-13, rtol=0)  # measured 4.4e-16


def test_rotation_of_some_heads_and_its_gradient():
    """Heads outside the range are untouched; the gradient is the transposed rotation (gradcheck)."""
    rope_dim = 16
    phase = rope_phase(GRID, rope_dim, 100.0, torch.device("cpu"), torch.float64)
    x = torch.randn(B, L, 3 * HEAD_DIM, dtype=torch.float64, requires_grad=True)

    def rotated(x: torch.Tensor) -> torch.Tensor:
        return rotate_(x * 1.0, phase, V, (1, 3), HEAD_DIM, rope_dim, inverse=True)

    out = rotated(x)
    assert torch.equal(out[..., :HEAD_DIM], x[..., :HEAD_DIM])
    assert not torch.equal(out[..., -rope_dim:], x[..., -rope_dim:])
    assert torch.autograd.gradcheck(rotated, (x,))
