"""Attention modules that fold a geometric encoding's per-view factor into their projection weights.

>>> attn = hrope.nn.MultiviewAttention(dim=256, heads=4, encoding="prope")
>>> y = attn(x, cameras, grid)                       # x (B, L, dim) -> (B, L, dim)
>>> factors = attn.factorize(cameras, grid)          # once per forward, shared by every layer
>>> y = attn(x, factors=factors)

Equal to ``Linear -> hrope.multiview_attention -> Linear`` to float rounding; the math of the
folding, and what of each encoding folds, is in docs/encodings.md ("Folding into projections").
"""

from .attention import MultiviewAttention, MultiviewCrossAttention
from .factors import Factors, TokenLayout, factorize

__all__ = ["MultiviewAttention", "MultiviewCrossAttention", "Factors", "TokenLayout", "factorize"]
