"""``urope``: key ray points at fixed depth anchors projected into the query image (Xie et al. 2026).

For key token j of view k and anchor depth d_a (z-depth in the key camera), the point
X = d_a r̂_j (r̂_j = K̂_k^-1 (u_j, v_j, 1), patch centre) is moved into query view c by
E_c E_k^-1 and projected with K̂_c to a query-image position p_a in patch units (the patch ix has
centre ix + 0.5; behind-camera rule in :mod:`.query_frame`). Standard 2D RoPE (base 100,
F = head_dim // 4 frequencies per axis, pair f rotates by w_f x, pair F + f by w_f y) then uses
anchor a = f mod A for frequency f, so every anchor sees low and high frequencies. The query
uses its own patch centre. Parameter-free.

When all views share one camera every anchor lands on the key's own patch centre, and the
encoding is exactly 2D RoPE on patch indices with that layout (docs/encodings_query_frame.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..cameras import Cameras
from ..geometry import patch_rays
from .base import EncodingError
from .layout import ROPE_BASE
from .query_frame import (
    QueryFrameEncoding,
    image_position_rope_freqs,
    project_to_patches,
    relative_poses,
    to_query_frames,
)

__all__ = ["URoPE", "DEFAULT_ANCHORS"]

# Four anchors spanning a depth range of 2 to 20 scene units, inclusive (the spacing reported for
# the paper); scenes normalised to a unit context baseline have most content in this range.
DEFAULT_ANCHORS = (2.0, 8.0, 14.0, 20.0)


class URoPE(QueryFrameEncoding):
    """``urope``: 2D RoPE on the query-image projections of key ray points at fixed anchors.

    Args:
        anchors: positive anchor z-depths (default :data:`DEFAULT_ANCHORS`); frequency f uses
            anchor f mod len(anchors).
        rope_base: base of the frequency ladder (100, on patch units).
        execution, recompute: see :class:`QueryFrameEncoding`.
    """

    name = "urope"

    def __init__(
        self,
        anchors: Sequence[float] = DEFAULT_ANCHORS,
        rope_base: float = ROPE_BASE,
        execution: str = "loop",
        recompute: bool = False,
    ) -> None:
        super().__init__(execution, recompute)
        anchors = tuple(float(a) for a in anchors)
        if not anchors or min(anchors) <= 0:
            raise EncodingError(f"anchors must be a non-empty sequence of positive depths, got {anchors}")
        self.anchors = anchors
        self.rope_base = rope_base

    def key_coefficients(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, dtype: torch.dtype, **params: Tensor
    ) -> tuple[Tensor, Tensor]:
        K = cameras.normalized_K(dtype)
        depths = torch.tensor(self.anchors, dtype=dtype, device=K.device)
        points = patch_rays(K, grid)[..., None, :] * depths[:, None]  # (B, Vk, P, A, 3)
        X = to_query_frames(points, relative_poses(cameras, dtype))  # (B, Vq, N, A, 3)
        pos, _ = project_to_patches(X, K[:, :, None, None], grid)  # (B, Vq, N, A, 2)
        freqs = image_position_rope_freqs(head_dim, self.rope_base, device=K.device, dtype=dtype)
        anchor = torch.arange(freqs.numel(), device=K.device) % len(self.anchors)
        angles = torch.cat([pos[..., anchor, 0] * freqs, pos[..., anchor, 1] * freqs], -1)
        return angles.cos(), angles.sin()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, anchors={self.anchors}"
