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
costs less than 2b - 1 diagonal passes.

The tables do not depend on x: :func:`banded_operator` builds them once (an encoding caches
them per prepared transform and reuses them for every tensor and layer), and the transpose D^T
reuses the same tables: its diagonal -δ at channel c + δ is T_δ[c] (:meth:`BandedOperator.transpose`).

Inputs: ``blocks`` M ``(B, V, 1 or P, b, b)`` (per view or per token) and ``rope``, the RoPE
tables of one rotation R(θ) over the RoPE channels from :func:`rope_diagonals`: ``cos (P, 4F)``
and the sine diagonals ``plus``, ``minus`` ``(P, 3F)``. R(-θ) = R(θ)^T has the same cosines and
the two sine tables swapped (:func:`inverse_rope`).

Precision: the product is computed in the tables' dtype. x may have a lower precision (float16 or
bfloat16 x with float32 tables): it is converted up, and only the result is rounded to x's dtype,
as :mod:`hrope.encodings.fused_triton` does (docs/encodings.md, "Numerics in half precision").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

__all__ = [
    "rope_diagonals",
    "inverse_rope",
    "BandedOperator",
    "banded_operator",
    "banded_product",
    "block_gradient",
    "TransformProduct",
]

RopeTables = tuple[Tensor, Tensor, Tensor]
# D x as a function of (x, blocks, num_blocks, rope), differentiable (TransformProduct's input gradient)
Product = Callable[[Tensor, Tensor | None, int, RopeTables | None], Tensor]
# Below this many bytes per tensor the fixed cost of each op (launch, dispatch, autograd node)
# outweighs its memory traffic, and the faster paths are the ones with fewer ops (CPU, measured
# in docs/benchmarks/train_throughput.md, "Where the time goes").
SMALL_BYTES = 1 << 20


def is_small(x: Tensor) -> bool:
    """Whether ``x`` is below :data:`SMALL_BYTES` (per-op overhead dominates its cost)."""
    return x.numel() * x.element_size() < SMALL_BYTES


def rope_diagonals(angles: Tensor) -> RopeTables:
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


def inverse_rope(rope: RopeTables) -> RopeTables:
    """The tables of R(-θ) = R(θ)^T from those of R(θ): the +F table of R(-θ) holds +sin, i.e.
    R(θ)'s -F table, and vice versa (no new tensors)."""
    cos, plus, minus = rope
    return cos, minus, plus


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
    return {
        offset: tables[offset + b - 1, ..., max(0, -offset) : tiled - max(0, offset)].unsqueeze(1)
        for offset in range(1 - b, b)
    }


def _tile_matrix(blocks: Tensor, num_blocks: int) -> Tensor:
    """``blockdiag(M^T, ..., M^T)`` ``(B, 1, V, tiled, tiled)`` for per-view ``blocks`` M
    ``(B, V, 1, b, b)``: right-multiplying a token's tiled channels (a row vector) by it applies M
    to every tile."""
    eye = torch.eye(num_blocks, dtype=blocks.dtype, device=blocks.device)
    matrix = torch.einsum("nm,bvij->bvnjmi", eye, blocks[:, :, 0])
    tiled = num_blocks * blocks.shape[-1]
    return matrix.reshape(blocks.shape[0], 1, blocks.shape[1], tiled, tiled)


