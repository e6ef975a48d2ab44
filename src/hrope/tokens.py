"""Sequences that mix camera tokens with tokens that have none (registers, cls, camera or text tokens).

:class:`MixedTokens` places a prepared transform's N camera tokens at known positions of a
sequence of L tokens; the other L - N tokens get the identity transform (D = I, as VGGT gives its
camera and register tokens) and still attend and are attended to. For a relative encoding a logit
is q_i^T D_i D_j^-1 k_j with D = I for identity tokens: camera-to-identity q_i^T D_i k_j, between
two identity tokens plain q_i^T k_j. Attention stays one SDPA call over all L tokens.

For a query-frame encoding (rayrope, urope, worldrope) the same rule is read per query view:
a camera query of view c sees the camera keys in c's frame (as without identity tokens) and the
identity keys as they are; an identity query sees every camera key in its own view's frame (the
key coefficient z_j of its own view, i.e. D_i = I in the relative formula) and the identity keys
as they are. That runs one SDPA call per query view and one for the identity queries.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .encodings import EncodingError, Prepared, QueryFrameTransform, TokenTransform
from .encodings.base import check_mask_options, check_prepared_input
from .encodings.precision import attend_in

__all__ = ["MixedTokens", "camera_positions"]

# where camera tokens sit in a sequence (camera_positions)
CameraTokens = slice | Sequence[int] | Tensor
ACCEPTED = "a slice, integer positions (a sequence or an integer tensor) or a boolean mask over the sequence"


def camera_positions(camera_tokens: CameraTokens, length: int, count: int) -> list[int]:
    """The position in ``[0, length)`` of each of ``count`` camera tokens, in the transform's token
    order, as Python ints; one-line :class:`EncodingError` for anything else.

    ``camera_tokens``: a slice (``slice(2, None)``: registers first), integer positions (a
    sequence or a 1-D integer tensor; the i-th is where camera token i sits) or a 1-D boolean mask
    of ``length`` (camera tokens in sequence order). Tensors are read once (one device sync).
    """
    if isinstance(camera_tokens, slice):
        positions = list(range(length)[camera_tokens])
    elif isinstance(camera_tokens, Tensor):
        if camera_tokens.ndim != 1 or camera_tokens.is_floating_point() or camera_tokens.is_complex():
            raise EncodingError(
                f"camera_tokens must be {ACCEPTED}; one layout for the whole batch, got a "
                f"{camera_tokens.dtype} tensor of shape {tuple(camera_tokens.shape)}"
            )
        if camera_tokens.dtype == torch.bool and camera_tokens.numel() != length:
            raise EncodingError(
                f"camera_tokens: a boolean mask must have the sequence length {length}, got {camera_tokens.numel()}"
            )
        positions = (camera_tokens.nonzero().flatten() if camera_tokens.dtype == torch.bool else camera_tokens).tolist()
    else:
        try:
            positions = [operator.index(p) for p in camera_tokens]
        except TypeError:
            raise EncodingError(f"camera_tokens must be {ACCEPTED}, got {type(camera_tokens).__name__}") from None
    outside = [p for p in positions if not 0 <= p < length]
    if outside:
        raise EncodingError(f"camera_tokens: position {outside[0]} is outside the sequence [0, {length})")
    if len(set(positions)) != len(positions):
        duplicate = next(p for p, n in Counter(positions).items() if n > 1)
        raise EncodingError(f"camera_tokens: position {duplicate} is given twice; each camera token needs its own")
    if len(positions) != count:
        raise EncodingError(
            f"camera_tokens gives {len(positions)} positions, but the transform has {count} "
            "camera tokens (views x grid)"
        )
    return positions


class MixedTokens(Prepared):
    """A prepared transform's camera tokens among ``length`` tokens; identity for the others.

    Args:
        prepared: a :class:`~hrope.encodings.base.TokenTransform` or
            :class:`~hrope.encodings.query_frame.QueryFrameTransform` over N camera tokens.
        camera_tokens: where they sit among the L tokens (:func:`camera_positions`: a slice,
            integer positions in the transform's token order, or a boolean mask), the same for
            every sample of the batch. Checked once here: in range, no duplicates, exactly N.
        length: L, the sequence length.

    ``apply_q``, ``apply_k``, ``apply_v``, ``apply_o`` take ``(B, heads, L, head_dim)`` and apply
    the transform to the camera tokens only (a contiguous slice by ``cat`` around it, other layouts
    by one gather and one scatter); ``attention(q, k, v, **sdpa_kwargs)`` is one SDPA call over all
    L tokens with the caller's ``attn_mask`` / ``is_causal`` (over the L positions). Query-frame
    transforms have no ``apply_k``/``apply_v`` (keys depend on the query view): use ``attention``.
    """

    head_dim: int

    def __init__(self, prepared: Prepared, camera_tokens: CameraTokens, length: int) -> None:
        if not isinstance(prepared, Prepared) or isinstance(prepared, MixedTokens):
            raise EncodingError(
                f"MixedTokens needs a prepared transform (encoding.prepare(...)), got {type(prepared).__name__}"
            )
        count = prepared.num_tokens
        if not isinstance(length, int) or length < count:
            raise EncodingError(f"length must be an int of at least the {count} camera tokens, got {length!r}")
        positions = camera_positions(camera_tokens, length, count)
        self.prepared = prepared
        self.length = length
        self.batch_size, self.device, self.head_dim = prepared.batch_size, prepared.device, prepared.head_dim
        self.query_frame, self.transform_values = prepared.query_frame, prepared.transform_values
        start = positions[0]
        self._span = (start, start + count) if positions == list(range(start, start + count)) else None
        self._index = torch.tensor(positions, dtype=torch.long, device=self.device)
        taken = set(positions)
        self._identity = torch.tensor(
            [p for p in range(length) if p not in taken], dtype=torch.long, device=self.device
        )

    @property
    def num_tokens(self) -> int:
        return self.length

    def apply_q(self, x: Tensor) -> Tensor:
        """The transform's ``apply_q`` on the camera tokens of x ``(B, heads, L, head_dim)``."""
        return self._apply(x, self.prepared.apply_q)

    def apply_k(self, x: Tensor) -> Tensor:
        """The transform's ``apply_k`` on the camera tokens (relative encodings)."""
        return self._apply(x, self._relative("apply_k").apply_k)

    def apply_v(self, x: Tensor) -> Tensor:
        """The transform's ``apply_v`` on the camera tokens (relative encodings)."""
        return self._apply(x, self._relative("apply_v").apply_v)

    def apply_o(self, x: Tensor) -> Tensor:
        """The transform's ``apply_o`` on the camera tokens of x ``(B, heads, L, head_dim)``."""
        return self._apply(x, self.prepared.apply_o)

    def attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype :meth:`attention` runs SDPA in for q, k, v of ``dtype``: the transform's."""
        return self.prepared.attention_dtype(dtype)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        """Encoded SDPA over all L tokens: q, k, v ``(B, heads, L, head_dim)`` -> same shape, computed
        in :meth:`attention_dtype` (the output rounded to q's dtype once)."""
        check_mask_options(sdpa_kwargs)
        return attend_in(self.attention_dtype(q.dtype), self._attention, q, k, v, **sdpa_kwargs)

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        if self._span == (0, self.length):
            return self.prepared.attention(q, k, v, **sdpa_kwargs)
        if self.query_frame:
            return self._query_frame_attention(q, k, v, **sdpa_kwargs)
        out = F.scaled_dot_product_attention(self.apply_q(q), self.apply_k(k), self.apply_v(v), **sdpa_kwargs)
        return self.apply_o(out)

    def _relative(self, what: str) -> TokenTransform:
        if self.query_frame:
            raise EncodingError(
                f"MixedTokens.{what}: a query-frame encoding re-encodes keys per query view; "
                "use MixedTokens.attention(q, k, v)"
            )
        return cast(TokenTransform, self.prepared)  # a relative encoding's (never a MixedTokens)

    def _check(self, x: Tensor) -> None:
        check_prepared_input(x, self.batch_size, self.length, self.head_dim, self.device)

    def _apply(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """x with ``fn`` applied to its camera tokens (in the transform's order)."""
        self._check(x)
        if self._span is None:
            return x.index_copy(2, self._index, fn(x.index_select(2, self._index)))
        start, stop = self._span
        return torch.cat([x[:, :, :start], fn(x[:, :, start:stop]), x[:, :, stop:]], dim=2)

    # --------------------------------------------------------------------------- query-frame
    def _query_frame_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        """One SDPA call per query view (its camera queries) and one for the identity queries, each
        over all L keys (module docstring); ``recompute`` as in the transform's loop execution."""
        for x in (q, k, v):
            self._check(x)
        if is_causal:
            attn_mask = torch.ones(self.length, self.length, dtype=torch.bool, device=q.device).tril()
        prepared = cast(QueryFrameTransform, self.prepared)  # query_frame
        P = prepared.tokens_per_view
        q_rot = self.apply_q(q)
        k_cam, v_cam = k.index_select(2, self._index), v.index_select(2, self._index)
        groups: list[tuple[Tensor, int | None]] = [
            (self._index[c * P : (c + 1) * P], c) for c in range(prepared.num_views)
        ]
        if self._identity.numel():
            groups.append((self._identity, None))
        outs = []
        for rows, view in groups:
            mask = attn_mask
            if mask is not None and mask.ndim >= 2 and mask.shape[-2] != 1:
                mask = mask.index_select(-2, rows)
            args = (q_rot.index_select(2, rows), k, v, k_cam, v_cam, view, mask)
            if prepared.recompute and torch.is_grad_enabled():
                outs.append(checkpoint(self._group_attention, *args, use_reentrant=False, **sdpa_kwargs))
            else:
                outs.append(self._group_attention(*args, **sdpa_kwargs))
        order = torch.cat([rows for rows, _ in groups])
        return self.apply_o(torch.cat(outs, 2).index_select(2, torch.argsort(order)))

    def _group_attention(
        self,
        q_rows: Tensor,
        k: Tensor,
        v: Tensor,
        k_cam: Tensor,
        v_cam: Tensor,
        view: int | None,
        mask: Tensor | None,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        """SDPA of some queries over all L keys: the camera keys in query view ``view``'s frame, or
        (``view`` None, identity queries) each in its own view's frame; identity keys as they are."""
        prepared = cast(QueryFrameTransform, self.prepared)
        if view is None:  # each camera key in its own view's frame
            k_enc, v_enc = prepared.apply_kv_own(k_cam, v_cam)
        else:
            k_enc, v_enc = prepared.apply_kv(k_cam, v_cam, view)
        k_all, v_all = k.index_copy(2, self._index, k_enc), v.index_copy(2, self._index, v_enc)
        return F.scaled_dot_product_attention(q_rows, k_all, v_all, attn_mask=mask, **sdpa_kwargs)
