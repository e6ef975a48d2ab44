"""Attention with geometric encodings: `multiview_attention` (self-attention, camera tokens
mixed with identity tokens), `cross_attention` (two token sets) and `KVCache` (incremental decoding).

Each is one ``scaled_dot_product_attention`` call between the transforms (query-frame
encodings: one per query view), so SDPA's flash and memory-efficient kernels stay eligible: no
mask is added except ``KVCache``'s lower-right causal bias (:func:`torch.nn.attention.bias.causal_lower_right`,
which those kernels take) and the user's own.
"""

from __future__ import annotations

import functools
from typing import Any, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from .cameras import Cameras
from .encodings import Encoding, EncodingError, Prepared, TokenTransform, get_encoding
from .encodings.base import check_mask_options
from .encodings.precision import attend_in
from .planes import Planes
from .shapes import check_shapes
from .tokens import CameraTokens, MixedTokens

__all__ = ["multiview_attention", "check_qkv", "cross_attention", "KVCache"]

_QKV_SHAPE = (
    "q, k, v must share one shape (B, heads, N, head_dim) (with enable_gqa=True, k and v may have "
    "a divisor of q's heads); got {shapes[q]}, {shapes[k]}, {shapes[v]}"
)
_QKV_PLACE = (
    "q, k, v must share one dtype and device; got {dtypes[q]} on {devices[q]}, {dtypes[k]} on {devices[k]}, "
    "{dtypes[v]} on {devices[v]}"
)
_QKV_MESSAGES = {
    **dict.fromkeys(("type", "shape", "dims"), _QKV_SHAPE),
    **dict.fromkeys(("same_device", "same_dtype"), _QKV_PLACE),
}


