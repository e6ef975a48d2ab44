"""An encoding bound to one batch and split for folding into projections: :class:`Factors`.

A relative encoding's D_t (docs/encodings.md) follows a linear projection: q_i = D_i^T W_q x_i,
k_j = D_j^-1 W_k x_j, v_j = D_j^-1 W_v x_j, and the output W_o D_i o_i. Where D_t = G_c A_t with
G_c shared by every token of view c (the encoding's ``per_view`` fact), G_c joins the weights:

    D^T W_q = A^T (G^T W_q),   D^-1 W_k = A^-1 (G^-1 W_k),   W_o D = (W_o G) A

with G^T W_q etc. computed once per view (``B V heads head_dim^2 dim`` multiply-adds, nothing
per token), and only the per-token rest A_t (2D RoPE; for ``hrope-lift`` also a rank-one update
of each tile) applied to the tokens. Channels of a head: ``[G tiles | identity | RoPE]`` as in
:class:`~hrope.encodings.HeadLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..cameras import Cameras
from ..encodings import Encoding, EncodingError, HeadLayout, Prepared, TokenTransform, get_encoding
from ..planes import Planes
from ..tokens import CameraTokens, MixedTokens, camera_positions
from .rank_one import RankOneRest
from .rotary import COMPLEX, rope_phase

__all__ = ["Factors", "TokenLayout", "factorize"]

PER_VIEW_FACTS = ("blocks", "left")


@dataclass(frozen=True)
class TokenLayout:
    """Where the N = V * P camera tokens sit among L tokens: ``span`` ``(start, stop)`` when they
    are contiguous and in order, else ``index`` (the position of camera token i, view-major) and
    ``identity`` (the other positions); ``None`` for both when L = N in order."""

    length: int
    num_views: int
    span: tuple[int, int] | None
    index: Tensor | None
    identity: Tensor | None

    @property
    def all_camera(self) -> bool:
        return self.span == (0, self.length)


@dataclass(frozen=True)
class Factors:
    """An encoding bound to one batch (:func:`factorize`), reused by every layer of a forward pass.

    ``full``: the whole transform (:meth:`hrope.Encoding.prepare`, wrapped in
    :class:`~hrope.MixedTokens` when some tokens have no camera): the per-call path, used where
    nothing folds. ``view`` G_c and ``view_inv`` G_c^-1 ``(B, V, b, b)`` (geometry dtype), tiled
    ``num_blocks`` times per head, or None when nothing folds (``fold=False``, or no per-view
    factor); ``residual``: the per-token rest A_t (same token layout as ``full``). ``tokens``: the
    camera-token layout. ``rope_dim``: with ``fold=True``, when every token is a camera token and
    what is left per token is the 2D RoPE alone (the rest of a ``"blocks"`` encoding, or an
    encoding that is RoPE only, ``rope2d``), the RoPE's channels per head: the module then rotates
    them in place (:mod:`.rotary`, :meth:`phase_for`); else 0.
    """

    full: Prepared
    view: Tensor | None
    view_inv: Tensor | None
    num_blocks: int
    residual: Prepared | None
    tokens: TokenLayout
    rope_dim: int = 0

    @property
    def folds(self) -> bool:
        return self.view is not None

    def rotary(self, dtype: torch.dtype) -> bool:
        """Whether the RoPE left per token is rotated in place for tensors of ``dtype`` (float32
        and float64, which have complex twins)."""
        return self.rope_dim > 0 and dtype in COMPLEX

    def phase_for(self, dtype: torch.dtype) -> Tensor:
        """e^{iθ} ``(P, rope_dim // 2)`` of the rotated RoPE (:func:`~.rotary.rope_phase`) as the
        complex twin of ``dtype`` (``rotary(dtype)`` must hold)."""
        full = cast(TokenTransform, self.full)
        return rope_phase(tuple(full.grid), self.rope_dim, full.rope_base, full.device, dtype)

    @property
    def transform_values(self) -> bool:
        return self.full.transform_values


def token_layout(
    camera_tokens: CameraTokens | None, length: int, num_views: int, count: int, device: torch.device
) -> TokenLayout:
    """The :class:`TokenLayout` of ``count`` camera tokens among ``length`` (checked as
    :class:`~hrope.MixedTokens` does), index tensors on ``device``."""
    if camera_tokens is None:
        if length != count:
            raise EncodingError(f"{length} tokens, but the cameras and grid give {count}; pass camera_tokens")
        return TokenLayout(length, num_views, (0, length), None, None)
    positions = camera_positions(camera_tokens, length, count)
    start = positions[0]
    if positions == list(range(start, start + count)):
        return TokenLayout(length, num_views, (start, start + count), None, None)
    taken = set(positions)
    identity = [p for p in range(length) if p not in taken]
    index = torch.tensor(positions, dtype=torch.long, device=device)
    return TokenLayout(length, num_views, None, index, torch.tensor(identity, dtype=torch.long, device=device))


def _residual(
    encoding: Encoding, full: TokenTransform, cameras: Cameras, planes: Planes | None
) -> tuple[Tensor, Tensor, Prepared]:
    """G_c, G_c^-1 ``(B, V, b, b)`` and the per-token rest A_t of a prepared transform whose
    encoding has a per-view factor (``encoding.per_view``)."""
    blocks = full.geometric_blocks()
    if blocks is None:
        raise EncodingError(f"encoding {encoding.name!r} declares per_view={encoding.per_view!r} but has no blocks")
    layout = full.layout
    rope = TokenTransform(  # A_t's RoPE (or nothing) on the same channels
        HeadLayout(layout.head_dim, block=0, rope=layout.rope),
        full.num_views,
        full.grid,
        batch_size=full.batch_size,
        device=full.device,
        transform_values=full.transform_values,
        rope_base=full.rope_base,
        backend=full.backend,
        precision=full.precision,
    )
    if encoding.per_view == "blocks":  # A_t: the RoPE alone
        return blocks[0][:, :, 0], blocks[1][:, :, 0], rope
    assert planes is not None  # a rank-one rest is a plane's: prepare() checked needs_planes
    view, view_inv = encoding.view_factor(cameras)  # "left": A_t = I - ĉ_c u_t^T per tile, then RoPE
    centre, plane = encoding.rank_one_rest(cameras, full.grid, planes)
    return view, view_inv, RankOneRest(rope, centre, plane, layout.num_blocks)


def factorize(
    encoding: str | Encoding,
    cameras: Cameras,
    grid: tuple[int, int],
    head_dim: int,
    *,
    planes: Planes | None = None,
    params: dict[str, Tensor] | None = None,
    camera_tokens: CameraTokens | None = None,
    length: int | None = None,
    fold: bool = False,
) -> Factors:
    """Bind ``encoding`` to one batch and split off its per-view factor (module docstring).

    Args:
        encoding: a registry name or an :class:`~hrope.Encoding` instance (learnable options).
        cameras, grid, planes, params: as :func:`hrope.multiview_attention`.
        head_dim: channels per head.
        camera_tokens, length: where the V * grid_h * grid_w camera tokens sit among ``length``
            tokens (:class:`~hrope.MixedTokens`); None: all tokens are camera tokens.
        fold: False (the default) binds the encoding only (``full``): the modules then apply
            the whole transform per call, exactly ``hrope.multiview_attention``. True (opt-in,
            docs/encodings.md "When it pays, and the default") also splits off the per-view
            factor, which the modules fold into their weights, and marks a RoPE left alone for
            rotation in place (``rope_dim``).

    Encodings whose ``per_view`` fact is None (``none``, ``rope2d``, ``hrope``, the ablations) and
    query-frame encodings return Factors that fold nothing (``full`` only).
    """
    enc = get_encoding(encoding)
    grid = cast("tuple[int, int]", tuple(grid))
    full = enc.prepare(cameras, grid, head_dim, planes=planes, **(params or {}))
    count = full.num_tokens
    length = count if length is None else length
    tokens = token_layout(camera_tokens, length, cameras.num_views, count, cameras.device)
    view = view_inv = None
    residual: Prepared | None = None
    num_blocks = 0
    if fold and enc.per_view is not None and not enc.query_frame:
        if enc.per_view not in PER_VIEW_FACTS:
            raise EncodingError(f"encoding {enc.name!r}: per_view must be one of {PER_VIEW_FACTS} or None")
        transform = cast(TokenTransform, full)  # relative encodings prepare a TokenTransform
        view, view_inv, residual = _residual(enc, transform, cameras, planes)
        num_blocks = transform.layout.num_blocks
    rope_dim = _rotated_rope_dim(enc, full, view is not None) if fold and camera_tokens is None else 0
    if camera_tokens is not None:
        full = MixedTokens(full, camera_tokens, tokens.length)
        residual = None if residual is None else MixedTokens(residual, camera_tokens, tokens.length)
    return Factors(full, view, view_inv, num_blocks, residual, tokens, rope_dim)


def _rotated_rope_dim(encoding: Encoding, full: Prepared, split: bool) -> int:
    """The RoPE's channels per head when the RoPE is all that is left per token: the rest of a
    ``per_view == "blocks"`` encoding whose factor was split off (``split``), or a transform
    without geometric blocks; else 0."""
    if not isinstance(full, TokenTransform) or not full.layout.rope or encoding.query_frame:
        return 0
    if (split and encoding.per_view == "blocks") or full.geometric_blocks() is None:
        return full.layout.rope_dim
    return 0
