"""Per-view encodings: ``none`` (LVSM), ``rope2d``, ``prope``, ``gta`` and ``cape``.

Each view c has one 4x4 matrix tiled over the geometric channels:
PRoPE P_c = lift(K̂_c) E_c (Li et al. 2025), GTA E_c (Miyato et al. 2024; PRoPE's ``Ks=None``),
CaPE EscherNet's E_c^-T (or, ``form="transposed"``, E_c) over all channels of q and k only
(Kong et al. 2024).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..cameras import Cameras
from ..geometry import geometry_dtype, invert_intrinsics, invert_se3, lift
from ..planes import Planes
from .base import Encoding, EncodingError, TokenTransform
from .layout import ROPE_BASE, HeadLayout

__all__ = ["NoEncoding", "RoPE2D", "PRoPE", "GTA", "CaPE"]


def per_view(matrix: Tensor) -> Tensor:
    """``(B, V, b, b)`` -> the ``(B, V, 1, b, b)`` block layout of :class:`TokenTransform`."""
    return matrix[:, :, None]


class NoEncoding(Encoding):
    """``none``: plain SDPA (the LVSM baseline; geometry enters through absolute Plücker rays)."""

    name = "none"
    encodes_pose = False

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """No planes or params; D_t = I (plain SDPA)."""
        self.check_inputs(planes, params)
        return self.token_transform(HeadLayout(head_dim, block=0, rope=False), cameras, grid)


class RoPE2D(Encoding):
    """``rope2d``: 2D RoPE on integer patch indices, geometric part identity."""

    name = "rope2d"
    encodes_pose = False

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """No planes or params; D_t = 2D RoPE of the token's patch indices."""
        self.check_inputs(planes, params)
        return self.token_transform(HeadLayout(head_dim, block=0), cameras, grid)


class PRoPE(Encoding):
    """``prope``: D_c = blockdiag(P_c tiles, RoPE), P_c = lift(K̂_c) E_c, P^-1 = E^-1 lift(K̂^-1)."""

    name = "prope"
    per_view = "blocks"

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """No planes or params; D_t = blockdiag(P_c tiles, RoPE) from the cameras alone."""
        self.check_inputs(planes, params)
        dtype = geometry_dtype(cameras.K.dtype)
        K = cameras.normalized_K(dtype)
        E = cameras.world_to_cam.to(dtype)
        P = lift(K) @ E
        P_inv = invert_se3(E) @ lift(invert_intrinsics(K))
        layout = HeadLayout(head_dim, block=4)
        return self.token_transform(layout, cameras, grid, per_view(P), per_view(P_inv))


class GTA(Encoding):
    """``gta``: D_c = blockdiag(E_c tiles, RoPE) — PRoPE without intrinsics.

    ``learnable_translation_scale=True`` multiplies every translation by a learnable scalar
    (initialised to ``translation_scale_init`` = 0.01, as in the GTA code); off by default to match
    the official PRoPE module's ``Ks=None`` mode.
    """

    name = "gta"
    per_view = "blocks"

    def __init__(
        self,
        learnable_translation_scale: bool = False,
        translation_scale_init: float = 0.01,
        rope_base: float = ROPE_BASE,
    ) -> None:
        super().__init__(rope_base)
        self.translation_scale: nn.Parameter | None
        if learnable_translation_scale:
            self.translation_scale = nn.Parameter(torch.tensor(float(translation_scale_init)))
        else:
            self.translation_scale = None

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """No planes or params; D_t = blockdiag(E_c tiles, RoPE) from the cameras alone."""
        self.check_inputs(planes, params)
        dtype = geometry_dtype(cameras.K.dtype)
        E = cameras.world_to_cam.to(dtype)
        if self.translation_scale is not None:
            s = self.translation_scale.to(dtype).reshape(1)
            column_scale = torch.cat([s.expand(3), torch.ones_like(s)])[:, None]  # (s, s, s, 1)
            E = torch.cat([E[..., :3], E[..., 3:] * column_scale], dim=-1)  # [[R, s t], [0, 1]]
        layout = HeadLayout(head_dim, block=4)
        return self.token_transform(layout, cameras, grid, per_view(E), per_view(invert_se3(E)))


CAPE_FORMS = ("eschernet", "transposed")


class CaPE(Encoding):
    """``cape``: a 4x4 per-view block tiled over all channels of q and k; v and the output are not
    transformed (Kong et al. 2024).

    Args:
        form: ``"eschernet"`` (default; EscherNet's 6-DoF ``cape_embed``): each run of 4 channels is
            a row vector times the view's world-to-camera P, the query by P^-T and the key by P, so a
            logit is q_i^T P_i^-T P_j^T k_j = q_i^T (P_j P_i^-1)^T k_j. ``"transposed"``: D = E_c, the
            logit q_i^T E_i E_j^-1 k_j, the inverse transpose of EscherNet's relative matrix (a valid
            relative encoding, not CaPE; the form of results of RESULTS_VERSION 1).
    """

    name = "cape"
    per_view = "blocks"
    transform_values = False

    def __init__(self, form: str = "eschernet") -> None:
        super().__init__()
        if form not in CAPE_FORMS:
            raise EncodingError(f"form must be one of {CAPE_FORMS}, got {form!r}")
        self.form = form

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> TokenTransform:
        """No planes or params; q <- D_c^T q, k <- D_c^-1 k over all channels (v, o untouched) with
        D_c = E_c^-T (``"eschernet"``) or E_c (``"transposed"``)."""
        self.check_inputs(planes, params)
        E = cameras.world_to_cam.to(geometry_dtype(cameras.K.dtype))
        E_inv = invert_se3(E)
        D, D_inv = (E_inv.transpose(-1, -2), E.transpose(-1, -2)) if self.form == "eschernet" else (E, E_inv)
        layout = HeadLayout(head_dim, block=4, rope=False)
        return self.token_transform(layout, cameras, grid, per_view(D), per_view(D_inv))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, form={self.form!r}"
