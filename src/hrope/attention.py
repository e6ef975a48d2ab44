"""`multiview_attention`: SDPA with any registered geometric encoding."""

from __future__ import annotations

import torch
from torch import Tensor

from .cameras import Cameras
from .encodings import Encoding, EncodingError, get_encoding

__all__ = ["multiview_attention", "check_qkv"]


def check_qkv(q: Tensor, k: Tensor, v: Tensor, cameras: Cameras, grid: tuple[int, int],
              enable_gqa: bool = False) -> None:
    """Shapes: q, k, v ``(B, heads, N, head_dim)`` alike, N = V * grid_h * grid_w, B = cameras' B;
    with ``enable_gqa`` k and v may have fewer heads, a divisor of q's (grouped-query attention)."""
    if not isinstance(cameras, Cameras):
        raise EncodingError(f"cameras must be hrope.Cameras, got {type(cameras).__name__}")
    if len(grid) != 2 or min(grid) <= 0:
        raise EncodingError(f"grid must be (grid_h, grid_w) with positive entries, got {grid}")
    same_but_heads = q.ndim == 4 and k.shape == v.shape and k.shape[:1] + k.shape[2:] == q.shape[:1] + q.shape[2:]
    heads_ok = k.shape[1] == q.shape[1] or (enable_gqa and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0)
    if not (same_but_heads and heads_ok):
        raise EncodingError(
            "q, k, v must share one shape (B, heads, N, head_dim) (with enable_gqa=True, k and v may have "
            f"a divisor of q's heads); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, _, N, _ = q.shape
    expected = cameras.num_views * grid[0] * grid[1]
    if N != expected:
        raise EncodingError(
            f"N = {N} tokens, but {cameras.num_views} views x grid {tuple(grid)} = {expected}"
        )
    if B != cameras.batch_size:
        raise EncodingError(f"q has batch {B} but cameras have batch {cameras.batch_size}")


def multiview_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    planes=None,
    params: dict | None = None,
    **sdpa_kwargs,
) -> Tensor:
    """Multi-view self-attention with a geometric positional encoding.

    Args:
        q, k, v: ``(B, heads, N, head_dim)``, N = V * grid_h * grid_w, tokens view-major then
            row-major inside a view (x fastest).
        encoding: a registry name (``hrope.ENCODINGS``) or an :class:`Encoding` instance (use an
            instance to keep learnable options such as GTA's translation scale).
        cameras: :class:`hrope.Cameras` with batch B and V views.
        grid: ``(grid_h, grid_w)`` patches per view.
        planes: :class:`hrope.Planes` for the plane-based encodings.
        params: extra per-token inputs of an encoding (e.g. ``{"depth": z}`` for ``hrope-depth``).
        **sdpa_kwargs: passed to ``scaled_dot_product_attention`` (``attn_mask``, ``dropout_p``,
            ``scale``, ...).

    Returns ``(B, heads, N, head_dim)``, like SDPA. Geometry is computed in float32 (float64 for
    float64 q) and cast to q's dtype.
    """
    check_qkv(q, k, v, cameras, grid, enable_gqa=sdpa_kwargs.get("enable_gqa", False))
    if q.dtype == torch.float64 and cameras.K.dtype != torch.float64:
        cameras = cameras.to(dtype=torch.float64)
    prepared = get_encoding(encoding).prepare(cameras, tuple(grid), q.shape[-1], planes=planes, **(params or {}))
    return prepared.attention(q, k, v, **sdpa_kwargs)