@dataclass(frozen=True)
class BandedOperator:
    """D for every token, ready to apply to x ``(B, heads, V, P, head_dim)``.

    ``tile_matrix`` ``(B, 1, V, tiled, tiled)`` right-multiplies channels [0, tiled) (per-view
    blocks) or is None; ``main`` is the main diagonal over channels [main_start, head_dim)
    (broadcastable to ``(B, 1, V, P, width)``) or None if the tile matrix covers every channel;
    ``diagonals`` are (offset δ, first output channel, table): y[c] += table[c - first] x[c + δ].
    """

    tile_matrix: Tensor | None
    main_start: int
    main: Tensor | None
    diagonals: tuple[tuple[int, int, Tensor], ...]

    @property
    def dtype(self) -> torch.dtype:
        """The tables' dtype, which the product is computed in."""
        table = self.tile_matrix if self.tile_matrix is not None else self.main
        return (table if table is not None else self.diagonals[0][2]).dtype

    def transpose(self) -> BandedOperator:
        """D^T from the same tables: the diagonal δ starting at channel s becomes the diagonal -δ
        starting at s + δ."""
        return BandedOperator(
            None if self.tile_matrix is None else self.tile_matrix.mT,
            self.main_start,
            self.main,
            tuple((-offset, start + offset, table) for offset, start, table in self.diagonals),
        )

    def apply(self, x: Tensor) -> Tensor:
        """``D x`` for x ``(B, heads, V, P, head_dim)`` without autograd, written into one new
        tensor (no temporaries of x's size when x has the tables' dtype; a lower-precision x is
        converted to it and the result rounded back to x's dtype)."""
        given = x.dtype
        x = x.to(self.dtype)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        # torch.compile traces no strided out= (a graph break); it writes through slices instead
        strided_out = not torch.compiler.is_compiling()
        if self.tile_matrix is not None:
            tiled = self.tile_matrix.shape[-1]
            # a strided out= is ~2x slower for small x, a temporary slower for large x
            if strided_out and not is_small(x):
                torch.matmul(x[..., :tiled], self.tile_matrix, out=out[..., :tiled])
            else:
                out[..., :tiled] = torch.matmul(x[..., :tiled], self.tile_matrix)
        if self.main is not None and strided_out:
            torch.mul(x[..., self.main_start :], self.main, out=out[..., self.main_start :])
        elif self.main is not None:
            out[..., self.main_start :] = x[..., self.main_start :] * self.main
        for offset, start, table in self.diagonals:
            stop = start + table.shape[-1]
            out[..., start:stop].addcmul_(x[..., start + offset : stop + offset], table)
        return out.to(given)


def banded_operator(blocks: Tensor | None, num_blocks: int, rope: RopeTables | None, head_dim: int) -> BandedOperator:
    """The tables of D = blockdiag(M tiled ``num_blocks`` times, identity, R) for ``blocks`` M
    ``(B, V, 1 or P, b, b)`` or None (no tiles) and ``rope`` the tables of R (or None), all in
    the dtype D will be applied in. Not differentiable (see :func:`banded_product`)."""
    if blocks is None and rope is None:
        raise ValueError("D without blocks and RoPE is the identity; there is nothing to apply")
    tile_matrix: Tensor | None = None
    main: list[Tensor] = []
    diagonals: list[tuple[int, int, Tensor]] = []
    tiled = 0
    if blocks is not None:
        tiled = num_blocks * blocks.shape[-1]
        if blocks.shape[2] == 1:  # per view: one product per view beats 2b - 1 diagonal passes
            tile_matrix = _tile_matrix(blocks, num_blocks)
        else:
            tables = _block_diagonals(blocks, num_blocks)
            main.append(tables.pop(0))
            diagonals.extend((offset, max(0, -offset), table) for offset, table in tables.items())
    main_start = tiled if tile_matrix is not None else 0
    rope_dim = rope[0].shape[-1] if rope is not None else 0
    geo_end = head_dim - rope_dim
    if geo_end > tiled:
        ones_like = blocks if blocks is not None else cast(RopeTables, rope)[0]  # one of them is given
        main.append(ones_like.new_ones(geo_end - tiled))
    if rope is not None:
        cos, plus, minus = rope
        F = rope_dim // 4
        main.append(cos)
        diagonals.extend([(F, geo_end, plus), (-F, geo_end + F, minus)])
    if len(main) > 1:
        B, V, P = _token_grid(blocks, rope)
        main = [torch.cat([part.expand(B, 1, V, P, -1) for part in main], dim=-1)]
    return BandedOperator(tile_matrix, main_start, main[0] if main else None, tuple(diagonals))


def _token_grid(blocks: Tensor | None, rope: RopeTables | None) -> tuple[int, int, int]:
    """(B, V, P) the main diagonal's parts broadcast to (P = 1 when nothing varies per token)."""
    B, V, P = blocks.shape[:3] if blocks is not None else (1, 1, 1)
    if rope is not None:
        P = rope[0].shape[0]
    return B, V, P


def block_gradient(grad: Tensor, x: Tensor, blocks: Tensor, num_blocks: int) -> Tensor:
    """The gradient of ``y = D x`` w.r.t. ``blocks`` ``(B, V, 1 or P, b, b)``: Σ_{heads, tiles}
    grad_y x^T per block, for ``grad`` and ``x`` ``(B, heads, V, P, head_dim)``, computed in the
    blocks' dtype."""
    grad, x = grad.to(blocks.dtype), x.to(blocks.dtype)
    B, _, V, P = grad.shape[:4]
    per_token, b = blocks.shape[2], blocks.shape[-1]

    def rows(t: Tensor) -> Tensor:  # (B V per_token, rows over heads, tiles (and tokens), b)
        return t[..., : num_blocks * b].permute(0, 2, 3, 1, 4).reshape(B * V * per_token, -1, b)

    product = torch.bmm(rows(grad).mT, rows(x)).reshape(B, V, per_token, b, b)  # one batched product
    return product.sum_to_size(blocks.shape).to(blocks.dtype)


