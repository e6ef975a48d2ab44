"""Attention modules that fold a geometric encoding's per-view factor into their projection weights.

    >>> import torch, hrope.nn
    >>> from hrope.testing import random_cameras
    >>> cameras, grid = random_cameras(B=1, V=2, dtype=torch.float32), (4, 4)
    >>> x = torch.randn(1, 2 * 4 * 4, 256)                # (B, L, dim): 2 views of 4x4 patches
    >>> attn = hrope.nn.MultiviewAttention(dim=256, heads=4, encoding="prope")
    >>> y = attn(x, cameras, grid)                        # x (B, L, dim) -> (B, L, dim)
    >>> factors = attn.factorize(cameras, grid)           # once per forward, shared by every layer
    >>> torch.allclose(attn(x, factors=factors), y)
    True

Equal to ``Linear -> hrope.multiview_attention -> Linear`` to float rounding; the math of the
folding, and what of each encoding folds, is in docs/encodings.md ("Folding into projections").
"""

from .attention import MultiviewAttention, MultiviewCrossAttention
from .factors import Factors, TokenLayout, factorize

__all__ = ["MultiviewAttention", "MultiviewCrossAttention", "Factors", "TokenLayout", "factorize"]
