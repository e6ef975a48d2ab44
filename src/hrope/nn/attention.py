"""Drop-in attention modules with a geometric encoding folded into their projections.

:class:`MultiviewAttention` (self-attention) and :class:`MultiviewCrossAttention` compute
``Linear -> hrope.multiview_attention / hrope.cross_attention -> Linear`` exactly (to float
rounding). By default (``fold=False``) that is literally what they run: the projection, the
prepared transform around SDPA, the output projection. With ``fold=True`` (opt-in: no measurement
has shown it faster yet, docs/encodings.md "When it pays, and the default") the encoding's
per-view factor G_c (its ``per_view`` fact) is multiplied into per-view copies of the projection
weights once per forward (:mod:`.folding`) and only the per-token rest is applied to the tokens
(:mod:`.factors`). Whether a call folds is decided once, by :func:`~.factors.factorize`'s
``fold``: the :class:`~.factors.Factors` it returns carry it to every layer. Tokens are
``(B, L, dim)`` (batch first); the output is ``(B, L, dim)``, like
``nn.MultiheadAttention(batch_first=True)``'s first output (no attention weights: SDPA).

With ``fold=True``, where all that is left per token is the 2D RoPE (``prope`` and ``gta``
folded, or ``rope2d``) and every token has a camera, self-attention permutes its projection rows
so that RoPE pairs are adjacent and rotates them in place (:mod:`.rotary`, float32 and float64).
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import cross_attention
from ..cameras import Cameras
from ..encodings import Encoding, EncodingError, TokenTransform, get_encoding
from ..planes import Planes
from ..tokens import CameraTokens, MixedTokens
from .factors import Factors, factorize
from .folding import fold_rows, project
from .rotary import interleaved_order, rotate_

__all__ = ["MultiviewAttention", "MultiviewCrossAttention"]

_Relative = TokenTransform | MixedTokens  # a relative encoding's transform (has apply_k / apply_v)


class _Folded(nn.Module):
    """What both modules share: the encoding, the head split, the optional QK-norm and the output projection."""

    def __init__(self, dim: int, heads: int, encoding: str | Encoding | None, head_dim: int | None, fold: bool) -> None:
        super().__init__()
        self.fold = fold
        self.heads = heads
        self.head_dim = head_dim if head_dim is not None else dim // heads
        if head_dim is None and dim % heads:
            raise EncodingError(f"dim {dim} does not split into {heads} heads; pass head_dim")
        self.inner = heads * self.head_dim
        self.encoding = None if encoding is None else get_encoding(encoding)  # a submodule: its options train

    def add_output(self, dim: int, out_bias: bool, qk_norm: bool, qk_norm_eps: float | None) -> None:
        """The output projection and the QK-norms, registered after the input projections (the
        registration order of a plain attention module, so seeded inits draw the same weights)."""
        self.out = nn.Linear(self.inner, dim, bias=out_bias)
        self.qk_norm = qk_norm
        self.q_norm = nn.RMSNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()

    def factorize(
        self,
        cameras: Cameras,
        grid: tuple[int, int],
        *,
        planes: Planes | None = None,
        params: dict[str, Tensor] | None = None,
        camera_tokens: CameraTokens | None = None,
        length: int | None = None,
    ) -> Factors:
        """:func:`hrope.nn.factorize` with this module's encoding, head_dim and ``fold``: compute
        once per forward pass and pass it to every layer as ``factors=``."""
        if self.encoding is None:
            raise EncodingError("this module was built with encoding=None: pass factors= (hrope.nn.factorize)")
        return factorize(
            self.encoding,
            cameras,
            grid,
            self.head_dim,
            planes=planes,
            params=params,
            camera_tokens=camera_tokens,
            length=length,
            fold=self.fold,
        )

    def split_heads(self, y: Tensor, parts: int) -> tuple[Tensor, ...]:
        """``(B, L, parts * inner)`` -> ``parts`` tensors ``(B, heads, L, head_dim)``."""
        B, L, _ = y.shape
        return y.reshape(B, L, parts, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def fold_linear(
        self, linear: nn.Linear, matrices: list[Tensor | None], factors: Factors
    ) -> tuple[Tensor, Tensor | None]:
        """``linear``'s per-view weights, transposed ``(B, V, in, out)``, and bias ``(B, V, out)``."""
        return self.fold_weight(linear.weight, linear.bias, matrices, factors)

    def fold_weight(
        self, weight: Tensor, bias: Tensor | None, matrices: list[Tensor | None], factors: Factors
    ) -> tuple[Tensor, Tensor | None]:
        """Per-view ``weight (out, in)`` transposed ``(B, V, in, out)`` and ``bias`` ``(B, V, out)``
        (:func:`~.folding.fold_rows`)."""
        folded, folded_bias = fold_rows(weight, bias, matrices, self.heads, factors.num_blocks)
        return folded.mT, folded_bias

    def output(self, out: Tensor, factors: Factors | None, fold: bool) -> Tensor:
        """``D_i o_i`` then the output projection, D's per-view factor folded into W_o (W_o G_c)
        where ``fold``: ``out (B, heads, L, head_dim)`` -> ``(B, L, dim)``. ``factors`` None: out
        is final."""
        B, _, L, _ = out.shape
        folded = None
        if factors is not None and fold and factors.transform_values:
            view, residual = _folding(factors)
            out = residual.apply_o(out)
            weight_t, _ = fold_rows(self.out.weight.mT, None, [view.mT], self.heads, factors.num_blocks)
            bias = self.out.bias
            folded = (weight_t, None if bias is None else bias.expand(*weight_t.shape[:2], -1))
        elif factors is not None:
            out = factors.full.apply_o(out)
        y = out.transpose(1, 2).reshape(B, L, self.inner)
        if factors is None or folded is None:
            return cast(Tensor, self.out(y))
        return project(y, self.out.weight, self.out.bias, factors.tokens, folded)


