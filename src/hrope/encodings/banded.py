"""The fast path of every relative encoding: a block-diagonal channel transform as a banded product.

A token's transform D_t (DESIGN.md §3) is block diagonal: ``num_blocks`` tiles of one b x b
geometric block M_t over the first ``tiled_dim`` channels, identity channels, then 2D RoPE, whose
rotations pair channel c with c + F (layout ``[a_x | b_x | a_y | b_y]``, F frequencies per axis).
Every nonzero entry of such a matrix lies on a diagonal δ = j - i with |δ| < b (inside the tiles)
or δ = ±F (RoPE), so, channel by channel,

    y[c] = T_0[c] x[c] + Σ_{δ ≠ 0} T_δ[c] x[c + δ]

with per-token diagonal tables T_δ broadcast over heads. Each diagonal is one elementwise
multiply-add over a contiguous channel range: a few memory passes, no batched small matrix
products and no channel permutations (both slow on CPUs for narrow rows). Per-view blocks are
the exception: their tiles are applied as one block-diagonal matrix product per view, which
costs less than 2b - 1 diagonal passes. The transpose, used for the gradient, is the same
product with M^T and R(-θ).

Tables: ``blocks`` M ``(B, V, 1 or P, b, b)`` (per view or per token) and RoPE tables over the
RoPE channels, ``cos (P, 4F)`` and the two signed sine diagonals ``(P, 3F)`` of
:func:`rope_diagonals`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["rope_diagonals", "banded_product"]


def rope_diagonals(angles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """RoPE as diagonals for angles ``(P, 2 axes, F)``: ``cos (P, 4F)`` on δ = 0, and the sine
    tables of R(θ) on δ = +F ``(P, 3F)`` (channels [0, 3F) of the RoPE part) and δ = -F
    ``(P, 3F)`` (channels [F, 4F)).

    R(θ)(a, b) = (a cos - b sin, b cos + a sin): a-channels read b at +F with -sin, b-channels read
    a at -F with +sin; the positions that would cross from one axis to the other hold 0.
    """
    cos, sin = angles.cos(), angles.sin()
    zeros = torch.zeros_like(sin[:, 0])
    cos_table = torch.cat([cos[:, 0], cos[:, 0], cos[:, 1], cos[:, 1]], dim=-1)
    plus = torch.cat([-sin[:, 0], zeros, -sin[:, 1]], dim=-1)
    minus = torch.cat([sin[:, 0], zeros, sin[:, 1]], dim=-1)
    return cos_table, plus, minus


@functools.lru_cache(maxsize=32)
def _diagonal_selection(block: int, num_blocks: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """0/1 matrices ``(2b - 1, b * b, tiled)``: row-major flattened M times matrix r is diagonal
    δ = r - (b - 1) of blockdiag(M, ..., M), entry n b + i = M[i, i + δ] (0 outside the block)."""
    tiled = block * num_blocks
    selection = torch.zeros(2 * block - 1, block * block, tiled, dtype=dtype, device=device)
    for r, offset in enumerate(range(1 - block, block)):
        for i in range(max(0, -offset), min(block, block - offset)):
            selection[r, i * block + i + offset, i::block] = 1
    return selection


def _block_diagonals(blocks: Tensor, num_blocks: int) -> dict[int, Tensor]:
    """Diagonal tables of ``blockdiag(M, ..., M)`` for ``blocks`` M ``(B, V, P', b, b)``: offset δ
    -> ``(B, 1, V, P', width)``, the entries for output channels [max(0, -δ), tiled - max(0, δ)).

    One small matrix product (exact: each entry is one block entry times 1) builds all of them."""
    b = blocks.shape[-1]
    tiled = num_blocks * b
    selection = _diagonal_selection(b, num_blocks, blocks.dtype, blocks.device)
    tables = blocks.flatten(-2).unsqueeze(0) @ selection[:, None, None]  # (2b - 1, B, V, P', tiled)
    return {offset: tables[offset + b - 1, ..., max(0, -offset) : tiled - max(0, offset)].unsqueeze(1)
            for offset in range(1 - b, b)}


def _tile_matrix(blocks: Tensor, num_blocks: int) -> Tensor:
    """``blockdiag(M^T, ..., M^T)`` ``(B, 1, V, tiled, tiled)`` for per-view ``blocks`` M
    ``(B, V, 1, b, b)``: right-multiplying a token's tiled channels (a row vector) by it applies M
    to every tile."""
    eye = torch.eye(num_blocks, dtype=blocks.dtype, device=blocks.device)
    matrix = torch.einsum("nm,bvij->bvnjmi", eye, blocks[:, :, 0])
    tiled = num_blocks * blocks.shape[-1]
    return matrix.reshape(blocks.shape[0], 1, blocks.shape[1], tiled, tiled)


def _diagonals(x: Tensor, blocks: Tensor | None, num_blocks: int, rope: tuple[Tensor, Tensor, Tensor] | None,
               rope_sign: float) -> tuple[Tensor | None, Tensor | None, dict[tuple[int, int], Tensor]]:
    """What :func:`banded_product` applies to x ``(B, heads, V, P, head_dim)``.

    Returns the tile matrix of :func:`_tile_matrix` for per-view blocks (else None), the main
    diagonal, broadcastable to ``(B, 1, V, P, width)``, over the channels the tile matrix does not
    cover (None if it covers all), and the other diagonals keyed by (offset δ, first channel).
    """
    B, _, V, P, head_dim = x.shape
    tile_matrix, main, others = None, [], {}
    tiled = 0
    if blocks is not None:
        tiled = num_blocks * blocks.shape[-1]
        if blocks.shape[2] == 1:  # per view: one product per view beats 2b - 1 diagonal passes
            tile_matrix = _tile_matrix(blocks, num_blocks)
        else:
            diagonals = _block_diagonals(blocks, num_blocks)
            main.append(diagonals.pop(0))
            others.update({(offset, max(0, -offset)): table for offset, table in diagonals.items()})
    rope_dim = rope[0].shape[-1] if rope is not None else 0
    geo_end = head_dim - rope_dim
    if geo_end > tiled:
        main.append(x.new_ones(geo_end - tiled))
    if rope is not None:
        cos, plus, minus = rope
        F = rope_dim // 4
        main.append(cos)
        others[(F, geo_end)] = plus if rope_sign > 0 else -plus
        others[(-F, geo_end + F)] = minus if rope_sign > 0 else -minus
    if len(main) > 1:
        main = [torch.cat([part.expand(B, 1, V, P, -1) for part in main], dim=-1)]
    return tile_matrix, main[0] if main else None, others


def _product(x: Tensor, blocks: Tensor | None, num_blocks: int, rope: tuple[Tensor, Tensor, Tensor] | None,
             rope_sign: float) -> Tensor:
    """The banded product of ``x (B, heads, V, P, head_dim)`` without autograd, written into one
    new tensor (no temporaries of x's size)."""
    tile_matrix, main, others = _diagonals(x, blocks, num_blocks, rope, rope_sign)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    tiled = 0
    if tile_matrix is not None:
        tiled = tile_matrix.shape[-1]
        torch.matmul(x[..., :tiled], tile_matrix, out=out[..., :tiled])
    if main is not None:
        torch.mul(x[..., tiled:], main, out=out[..., tiled:])
    for (offset, start), table in others.items():
        stop = start + table.shape[-1]
        out[..., start:stop].addcmul_(x[..., start + offset : stop + offset], table)
    return out


class _BandedProduct(torch.autograd.Function):
    """Autograd for :func:`banded_product`: the input gradient is the transposed product, the
    block gradient Σ_{heads, tiles} grad_y x^T per block; RoPE tables are constants."""

    @staticmethod
    def forward(ctx, x, blocks, num_blocks, cos, plus, minus, rope_sign):
        rope = None if cos is None else (cos, plus, minus)
        ctx.num_blocks, ctx.rope_sign = num_blocks, rope_sign
        ctx.rope = rope
        blocks_need_grad = blocks is not None and ctx.needs_input_grad[1]
        ctx.save_for_backward(x if blocks_need_grad else None, blocks)
        return _product(x, blocks, num_blocks, rope, rope_sign)

    @staticmethod
    def backward(ctx, grad):
        x, blocks = ctx.saved_tensors
        grad_x = grad_blocks = None
        if ctx.needs_input_grad[0]:
            blocks_t = None if blocks is None else blocks.transpose(-1, -2)
            grad_x = banded_product(grad, blocks_t, ctx.num_blocks, ctx.rope, -ctx.rope_sign)
        if x is not None:
            b = blocks.shape[-1]
            tiles = ctx.num_blocks * b
            g = grad[..., :tiles].unflatten(-1, (ctx.num_blocks, b))
            xt = x[..., :tiles].unflatten(-1, (ctx.num_blocks, b))
            grad_blocks = torch.einsum("bhvpni,bhvpnj->bvpij", g, xt).sum_to_size(blocks.shape)
        return grad_x, grad_blocks, None, None, None, None, None


def banded_product(x: Tensor, blocks: Tensor | None, num_blocks: int,
                   rope: tuple[Tensor, Tensor, Tensor] | None, rope_sign: float) -> Tensor:
    """``y = D x`` per token for ``x (B, heads, V, P, head_dim)``.

    D = blockdiag(M tiled ``num_blocks`` times, identity, R(rope_sign · θ)), ``blocks`` M
    ``(B, V, 1 or P, b, b)`` or None (no tiles), ``rope`` the tables of :func:`rope_diagonals`
    (or None), all in x's dtype. Differentiable in x and ``blocks``.
    """
    cos, plus, minus = rope if rope is not None else (None, None, None)
    return _BandedProduct.apply(x, blocks, num_blocks, cos, plus, minus, rope_sign)
