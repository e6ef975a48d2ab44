"""The per-token rest of a ``per_view == "left"`` encoding applied as what it is: a rank-one
update of each tile, :class:`RankOneRest`.

D_t = G_c A_t with A_t = I - ĉ_c u_t^T on every b-channel tile (docs/encodings.md, "What of
``hrope-lift``'s E_c folds") and u_t^T ĉ_c = 0, so A_t^-1 = I + ĉ_c u_t^T. Per tile z of a token:

    q: A_t^T z = z - u_t (ĉ_c^T z),   k, v: A_t^-1 z = z + ĉ_c (u_t^T z),   o: A_t z = z - ĉ_c (u_t^T z)

one dot product and one multiply-add per tile, on the tensor in its ``(B, heads, N, head_dim)``
layout; the 2D RoPE of the last channels is the RoPE-only transform's pass (which also copies the
other channels), and the update is added onto its output's tiles in place.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings import Prepared, TokenTransform

__all__ = ["RankOneRest"]


class RankOneRest(Prepared):
    """A_t = I - ĉ_c u_t^T on the ``num_blocks`` tiles of each head, then ``rope`` (a
    :class:`~hrope.encodings.TokenTransform` with no blocks: RoPE on the last channels, identity
    elsewhere). ``centre`` ĉ ``(B, V, b)`` and ``plane`` u ``(B, V, P, b)`` in any float dtype
    (cast to the applied tensor's; gradients reach them). Applies to ``(B, heads, N, head_dim)``."""

    def __init__(self, rope: TokenTransform, centre: Tensor, plane: Tensor, num_blocks: int) -> None:
        self.rope = rope
        self.centre, self.plane, self.num_blocks = centre, plane, num_blocks
        self.batch_size, self.device = rope.batch_size, rope.device
        self.transform_values = rope.transform_values

    @property
    def head_dim(self) -> int:
        return self.rope.head_dim

    @property
    def num_tokens(self) -> int:
        return self.rope.num_tokens

    def apply_q(self, x: Tensor) -> Tensor:
        """A_t^T per tile, then R^T: x ``(B, heads, N, head_dim)`` -> same shape."""
        return self._update(x, self.rope.apply_q(x), dot="centre", sign=-1.0)

    def apply_k(self, x: Tensor) -> Tensor:
        """A_t^-1 per tile, then R^-1."""
        return self._update(x, self.rope.apply_k(x), dot="plane", sign=1.0)

    def apply_v(self, x: Tensor) -> Tensor:
        """A_t^-1 per tile, then R^-1 (values are transformed)."""
        return self.apply_k(x)

    def apply_o(self, x: Tensor) -> Tensor:
        """A_t per tile, then R."""
        return self._update(x, self.rope.apply_o(x), dot="plane", sign=-1.0)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        """``apply_o(sdpa(apply_q(q), apply_k(k), apply_v(v)))``."""
        out = F.scaled_dot_product_attention(self.apply_q(q), self.apply_k(k), self.apply_v(v), **sdpa_kwargs)
        return self.apply_o(out)

    def _update(self, x: Tensor, y: Tensor, dot: str, sign: float) -> Tensor:
        """``y`` (x's RoPE pass) with ``sign * b_t (a_t^T z)`` added to every tile z of x, where
        (a, b) = (ĉ, u) for ``dot == "centre"``, else (u, ĉ)."""
        if y is x:  # no RoPE: the pass returned x itself, which must not be written
            y = x.clone()
        B, H, N, _ = x.shape
        V, b = self.centre.shape[1], self.centre.shape[-1]
        centre = self.centre.to(x.dtype)[:, None, :, None, None, :]  # (B, 1, V, 1, 1, b)
        plane = self.plane.to(x.dtype)[:, None, :, :, None, :]  # (B, 1, V, P, 1, b)
        a, c = (centre, plane) if dot == "centre" else (plane, centre)
        shape = (B, H, V, N // V, self.num_blocks, b)
        return cast(Tensor, _TileUpdate.apply(x, y, a, c, sign, shape))  # type: ignore[no-untyped-call]


class _TileUpdate(torch.autograd.Function):
    """``y[tiles] += sign * (z @ a^T) c`` in place for the tiles z of x, viewed as ``shape`` ``(B,
    H, V, P, num_blocks, b)``, a and c broadcast to it; the backward is the transposed update
    (g -> sign * (g_tile @ c^T) a into x's tiles) and the reductions for a and c, without the
    broadcast products' expanded temporaries that autograd would keep."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, a: Tensor, c: Tensor, sign: float, shape: tuple[int, ...]) -> Tensor:
        tiled = shape[-2] * shape[-1]
        ctx.mark_dirty(y)
        y[..., :tiled].view(shape).addcmul_(x[..., :tiled].view(shape) @ a.mT, c, value=sign)
        ctx.save_for_backward(x, a, c)
        ctx.sign, ctx.shape = sign, shape
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, a, c = ctx.saved_tensors
        sign, shape = ctx.sign, ctx.shape
        tiled = shape[-2] * shape[-1]
        tiles = grad[..., :tiled].view(shape)
        scale = tiles @ c.mT  # (B, H, V, P, num_blocks, 1)
        grad_x = grad_a = grad_c = None
        if ctx.needs_input_grad[0]:
            update = (scale * a).mul_(sign).view(*grad.shape[:-1], tiled)
            grad_x = F.pad(update, (0, grad.shape[-1] - tiled))
        z = x[..., :tiled].view(shape)
        if ctx.needs_input_grad[2]:
            grad_a = (scale * z).sum_to_size(a.shape).mul_(sign)
        if ctx.needs_input_grad[3]:
            grad_c = ((z @ a.mT) * tiles).sum_to_size(c.shape).mul_(sign)
        return grad_x, grad, grad_a, grad_c, None, None