def _folding(factors: Factors) -> tuple[Tensor, _Relative]:
    """G_c ``(B, V, b, b)`` and the residual transform of factors that fold."""
    assert factors.view is not None and factors.residual is not None  # factors.folds
    return factors.view, cast(_Relative, factors.residual)


def _keys(factors: Factors, k: Tensor, v: Tensor, fold_k: bool, fold_v: bool) -> tuple[Tensor, Tensor]:
    """D_j^-1 k_j and D_j^-1 v_j past the folded factor: the residual where folded, else the whole transform."""
    full = cast(_Relative, factors.full)
    residual = cast(_Relative, factors.residual) if factors.folds else full
    return (residual if fold_k else full).apply_k(k), (residual if fold_v else full).apply_v(v)


class MultiviewAttention(_Folded):
    """Multi-view self-attention ``(B, L, dim) -> (B, L, dim)`` with a geometric encoding.

    Args:
        dim: token width. heads: attention heads (head_dim = dim // heads unless given).
        encoding: a registry name or :class:`~hrope.Encoding` instance; None when the caller
            always passes ``factors=`` (a model that factorizes once for all its layers).
        qkv_bias, out_bias: biases of the input and output projections.
        qk_norm: RMS-normalise q and k per head before the encoding (as the LVSM model). The
            norm sits between projection and encoding, so q and k are then encoded per call;
            v and the output still fold. ``qk_norm_eps``: the norm's epsilon (None: torch's
            default, the machine epsilon of q's dtype; the official LVSM uses 1e-5).
        fold: what :meth:`factorize` (so ``forward(x, cameras, grid)``) does: False (the
            default) applies the whole prepared transform per call; True folds the per-view
            factor into the weights and rotates a RoPE left alone in place. The outputs agree to
            float rounding. With ``factors=`` given, the factors decide (``factorize(fold=...)``).

    Parameters ``qkv`` (``nn.Linear(dim, 3 * heads * head_dim)``, rows q, k, v, each head-major),
    ``out``, ``q_norm`` / ``k_norm``: the same names and layout as a plain attention module, so
    state dicts carry over. Exactly ``out(D_i o_i)`` of :func:`hrope.multiview_attention` on
    ``q, k, v = qkv(x)`` split into heads (tested to float rounding and gradients).

        >>> import torch, hrope.nn
        >>> from hrope.testing import random_cameras
        >>> cameras = random_cameras(B=1, V=2, image_size=(32, 32), dtype=torch.float32)
        >>> attn = hrope.nn.MultiviewAttention(dim=64, heads=4, encoding="prope")
        >>> x = torch.randn(1, 2 * 4 * 4, 64)                 # (B, L, dim): 2 views of 4x4 patches
        >>> attn(x, cameras, (4, 4)).shape
        torch.Size([1, 32, 64])
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        encoding: str | Encoding | None = "prope",
        *,
        qkv_bias: bool = False,
        out_bias: bool = False,
        qk_norm: bool = False,
        qk_norm_eps: float | None = None,
        head_dim: int | None = None,
        fold: bool = False,
    ) -> None:
        super().__init__(dim, heads, encoding, head_dim, fold)
        self.qkv = nn.Linear(dim, 3 * self.inner, bias=qkv_bias)
        self.add_output(dim, out_bias, qk_norm, qk_norm_eps)

    def forward(
        self,
        x: Tensor,
        cameras: Cameras | None = None,
        grid: tuple[int, int] | None = None,
        *,
        planes: Planes | None = None,
        params: dict[str, Tensor] | None = None,
        camera_tokens: CameraTokens | None = None,
        factors: Factors | None = None,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        """``x (B, L, dim)`` with ``cameras``, ``grid`` (and ``planes``, ``params``,
        ``camera_tokens`` as :func:`hrope.multiview_attention`), or ``factors`` from
        :meth:`factorize`; ``sdpa_kwargs`` go to SDPA (``attn_mask``, ``is_causal``, ...).
        Returns ``(B, L, dim)``."""
        if factors is None:
            if cameras is None or grid is None:
                raise EncodingError("MultiviewAttention needs cameras and grid, or factors")
            factors = self.factorize(
                cameras, grid, planes=planes, params=params, camera_tokens=camera_tokens, length=x.shape[1]
            )
        if factors.rotary(x.dtype):  # only factors made with fold=True rotate in place
            return self._rotary(x, factors, sdpa_kwargs)
        fold = factors.folds
        fold_qk = fold and not self.qk_norm
        fold_v = fold and factors.transform_values
        if fold_qk:
            view, inverse = _folding(factors)[0], factors.view_inv
            folded = self.fold_linear(self.qkv, [view.mT, inverse, inverse if fold_v else None], factors)
            q, k, v = self.split_heads(project(x, self.qkv.weight, self.qkv.bias, factors.tokens, folded), 3)
        elif fold_v:  # q and k are normalised before the encoding: plain weights; v alone folds
            weight, bias = self.qkv.weight, self.qkv.bias
            split = 2 * self.inner
            q, k = self.split_heads(F.linear(x, weight[:split], None if bias is None else bias[:split]), 2)
            v_linear = (weight[split:], None if bias is None else bias[split:])
            v_folded = self.fold_weight(*v_linear, [factors.view_inv], factors)
            (v,) = self.split_heads(project(x, *v_linear, factors.tokens, v_folded), 1)
        else:
            q, k, v = self.split_heads(self.qkv(x), 3)
        q, k = self.q_norm(q), self.k_norm(k)
        if not fold:
            return self.output(factors.full.attention(q, k, v, **sdpa_kwargs), None, False)
        q = (_folding(factors)[1] if fold_qk else factors.full).apply_q(q)
        k, v = _keys(factors, k, v, fold_qk, fold_v)
        return self.output(F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs), factors, True)

    def _rotary(self, x: Tensor, factors: Factors, sdpa_kwargs: dict[str, Any]) -> Tensor:
        """:meth:`forward` where the RoPE is all that is left per token (``factors.rotary``): q, k
        (unless QK-norm keeps them unfolded) and v with their channels interleaved, the per-view
        factor folded as in :meth:`forward`, the RoPE rotated in place (:mod:`.rotary`)."""
        B, L, _ = x.shape
        H, d, V = self.heads, self.head_dim, factors.tokens.num_views
        fold_qk = factors.folds and not self.qk_norm
        qk_rotary = fold_qk or not factors.folds  # else QK-norm comes first and q, k get the whole transform
        order = interleaved_order(d, factors.rope_dim, x.device)
        rope = functools.partial(
            rotate_, phase=factors.phase_for(x.dtype), num_views=V, head_dim=d, rope_dim=factors.rope_dim
        )
        y = self._rotary_qkv(x, factors, fold_qk, qk_rotary)
        first = 0 if qk_rotary and not self.qk_norm else 2 * H  # the heads of y rotated before any norm
        last = 3 * H if factors.transform_values else 2 * H
        if first < last:
            rope(y, heads=(first, last), inverse=True)
        q, k, v = y.view(B, L, 3, H, d).unbind(2)  # (B, L, H, d) each
        if self.qk_norm:
            q, k = _rms_norm(self.q_norm, q, order, qk_rotary), _rms_norm(self.k_norm, k, order, qk_rotary)
            if qk_rotary:
                q, k = rope(q, heads=(0, H), inverse=True), rope(k, heads=(0, H), inverse=True)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if not qk_rotary:
            q, k = factors.full.apply_q(q), cast(_Relative, factors.full).apply_k(k)
        out = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs).transpose(1, 2).reshape(B, L, self.inner)
        return self._rotary_output(out.clone() if out._base is not None else out, factors)  # not SDPA's output

    def _rotary_output(self, out: Tensor, factors: Factors) -> Tensor:
        """The output side of :meth:`_rotary`: ``out (B, L, inner)`` (channels as v's, a tensor the
        module may overwrite) rotated by R(θ) in place, then the output projection with its
        columns in the same order and the per-view factor folded in. Returns ``(B, L, dim)``."""
        if not factors.transform_values:
            return cast(Tensor, self.out(out))
        B, V, H, d = out.shape[0], factors.tokens.num_views, self.heads, self.head_dim
        rotate_(out, factors.phase_for(out.dtype), V, (0, H), d, factors.rope_dim, inverse=False)
        weight = self.out.weight.index_select(1, _row_order((True,), H, d, factors.rope_dim, out.device))
        if not factors.folds:
            return F.linear(out, weight, self.out.bias)
        weight_t, _ = fold_rows(weight.mT, None, [_folding(factors)[0].mT], H, factors.num_blocks)
        bias = None if self.out.bias is None else self.out.bias.expand(B, V, -1)
        return _per_view_linear(out, weight_t, bias).flatten(1, 2)

    def _rotary_qkv(self, x: Tensor, factors: Factors, fold_qk: bool, qk_rotary: bool) -> Tensor:
        """The q, k, v projection of :meth:`_rotary`: rows of the parts that are rotated in the
        interleaved order, per-view factors folded (q, k where ``fold_qk``; v where values are
        transformed); a new tensor with the layout of ``qkv(x)``."""
        rows = _row_order((qk_rotary, qk_rotary, True), self.heads, self.head_dim, factors.rope_dim, x.device)
        weight = self.qkv.weight.index_select(0, rows)
        bias = None if self.qkv.bias is None else self.qkv.bias.index_select(0, rows)
        fold_v = factors.folds and factors.transform_values
        if not (fold_qk or fold_v):
            return F.linear(x, weight, bias)
        view, inverse = _folding(factors)[0], factors.view_inv
        matrices = [view.mT if fold_qk else None, inverse if fold_qk else None, inverse if fold_v else None]
        return _per_view_linear(x, *self.fold_weight(weight, bias, matrices, factors))


@functools.lru_cache(maxsize=64)
def _row_order(moved: tuple[bool, ...], heads: int, head_dim: int, rope_dim: int, device: torch.device) -> Tensor:
    """Rows ``(len(moved) * heads * head_dim,)`` of a projection whose part p (q, k, v, ...) has
    the channels of every head in :func:`~.rotary.interleaved_order` where ``moved[p]``, else as
    they are."""
    order = interleaved_order(head_dim, rope_dim, device)
    per_part = torch.stack([order if m else torch.arange(head_dim, device=device) for m in moved])
    offsets = torch.arange(len(moved) * heads, device=device).view(-1, heads, 1) * head_dim
    return (offsets + per_part[:, None]).flatten()


def _rms_norm(norm: nn.Module, x: Tensor, order: Tensor, permuted: bool) -> Tensor:
    """``norm(x)`` for an RMSNorm over the last dim, with x's channels in ``order`` when ``permuted``
    (the gain follows them); returns a new tensor."""
    rms = cast(nn.RMSNorm, norm)
    gain = rms.weight if rms.weight is None or not permuted else rms.weight[order]
    return F.rms_norm(x, rms.normalized_shape, gain, rms.eps)


def _per_view_linear(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    """``x (B, V * P, in)`` (view-major) times per-view ``weight_t (B, V, in, out)`` plus ``bias
    (B, V, out)``: ``(B, V, P, out)`` as a new tensor (not a view)."""
    B, V = weight_t.shape[:2]
    y = x.reshape(B, V, -1, x.shape[-1]) @ weight_t
    return y if bias is None else y.add_(bias[:, :, None])


class MultiviewCrossAttention(_Folded):
    """Queries ``x (B, Lq, dim)`` attending to ``context (B, Lk, context_dim)``, each token set with
    its own :class:`Factors` (or None: no cameras, e.g. text), as :func:`hrope.cross_attention`.

    Parameters ``q`` (``nn.Linear(dim, heads * head_dim)``), ``kv`` (``nn.Linear(context_dim,
    2 * heads * head_dim)``, rows k then v), ``out``, and ``q_norm`` / ``k_norm`` with
    ``qk_norm`` (epsilon ``qk_norm_eps``). The query side's per-view factor folds into W_q and
    W_o, the key side's into W_k and W_v where that side's factors were made with ``fold=True``
    (``fold`` as in :class:`MultiviewAttention`; by default nothing folds). Query-frame encodings are refused
    (EncodingError), as in :func:`hrope.cross_attention`.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        encoding: str | Encoding | None = "prope",
        *,
        context_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        qk_norm: bool = False,
        qk_norm_eps: float | None = None,
        head_dim: int | None = None,
        fold: bool = False,
    ) -> None:
        super().__init__(dim, heads, encoding, head_dim, fold)
        self.q = nn.Linear(dim, self.inner, bias=qkv_bias)
        self.kv = nn.Linear(context_dim or dim, 2 * self.inner, bias=qkv_bias)
        self.add_output(dim, out_bias, qk_norm, qk_norm_eps)

    def forward(
        self, x: Tensor, context: Tensor, *, query: Factors | None, key: Factors | None, **sdpa_kwargs: Any
    ) -> Tensor:
        """``x (B, Lq, dim)``, ``context (B, Lk, context_dim)``; ``query`` / ``key``: the
        :class:`Factors` of each set (:meth:`factorize` with ``length`` = its token count) or None.
        Returns ``(B, Lq, dim)``."""
        for name, side in (("query", query), ("key", key)):
            if side is not None and side.full.query_frame:
                raise EncodingError(
                    f"MultiviewCrossAttention: {name} has a query-frame encoding, which re-encodes keys per "
                    "query view: use MultiviewAttention over both sets' cameras with an attn_mask"
                )
        fold_query, fold_key = query is not None and query.folds, key is not None and key.folds
        fold_q = fold_query and not self.qk_norm
        fold_k = fold_key and not self.qk_norm
        fold_v = fold_key and cast(Factors, key).transform_values
        q_folded = kv_folded = None
        if query is not None and fold_q:
            q_folded = self.fold_linear(self.q, [_folding(query)[0].mT], query)
        if key is not None and (fold_k or fold_v):
            k_inv = key.view_inv
            kv_folded = self.fold_linear(self.kv, [k_inv if fold_k else None, k_inv if fold_v else None], key)
        (q,) = self.split_heads(_project(x, self.q, query, q_folded), 1)
        k, v = self.split_heads(_project(context, self.kv, key, kv_folded), 2)
        q, k = self.q_norm(q), self.k_norm(k)
        if not (fold_query or fold_key):  # the whole transforms: hrope.cross_attention (its precision)
            sides = [None if side is None else side.full for side in (query, key)]
            return self.output(cross_attention(q, k, v, query=sides[0], key=sides[1], **sdpa_kwargs), None, False)
        if query is not None:
            q = (_folding(query)[1] if fold_q else query.full).apply_q(q)
        if key is not None:
            k, v = _keys(key, k, v, fold_k, fold_v)
        out = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
        return self.output(out, query, fold_query)


def _project(
    x: Tensor, linear: nn.Linear, factors: Factors | None, folded: tuple[Tensor, Tensor | None] | None
) -> Tensor:
    """``linear(x)``, per-view folded weights for the camera tokens of ``factors`` where given."""
    if factors is None or folded is None:
        return cast(Tensor, linear(x))
    return project(x, linear.weight, linear.bias, factors.tokens, folded)