class TransformProduct(torch.autograd.Function):
    """Autograd of ``y = D x`` whatever applies D: ``apply(x)`` computes the forward product (the
    banded passes, or the fused kernel), ``product(x, blocks, num_blocks, rope)`` is the
    differentiable product used for the input gradient D^T grad (so double backward works too);
    the block gradient is :func:`block_gradient`; RoPE tables are constants."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        blocks: Tensor | None,
        num_blocks: int,
        cos: Tensor | None,
        plus: Tensor | None,
        minus: Tensor | None,
        apply: Callable[[Tensor], Tensor],
        product: Product,
    ) -> Tensor:
        ctx.num_blocks, ctx.product = num_blocks, product
        ctx.rope = None if cos is None else (cos, plus, minus)
        blocks_need_grad = blocks is not None and ctx.needs_input_grad[1]
        ctx.save_for_backward(x if blocks_need_grad else None, blocks)
        return apply(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, blocks = ctx.saved_tensors
        grad_x = grad_blocks = None
        if ctx.needs_input_grad[0]:
            blocks_t = None if blocks is None else blocks.mT
            rope_t = None if ctx.rope is None else inverse_rope(ctx.rope)
            grad_x = ctx.product(grad, blocks_t, ctx.num_blocks, rope_t)
        if x is not None:
            grad_blocks = block_gradient(grad, x, blocks, ctx.num_blocks)
        return grad_x, grad_blocks, None, None, None, None, None, None


def banded_product(
    x: Tensor, blocks: Tensor | None, num_blocks: int, rope: RopeTables | None, operator: BandedOperator | None = None
) -> Tensor:
    """``y = D x`` per token for ``x (B, heads, V, P, head_dim)``.

    D = blockdiag(M tiled ``num_blocks`` times, identity, R), ``blocks`` M ``(B, V, 1 or P, b, b)``
    or None (no tiles), ``rope`` the tables of R (:func:`rope_diagonals`, or None), all in one
    dtype: x's, or a higher precision one (then computed in it and rounded to x's dtype once).
    ``operator``: the precomputed :func:`banded_operator` of exactly these arguments (built here
    when None). Differentiable in x and ``blocks``; returns x's dtype.
    """
    if operator is None:
        with torch.no_grad():  # tables only: gradients reach the blocks through TransformProduct
            operator = banded_operator(blocks, num_blocks, rope, x.shape[-1])
    if not torch.is_grad_enabled():  # no graph to record (e.g. inside a first-order backward)
        return operator.apply(x)
    product = _transposed_product  # the backward's D^T: per-token tables are rebuilt, not kept
    if blocks is None or blocks.shape[2] == 1:  # small tables (per view): the backward reuses them as D^T's
        product = functools.partial(_product_with, operator.transpose())
    cos, plus, minus = rope if rope is not None else (None, None, None)
    return cast(
        Tensor,
        TransformProduct.apply(
            x,
            blocks,
            num_blocks,
            cos,
            plus,
            minus,  # type: ignore[no-untyped-call]
            operator.apply,
            product,
        ),
    )


def _product_with(
    operator: BandedOperator, x: Tensor, blocks: Tensor | None, num_blocks: int, rope: RopeTables | None
) -> Tensor:
    """:func:`banded_product` with ``operator``, the prebuilt tables of exactly these blocks and RoPE."""
    return banded_product(x, blocks, num_blocks, rope, operator)


def _transposed_product(x: Tensor, blocks_t: Tensor | None, num_blocks: int, rope_t: RopeTables | None) -> Tensor:
    """:func:`banded_product` for D^T = (``blocks_t``, ``rope_t``) with D's tables, built from
    ``blocks_t.mT`` (D's blocks, contiguous: ~2x faster to build from) and transposed."""
    with torch.no_grad():
        operator = banded_operator(
            None if blocks_t is None else blocks_t.mT,
            num_blocks,
            None if rope_t is None else inverse_rope(rope_t),
            x.shape[-1],
        ).transpose()
    return banded_product(x, blocks_t, num_blocks, rope_t, operator)