def check_qkv(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cameras: Cameras,
    grid: tuple[int, int],
    enable_gqa: bool = False,
    camera_tokens: CameraTokens | None = None,
) -> None:
    """Shapes: q, k, v ``(B, heads, N, head_dim)`` alike, N = V * grid_h * grid_w, B = cameras' B;
    with ``enable_gqa`` k and v may have fewer heads, a divisor of q's (grouped-query attention).
    With ``camera_tokens`` N is the sequence length L (checked by :class:`~hrope.MixedTokens`)."""
    if not isinstance(cameras, Cameras):
        raise EncodingError(f"cameras must be hrope.Cameras, got {type(cameras).__name__}")
    if len(grid) != 2 or min(grid) <= 0:
        raise EncodingError(f"grid must be (grid_h, grid_w) with positive entries, got {grid}")
    kv = "B heads N head_dim" if not enable_gqa else "B heads_kv N head_dim"
    dims = check_shapes(
        {"q": (q, "B heads N head_dim"), "k": (k, kv), "v": (v, kv)},
        error=EncodingError,
        same_device=True,
        same_dtype=True,
        messages=_QKV_MESSAGES,
    )
    heads, heads_kv = dims["heads"], dims.get("heads_kv", dims["heads"])
    if heads_kv != heads and (heads_kv == 0 or heads % heads_kv):
        raise EncodingError(_QKV_SHAPE.format(shapes={"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape)}))
    B, N = dims["B"], dims["N"]
    expected = cameras.num_views * grid[0] * grid[1]
    if N != expected and camera_tokens is None:
        raise EncodingError(f"N = {N} tokens, but {cameras.num_views} views x grid {tuple(grid)} = {expected}")
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
    planes: Planes | None = None,
    params: dict[str, Tensor] | None = None,
    camera_tokens: CameraTokens | None = None,
    **sdpa_kwargs: Any,
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
        camera_tokens: None (all N tokens are camera tokens), or where the V * grid_h * grid_w
            camera tokens sit among the L tokens of q, k, v (a slice, integer positions or a
            boolean mask, :class:`~hrope.MixedTokens`); the others get the identity transform.
        **sdpa_kwargs: passed to ``scaled_dot_product_attention`` (``attn_mask``, ``dropout_p``,
            ``scale``, ...).

    Returns ``(B, heads, N, head_dim)``, like SDPA. Geometry is computed in float32 (float64 for
    float64 q) and cast to q's dtype.

    Example: two views of 4x4 patches, the second camera 0.5 to the right of the first, every
    patch on the plane z = 3 of its camera (``hrope-lift`` needs planes, ``prope`` does not):

        >>> import torch, hrope
        >>> K = torch.tensor([[40.0, 0, 16], [0, 40.0, 16], [0, 0, 1]]).repeat(1, 2, 1, 1)  # pixels
        >>> world_to_cam = torch.eye(4).repeat(1, 2, 1, 1)              # (B, V, 4, 4), OpenCV axes
        >>> world_to_cam[0, 1, 0, 3] = -0.5
        >>> cameras = hrope.Cameras(K, world_to_cam, image_size=(32, 32))
        >>> q, k, v = torch.randn(3, 1, 8, 2 * 4 * 4, 64)               # each (B, heads, N, head_dim)
        >>> planes = hrope.Planes(normal=torch.tensor([0.0, 0, -1]).expand(1, 32, 3), depth=torch.full((1, 32), 3.0))
        >>> out = hrope.multiview_attention(q, k, v, encoding="hrope-lift", cameras=cameras, grid=(4, 4), planes=planes)
        >>> out.shape
        torch.Size([1, 8, 32, 64])
        >>> hrope.multiview_attention(q, k, v, encoding="prope", cameras=cameras, grid=(4, 4)).shape
        torch.Size([1, 8, 32, 64])
    """
    check_qkv(q, k, v, cameras, grid, enable_gqa=sdpa_kwargs.get("enable_gqa", False), camera_tokens=camera_tokens)
    if q.dtype == torch.float64 and cameras.K.dtype != torch.float64:
        cameras = cameras.to(dtype=torch.float64)
    grid = cast("tuple[int, int]", tuple(grid))  # a list is accepted too
    prepared = get_encoding(encoding).prepare(cameras, grid, q.shape[-1], planes=planes, **(params or {}))
    if camera_tokens is not None:
        prepared = MixedTokens(prepared, camera_tokens, q.shape[2])
    return prepared.attention(q, k, v, **sdpa_kwargs)


# a relative encoding's TokenTransform or a MixedTokens over one (what _relative lets through)
_Relative = TokenTransform | MixedTokens


@overload
def _relative(transform: None, where: str) -> None: ...
@overload
def _relative(transform: Prepared, where: str) -> _Relative: ...
def _relative(transform: Prepared | None, where: str) -> _Relative | None:
    """``transform`` if it is None or a relative encoding's prepared transform, else one-line EncodingError."""
    if transform is not None and (not isinstance(transform, Prepared) or transform.query_frame):
        got = "a query-frame transform" if isinstance(transform, Prepared) else type(transform).__name__
        raise EncodingError(
            f"{where} takes a relative encoding's TokenTransform, a MixedTokens over one, or None "
            f"(identity), got {got}; query-frame encodings re-encode keys per query view: prepare "
            "one transform over all the cameras and use its attention() with an attn_mask"
        )
    return cast("_Relative | None", transform)


def cross_attention(
    q: Tensor, k: Tensor, v: Tensor, *, query: Prepared | None, key: Prepared | None, **sdpa_kwargs: Any
) -> Tensor:
    """Queries of one token set attending to the keys and values of another, each set with its own transform.

    ``query`` transforms q and the output (``apply_q``, ``apply_o``), ``key`` transforms k and v
    (``apply_k``, ``apply_v``): each a relative encoding's :class:`~hrope.TokenTransform`, a
    :class:`~hrope.MixedTokens` over one (identity tokens on that side), or None (a set without
    cameras, e.g. text: identity). Logits q_i^T D_i D_j^-1 k_j, one SDPA call.

    q ``(B, heads, Lq, d)``, k and v ``(B, heads_kv, Lk, d)`` (each checked by its transform);
    returns ``(B, heads, Lq, d)``. ``sdpa_kwargs`` go to SDPA (``attn_mask`` ``(..., Lq, Lk)``, ...).

    A query-frame encoding's keys depend on the query camera, so its cross transform binds both
    sets at once (``rayrope``'s ``prepare_cross``): pass that one transform as both ``query`` and
    ``key`` (one SDPA call per query view).
    """
    if any(isinstance(t, Prepared) and t.query_frame for t in (query, key)):
        if query is not key:
            raise EncodingError(
                "cross_attention: got a query-frame transform that is not both query= and key=; its keys "
                "depend on the query camera, so one transform binds both token sets (rayrope's prepare_cross): "
                "pass the same one as query= and key="
            )
        check_mask_options(sdpa_kwargs)
        return cast(Prepared, query).attention(q, k, v, **sdpa_kwargs)
    query, key = _relative(query, "cross_attention: query"), _relative(key, "cross_attention: key")
    if query is not None and key is not None:
        shapes = [(t.batch_size, t.head_dim) for t in (query, key)]
        if shapes[0] != shapes[1]:
            raise EncodingError(
                f"cross_attention: query transform has (batch, head_dim) = {shapes[0]}, key transform "
                f"{shapes[1]}; they must agree"
            )
        if query.transform_values != key.transform_values:
            raise EncodingError(
                "cross_attention: query and key transforms must agree on transform_values "
                "(both transform v and the output, or neither)"
            )
    check_mask_options(sdpa_kwargs)
    dtype = _attention_dtype(q.dtype, query, key)
    return attend_in(dtype, functools.partial(_cross, query, key), q, k, v, **sdpa_kwargs)


def _cross(
    query: _Relative | None, key: _Relative | None, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any
) -> Tensor:
    """:func:`cross_attention` of q, k, v in their dtype."""
    if query is not None:
        q = query.apply_q(q)
    if key is not None:
        k, v = key.apply_k(k), key.apply_v(v)
    out = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
    return out if query is None else query.apply_o(out)


def _attention_dtype(dtype: torch.dtype, *transforms: _Relative | None) -> torch.dtype:
    """The dtype SDPA runs in for tensors of ``dtype`` between ``transforms``: the widest of their
    :meth:`~hrope.TokenTransform.attention_dtype` (``dtype`` for None, the identity)."""
    for transform in transforms:
        if transform is not None:
            dtype = torch.promote_types(dtype, transform.attention_dtype(dtype))
    return dtype


# KVCache's messages (check_shapes templates)
_CHUNK_SHAPE = "KVCache: k and v must share one shape (B, heads, tokens, head_dim), got {shapes[k]}, {shapes[v]}"
_CACHE_MISMATCH = (
    "KVCache: new keys {shapes[k]} {dtypes[k]} on {devices[k]} must match the cache's (B, heads, ., head_dim) = "
    "{shapes[cache]} {dtypes[cache]} on {devices[cache]}"
)
_CHUNK_QUERIES = (
    "KVCache.attention: q and k must be (B, heads, L, head_dim) alike but for the heads (the new chunk's L tokens "
    "each), got {shapes[q]}, {shapes[k]}"
)
_CHUNK_MASK = (
    "KVCache.attention: attn_mask must end in (new tokens, cached + new tokens) = ({dims[L]}, {dims[T]}), "
    "got {shapes[attn_mask]}"
)


class KVCache:
    """The encoded keys and values of every token seen so far, for incremental decoding (one per layer).

    Each call takes a new chunk of tokens (new frames with their cameras, identity tokens such as
    text, or both) with its own ``transform`` (a relative encoding's
    :class:`~hrope.TokenTransform`, a :class:`~hrope.MixedTokens` over one, or None for identity
    tokens): its keys and values are transformed once (D^-1 k, D^-1 v) and appended, its queries
    transformed and attended over every cached token. Exact because a relative encoding's D_j
    depends on token j alone; prepare once over all cameras and take
    :meth:`~hrope.TokenTransform.select_views` per chunk where D depends on all cameras (``hrope``
    with ``gauge="centroid"``, its default). Query-frame encodings are refused (their keys
    depend on the query view). Appending concatenates (O(cached) copy per call).

    ``keys``, ``values``: the cache ``(B, heads_kv, T, d)``, None while empty, in the dtype the
    attention runs in (:meth:`~hrope.TokenTransform.attention_dtype`: float32 for half-precision
    chunks once one chunk's transform attends in float32); ``dtype``: that of the chunks' k and v.
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.dtype: torch.dtype | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, k: Tensor, v: Tensor, transform: Prepared | None = None) -> tuple[Tensor, Tensor]:
        """Transform the new chunk's k, v ``(B, heads_kv, Lk, d)`` (``apply_k``, ``apply_v``), append
        them and return the whole cache ``(B, heads_kv, T, d)``. The cache is unchanged on an error."""
        transform = _relative(transform, "KVCache")
        chunk = "B heads tokens head_dim"
        check_shapes({"k": (k, chunk), "v": (v, chunk)}, error=EncodingError, messages=_CHUNK_SHAPE)
        if self.keys is not None:
            cache = {"cache": (self.keys, "B heads cached head_dim"), "k": (k, chunk)}
            check_shapes(cache, error=EncodingError, same_device=True, messages=_CACHE_MISMATCH)
            if k.dtype != self.dtype:
                shapes = {"cache": tuple(self.keys.shape), "k": tuple(k.shape)}
                devices = {"cache": self.keys.device, "k": k.device}
                dtypes = {"cache": self.dtype, "k": k.dtype}
                raise EncodingError(_CACHE_MISMATCH.format(shapes=shapes, dtypes=dtypes, devices=devices))
        chunk_dtype, dtype = k.dtype, self._attention_dtype(k.dtype, transform)
        k, v = k.to(dtype), v.to(dtype)
        if transform is not None:
            k, v = transform.apply_k(k), transform.apply_v(v)
        if self.keys is None or self.values is None:  # both or neither
            self.keys, self.values, self.dtype = k, v, chunk_dtype
        else:
            self.keys = torch.cat([self.keys.to(dtype), k], 2)
            self.values = torch.cat([self.values.to(dtype), v], 2)
        return self.keys, self.values

    def _attention_dtype(self, dtype: torch.dtype, transform: _Relative | None) -> torch.dtype:
        """The dtype a chunk of ``dtype`` with ``transform`` attends in: the transform's, widened to the cache's."""
        dtype = _attention_dtype(dtype, transform)
        return dtype if self.keys is None else torch.promote_types(dtype, self.keys.dtype)

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        transform: Prepared | None = None,
        *,
        is_causal: bool = False,
        attn_mask: Tensor | None = None,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        """Append the new chunk (:meth:`append`) and return its queries' outputs over all T cached tokens.

        q ``(B, heads, L, d)`` holds the chunk's L queries (the same tokens as k and v, the last L
        of the sequence). ``is_causal=False``: each new token attends to every cached token and to
        the whole chunk (across chunks, block-causal: frame by frame). ``is_causal=True``: the
        token at sequence position p attends to positions <= p (causal over the whole sequence,
        SDPA's lower-right causal bias). ``attn_mask`` ``(..., L, T)``: the caller's own.
        """
        check_mask_options({"is_causal": is_causal, "attn_mask": attn_mask})
        check_shapes(
            {"q": (q, "B heads L head_dim"), "k": (k, "B heads_kv L head_dim")},
            error=EncodingError,
            messages=_CHUNK_QUERIES,
        )
        total = len(self) + k.shape[2]
        if attn_mask is not None:
            check_shapes(
                {"attn_mask": (attn_mask, "... T")},
                error=EncodingError,
                dims={"L": q.shape[2], "T": total},
                messages=_CHUNK_MASK,
            )
        transform = _relative(transform, "KVCache")
        attend = functools.partial(self._attend, k, v, transform, total, is_causal)
        return attend_in(self._attention_dtype(q.dtype, transform), attend, q, attn_mask=attn_mask, **sdpa_kwargs)

    def _attend(
        self,
        k: Tensor,
        v: Tensor,
        transform: _Relative | None,
        total: int,
        is_causal: bool,
        q: Tensor,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        """:meth:`attention` with q in the dtype it attends in (the cache's after the append)."""
        q = q if transform is None else transform.apply_q(q)
        keys, values = self.append(k, v, transform)
        L = q.shape[2]
        attn_mask = sdpa_kwargs.pop("attn_mask")
        if is_causal and L < total:  # the queries are the last L of T tokens: causal aligned lower-right
            from torch.nn.attention.bias import causal_lower_right  # not loaded by import torch

            attn_mask, is_causal = (None if L == 1 else causal_lower_right(L, total)), False
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, is_causal=is_causal, **sdpa_kwargs)
        return out if transform is None else transform.apply_o(out)
