"""Shared machinery of the query-frame encodings (``rayrope``, ``urope``, ``worldrope``).

A query-frame encoding gives key token j a position that depends on the query view c, so the
key transform is recomputed per query view. Every token's encoding is one complex coefficient
per channel pair, z = E[exp(iθ)] (a unit phase when deterministic, a shrunk one under
uncertainty), acting on the split-half pairs (p, p + head_dim/2) of each head:

    q_i <- conj(z_i) q_i,   k_j <- conj(z_j^(c)) k_j,   v_j <- conj(z_j^(c)) v_j,   o_i <- z_i o_i

so a logit is Re(z_i conj(z_j^(c)) conj(q_i) k_j): for unit phases exactly RoPE on θ_i - θ_j^(c).
z_i, the query's own coefficient, is the key coefficient of token i in its own view's frame.
Under uncertainty the key's "inverse" is the expectation of the inverse rotation, E[R(-θ)] =
E[R(θ)]^T (RayRoPE's choice), not the matrix inverse.

Tokens are view-major, then row-major inside a view (x fastest): N = V * grid_h * grid_w.
Memory is O(V·N·head_dim): one coefficient table per query view, never an N x N tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.types import Device
from torch.utils.checkpoint import checkpoint

from ..cameras import Cameras
from ..geometry import geometry_dtype, invert_se3
from ..planes import MIN_DEPTH, Planes
from .base import (
    Encoding,
    EncodingError,
    Prepared,
    TokenTransform,
    check_prepared_input,
    per_token_param,
)
from .precision import attend_in, check_precision, transform_dtype

__all__ = [
    "QueryFrameEncoding",
    "QueryFrameTransform",
    "relative_poses",
    "to_query_frames",
    "project_to_patches",
    "image_position_rope_freqs",
    "pad_pairs",
    "MIN_DEPTH",
    "POSITION_MARGIN",
    "EXECUTIONS",
]

# Behind-camera rule shared by the projecting encodings (urope, worldrope): a point at camera
# depth Z is projected with |Z| clamped to at least MIN_DEPTH (points behind the camera are
# mirrored through the image plane, as the public RayRoPE/URoPE code does), and the projected
# position is clamped per axis to [-POSITION_MARGIN * g, (1 + POSITION_MARGIN) * g] patch units
# (g = grid width or height), so extreme zoom or near-plane points stay finite. MIN_DEPTH is the
# clamp policy's (hrope.planes, docs/encodings.md "Clamp policy").
POSITION_MARGIN = 2.0
EXECUTIONS = ("loop", "fold")


# ----------------------------------------------------------------------------------- geometry
def relative_poses(cameras: Cameras, dtype: torch.dtype, key_cameras: Cameras | None = None) -> Tensor:
    """Key-camera-to-query-camera transforms ``(B, Vq, Vk, 4, 4)`` = E_q E_k^-1 (world cancels);
    the keys' cameras are ``cameras`` too unless ``key_cameras`` is given."""
    E = cameras.world_to_cam.to(dtype)
    E_key = E if key_cameras is None else key_cameras.world_to_cam.to(dtype)
    return E[:, :, None] @ invert_se3(E_key)[:, None]


def to_query_frames(points: Tensor, rel: Tensor) -> Tensor:
    """Key-camera-frame points ``(B, Vk, P, *S, 3)`` -> every query frame ``(B, Vq, Vk * P, *S, 3)``."""
    B, Vk, P = points.shape[:3]
    extra = points.shape[3:-1]
    flat = points.reshape(B, Vk, -1, 3)
    out = torch.einsum("bqkij,bkmj->bqkmi", rel[..., :3, :3], flat) + rel[:, :, :, None, :3, 3]
    return out.reshape(B, rel.shape[1], Vk * P, *extra, 3)


def project_to_patches(X: Tensor, K_norm: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Project query-frame points ``X (..., 3)`` to query-image positions in patch units.

    ``K_norm`` holds the query intrinsics broadcastable to ``(..., 3, 3)``. Returns positions
    ``(..., 2)`` (patch ix has centre ix + 0.5) and the per-axis Jacobian scale ``(..., 2)``
    ``g * f̂ / Z_eff`` with the mirrored, clamped depth ``Z_eff = max(|Z|, MIN_DEPTH)``
    (see the module constants for the behind-camera rule).
    """
    grid_h, grid_w = grid
    z_eff = X[..., 2].abs().clamp_min(MIN_DEPTH)
    size = X.new_tensor([grid_w, grid_h])
    focal = torch.stack([K_norm[..., 0, 0], K_norm[..., 1, 1]], -1)
    centre = torch.stack([K_norm[..., 0, 2], K_norm[..., 1, 2]], -1)
    pos = size * (focal * X[..., :2] / z_eff[..., None] + centre + 0.5)
    pos = torch.maximum(torch.minimum(pos, (1 + POSITION_MARGIN) * size), -POSITION_MARGIN * size)
    return pos, size * focal / z_eff[..., None]


def image_position_rope_freqs(
    head_dim: int, base: float, device: Device = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Frequencies ``(F,)`` of the query-frame encodings' 2D RoPE on continuous image positions,
    F = head_dim // 4 per axis, ``w_f = base^(-f/F)``.

    Layout used by ``urope`` and ``worldrope``, over the whole head: pair p is channels
    (p, p + head_dim/2); pair f rotates by ``w_f * x``, pair F + f by ``w_f * y`` (x, y in patch
    units); pairs from 2F to head_dim/2 are identity. The relative encodings' RoPE uses the other
    layout (:func:`hrope.encodings.layout.patch_index_rope_angles`).
    """
    num = head_dim // 4
    exponent = -torch.arange(num, device=device, dtype=torch.float64) / max(num, 1)
    return (base**exponent).to(dtype)


def pad_pairs(re: Tensor, im: Tensor, num_pairs: int) -> tuple[Tensor, Tensor]:
    """Pad coefficient tables ``(..., n)`` to ``num_pairs`` with the identity (1 + 0i)."""
    missing = num_pairs - re.shape[-1]
    if missing < 0:
        raise EncodingError(f"{re.shape[-1]} channel pairs do not fit in head_dim/2 = {num_pairs}")
    return F.pad(re, (0, missing), value=1.0), F.pad(im, (0, missing), value=0.0)


# ----------------------------------------------------------------------------------- prepared
class QueryFrameTransform(Prepared):
    """Per-query-view coefficient tables; the precompute-then-apply object.

    Args:
        re, im: ``(B, Vq, Nk, head_dim/2)`` real and imaginary parts of the key coefficients
            z_j^(c) in every query frame c (geometry dtype).
        grid: ``(grid_h, grid_w)`` of the query views; N = Vq * grid_h * grid_w queries.
        execution: ``"loop"`` (one SDPA call per query view) or ``"fold"`` (query views folded
            into the batch, K and V replicated per query view, one SDPA call).
        recompute: loop only; checkpoint each query view's rotation + SDPA so backward recomputes
            them instead of keeping V rotated copies of K and V (one more SDPA forward per view).
        rotate_values: rotate v and the output too (``transform_values``); False: q and k only.
        query: cross-attention only: the queries' own coefficients ``(re, im)`` each
            ``(B, N, head_dim/2)``, for a query set other than the keys' (then ``num_keys`` = Nk
            may differ from N). Self-attention (None) takes them from the diagonal of re, im.
        relative: a relative encoding's :class:`~hrope.encodings.base.TokenTransform` over the
            first ``relative.head_dim`` = g channels of each head (self-attention only): q, k, v
            and o get its D_i^T, D_j^-1, D_j^-1, D_i there, and the coefficients above (then
            ``(..., (head_dim - g)/2)``, pairs (g + p, g + p + (head_dim - g)/2)) act on the rest.
        precision: as :class:`~hrope.encodings.base.TokenTransform`'s (:data:`~hrope.encodings.PRECISIONS`).
        per_head: head groups: ``heads -> (query, key)``, each an ``(re, im)``, the tables of every
            head for that number of heads: query ``(B, heads, N, n)``, key ``(B, Vq, heads, Nk, n)``
            (n = head_dim/2; built once per number of heads seen); re, im above then give only the shapes.
        order: the rotated channels' order: pair p acts on channels ``(order[p], order[p + r/2])`` of
            the r rotated channels (None: ``(p, p + r/2)``).

    Precompute-then-apply for custom attention (e.g. cross-attention): for each query view c,
    ``sdpa(apply_q(q_c, c), *apply_kv(k, v, c))`` then ``apply_o(o_c, c)``, where ``q_c`` holds
    view c's queries ``(B, heads, P, head_dim)`` and ``k, v`` all N keys (keys of views that
    should not be attended can be sliced out after ``apply_kv``; the transform is per token).
    Inputs are checked like :class:`~hrope.encodings.base.TokenTransform`'s: the prepared B, N (or P)
    and head_dim, the prepared device, any floating dtype (returned in it; the compute dtype is
    :func:`~hrope.encodings.precision.transform_dtype` of it and ``precision``).
    """

    query_frame = True
    head_dim: int

    def __init__(
        self,
        re: Tensor,
        im: Tensor,
        grid: tuple[int, int],
        execution: str = "loop",
        recompute: bool = False,
        rotate_values: bool = True,
        query: tuple[Tensor, Tensor] | None = None,
        relative: TokenTransform | None = None,
        precision: str = "auto",
        per_head: Callable[[int], tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]] | None = None,
        order: Tensor | None = None,
    ) -> None:
        if execution not in EXECUTIONS:
            raise EncodingError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
        check_precision(precision)
        self.precision = precision
        if relative is not None and query is not None:
            raise EncodingError("a query-frame transform with a relative part is for self-attention only")
        B, V, N, pairs = re.shape
        self.relative = relative
        self.lead = 0 if relative is None else relative.head_dim
        self.batch_size = B
        self.device = re.device
        self.grid: tuple[int, ...] = tuple(grid)
        self.num_views = V
        self.num_keys = N
        self.head_dim = self.lead + 2 * pairs
        self.execution = execution
        self.recompute = recompute
        self.transform_values = rotate_values
        self._key = (re, im)
        if query is None:
            P = N // V
            diag = torch.arange(V, device=re.device)
            query = cast(
                "tuple[Tensor, Tensor]",
                tuple(t.reshape(B, V, V, P, pairs)[:, diag, diag].reshape(B, N, pairs) for t in (re, im)),
            )
        self._query = query
        self._per_head = per_head
        self._order = order
        self._heads: dict[int, tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]] = {}
        self._cache: dict[tuple[str, torch.dtype, int], tuple[Tensor, Tensor]] = {}

    @property
    def tokens_per_view(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_views * self.tokens_per_view

    def coefficients(self, query_view: int | None = None, heads: int | None = None) -> tuple[Tensor, Tensor]:
        """``(re, im)``: the keys' coefficients z_j^(c) ``(B, Nk, head_dim/2)`` in query view c's
        frame, or (``query_view=None``) every query token's own coefficient z_i ``(B, N, head_dim/2)``;
        with head groups ``heads`` is required and a heads axis follows B."""
        if (self._per_head is None) != (heads is None):
            raise EncodingError("heads: pass the number of heads exactly when the coefficients differ per head")
        query, key = self._tables(heads or 1)
        if query_view is None:
            return (query[0], query[1]) if heads else (query[0][:, 0], query[1][:, 0])
        self._rows(query_view)
        re, im = key[0][:, query_view], key[1][:, query_view]
        return (re, im) if heads else (re[:, 0], im[:, 0])

    def _tables(self, heads: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """Query ``(B, H, N, n)`` and key ``(B, Vq, H, Nk, n)`` tables, H = 1 unless per head."""
        if self._per_head is None:
            return (self._query[0][:, None], self._query[1][:, None]), (
                self._key[0][:, :, None],
                self._key[1][:, :, None],
            )
        if heads not in self._heads:
            self._heads[heads] = self._per_head(heads)
        return self._heads[heads]

    # --------------------------------------------------------------------------- tables
    def _full_width(self, which: str, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(C, S)`` over all head channels in x's compute dtype: ``conj(z) x = x * C + swap(x) * S``
        (computed in that dtype, the result rounded to x's; keys and values are promoted inside the
        products, so no higher-precision copy of them lives through the loop over query views).

        ``which`` is "q" ``(B, H, N, d)`` or "k" ``(B, Vq, H, Nk, d)`` (H = 1 unless per head).
        """
        dtype = transform_dtype(x.dtype, self.precision)
        heads = 0 if self._per_head is None else x.shape[1]
        cache_key = (which, dtype, heads)
        if cache_key not in self._cache:
            query, key = self._tables(heads)
            re, im = query if which == "q" else key
            lead = (*re.shape[:-1], self.lead)
            C, S = torch.cat([re, re], -1), torch.cat([im, -im], -1)
            if self._order is not None:
                C, S = C[..., self._order.argsort()], S[..., self._order.argsort()]
            C = torch.cat([re.new_ones(lead), C], -1).to(dtype)
            S = torch.cat([im.new_zeros(lead), S], -1).to(dtype)
            self._cache[cache_key] = (C, S)
        return self._cache[cache_key]

    def _swap(self, x: Tensor) -> Tensor:
        """Each rotated channel replaced by its pair partner (the relative part's channels kept: S is 0 there)."""
        lead, tail = x[..., : self.lead], x[..., self.lead :]
        half = tail.shape[-1] // 2
        if self._order is None:
            return torch.cat([lead, tail[..., half:], tail[..., :half]], -1)
        tail = tail[..., self._order]
        return torch.cat([lead, torch.cat([tail[..., half:], tail[..., :half]], -1)[..., self._order.argsort()]], -1)

    def _relative_part(self, x: Tensor, which: str, query_view: int | None = None) -> Tensor:
        """x with the relative part's ``apply_<which>`` on its first ``lead`` channels (all tokens,
        or those of ``query_view``)."""
        if self.relative is None:
            return x
        rel = self.relative if query_view is None else self.relative.select_views([query_view])
        fn = {"q": rel.apply_q, "k": rel.apply_k, "v": rel.apply_v, "o": rel.apply_o}[which]
        return torch.cat([fn(x[..., : self.lead]), x[..., self.lead :]], -1)

    def _rows(self, query_view: int | None) -> slice:
        if query_view is None:
            return slice(None)
        if not 0 <= query_view < self.num_views:
            raise EncodingError(f"query_view must be in [0, {self.num_views}), got {query_view}")
        P = self.tokens_per_view
        return slice(query_view * P, (query_view + 1) * P)

    def _check(self, x: Tensor, tokens: int) -> None:
        check_prepared_input(x, self.batch_size, tokens, self.head_dim, self.device)

    def _rotate_q(self, x: Tensor, query_view: int | None, conjugate: bool) -> Tensor:
        rows = self._rows(query_view)
        self._check(x, self.num_tokens if query_view is None else self.tokens_per_view)
        with torch.autocast(x.device.type, enabled=False):
            C, S = self._full_width("q", x)
            C, S = C[:, :, rows], S[:, :, rows]
            y = x.to(C.dtype)  # converted once, so the gradient w.r.t. x is rounded once too
            return torch.addcmul(y * C, self._swap(y), S if conjugate else -S).to(x.dtype)

    # --------------------------------------------------------------------------- apply
    def apply_q(self, q: Tensor, query_view: int | None = None) -> Tensor:
        """``conj(z_i) q_i``; q ``(B, heads, N, d)``, or ``(B, heads, P, d)`` of one ``query_view``."""
        q = self._rotate_q(q, query_view, conjugate=True)
        return self._relative_part(q, "q", query_view)

    def apply_o(self, o: Tensor, query_view: int | None = None) -> Tensor:
        """``z_i o_i`` (o itself when values are not rotated); o shaped like :meth:`apply_q`'s input."""
        if not self.transform_values:
            self._rows(query_view)
            self._check(o, self.num_tokens if query_view is None else self.tokens_per_view)
            return o
        return self._relative_part(self._rotate_q(o, query_view, conjugate=False), "o", query_view)

    def apply_kv(self, k: Tensor, v: Tensor, query_view: int) -> tuple[Tensor, Tensor]:
        """``conj(z_j^(c)) k_j`` and ``conj(z_j^(c)) v_j`` (v itself when values are not rotated)
        for query view c; k, v ``(B, heads, Nk, d)``."""
        self._rows(query_view)
        self._check(k, self.num_keys)
        self._check(v, self.num_keys)
        k, v = self._relative_kv(k, v)
        return self._kv_in_frame(k, self._swap(k), v, self._swap(v), query_view)

    def apply_kv_own(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values each in its own view's frame, ``conj(z_j) k_j`` and ``conj(z_j) v_j``
        (what a query without a camera sees, :class:`hrope.MixedTokens`); k, v ``(B, heads, N, d)``."""
        self._check(k, self.num_tokens)
        self._check(v, self.num_tokens)
        k, v = self._relative_kv(k, v)
        k = self._rotate_q(k, None, conjugate=True)
        return k, (self._rotate_q(v, None, conjugate=True) if self.transform_values else v)

    def _relative_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The relative part's D_j^-1 on the keys and values (values only when they are transformed)."""
        if self.relative is None:
            return k, v
        return self._relative_part(k, "k"), (self._relative_part(v, "v") if self.transform_values else v)

    def _kv_in_frame(
        self, k: Tensor, k_swapped: Tensor, v: Tensor, v_swapped: Tensor, query_view: int
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(k.device.type, enabled=False):
            C, S = self._full_width("k", k)
            C, S = C[:, query_view], S[:, query_view]
            k_c = torch.addcmul(k * C, k_swapped, S).to(k.dtype)
            return k_c, (torch.addcmul(v * C, v_swapped, S).to(v.dtype) if self.transform_values else v)

    def _apply_kv_all(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values in every query frame, ``(B * Vq, heads, N, d)``."""
        with torch.autocast(k.device.type, enabled=False):
            C, S = self._full_width("k", k)
            k_all = torch.addcmul(k[:, None] * C, self._swap(k)[:, None], S).flatten(0, 1).to(k.dtype)
            if not self.transform_values:
                return k_all, v.repeat_interleave(self.num_views, dim=0)
            return k_all, torch.addcmul(v[:, None] * C, self._swap(v)[:, None], S).flatten(0, 1).to(v.dtype)

    # --------------------------------------------------------------------------- attention
    def attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype :meth:`attention` runs SDPA in for q, k, v of ``dtype``: the relative part's, else
        ``dtype`` (the coefficients scale each channel pair by a complex number: no amplified rounding)."""
        return dtype if self.relative is None else self.relative.attention_dtype(dtype)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        """Attention of the N queries over the Nk keys (self-attention: Nk = N), ``(B, heads, N, d)`` like SDPA.

        ``attn_mask`` must broadcast to ``(B, heads, N, Nk)``; ``is_causal=True`` is turned into
        the equivalent global ``(N, Nk)`` mask (causal over the whole sequence, top-left aligned).
        Computed in :meth:`attention_dtype` (the output rounded to q's dtype once)."""
        return attend_in(self.attention_dtype(q.dtype), self._attention, q, k, v, **sdpa_kwargs)

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        self._check(q, self.num_tokens)
        for x in (k, v):
            self._check(x, self.num_keys)
        mask = self._global_mask(q, sdpa_kwargs)
        q_rot = self.apply_q(q)
        k, v = self._relative_kv(k, v)
        if self.execution == "loop":
            out = torch.empty_like(q_rot)
            k_swapped, v_swapped = self._swap(k), self._swap(v)
            for c in range(self.num_views):
                rows = self._rows(c)
                mask_c = None if mask is None else (mask if mask.shape[-2] == 1 else mask[..., rows, :])
                args = (q_rot[:, :, rows], k, k_swapped, v, v_swapped, c, mask_c)
                if self.recompute and torch.is_grad_enabled():
                    out[:, :, rows] = checkpoint(self._view_attention, *args, use_reentrant=False, **sdpa_kwargs)
                else:
                    out[:, :, rows] = self._view_attention(*args, **sdpa_kwargs)
        else:
            B, H, N, d = q.shape
            V, P = self.num_views, self.tokens_per_view
            k_all, v_all = self._apply_kv_all(k, v)
            q_fold = q_rot.reshape(B, H, V, P, d).transpose(1, 2).reshape(B * V, H, P, d)
            out = F.scaled_dot_product_attention(
                q_fold, k_all, v_all, attn_mask=self._fold_mask(mask, B), **sdpa_kwargs
            )
            out = out.reshape(B, V, H, P, d).transpose(1, 2).reshape(B, H, N, d)
        return self.apply_o(out)

    def _view_attention(
        self,
        q_c: Tensor,
        k: Tensor,
        k_swapped: Tensor,
        v: Tensor,
        v_swapped: Tensor,
        query_view: int,
        mask: Tensor | None,
        **sdpa_kwargs: Any,
    ) -> Tensor:
        k_c, v_c = self._kv_in_frame(k, k_swapped, v, v_swapped, query_view)
        return F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, **sdpa_kwargs)

    def _global_mask(self, q: Tensor, sdpa_kwargs: dict[str, Any]) -> Tensor | None:
        mask: Tensor | None = sdpa_kwargs.pop("attn_mask", None)
        if sdpa_kwargs.pop("is_causal", False):
            if mask is not None:
                raise EncodingError("pass either attn_mask or is_causal, not both")
            mask = torch.ones(self.num_tokens, self.num_keys, dtype=torch.bool, device=q.device).tril()
        return mask

    def _fold_mask(self, mask: Tensor | None, B: int) -> Tensor | None:
        """A mask broadcastable to ``(B, h, N, Nk)`` -> ``(B * Vq, h, P, Nk)``."""
        if mask is None:
            return None
        while mask.ndim < 4:
            mask = mask[None]
        V, P, N, Nk = self.num_views, self.tokens_per_view, self.num_tokens, self.num_keys
        mask = mask.expand(B, mask.shape[1], N, Nk)
        return mask.reshape(B, -1, V, P, Nk).transpose(1, 2).reshape(B * V, -1, P, Nk)


# ----------------------------------------------------------------------------------- encoding
class QueryFrameEncoding(Encoding):
    """Base of the query-frame encodings: subclasses implement :meth:`key_coefficients`.

    Args:
        execution: ``"loop"`` (default; one SDPA call per query view, lower peak memory) or
            ``"fold"`` (views folded into the batch, one SDPA call). Both give the same result.
        recompute: with ``"loop"``, recompute each view's rotated K, V and SDPA in backward
            instead of saving them (saved memory no longer grows with V; costs one more SDPA
            forward).
        rotate_values: rotate v and the output too (default); False: q and k only.
    """

    query_frame = True
    param_shapes: ClassVar[dict[str, tuple[int, ...]]] = {}  # trailing shapes of params that are not (B, N)

    def __init__(self, execution: str = "loop", recompute: bool = False, rotate_values: bool = True) -> None:
        super().__init__()
        if execution not in EXECUTIONS:
            raise EncodingError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
        if recompute and execution != "loop":
            raise EncodingError("recompute=True needs execution='loop'")
        self.execution = execution
        self.recompute = recompute
        self.rotate_values = rotate_values

    def key_coefficients(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, dtype: torch.dtype, *args: Any, **params: Any
    ) -> tuple[Tensor, Tensor]:
        """Key coefficients ``(re, im)`` each ``(B, Vq, N, n <= head_dim/2)`` in ``dtype``, from the per-token
        params named by ``param_names`` (keywords, ``(B, V, P, ...)``); each subclass names what it takes."""
        raise NotImplementedError

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> QueryFrameTransform:
        """The subclass's params: rayrope ``log_depth``, ``log_depth_halfwidth`` ``(B, N)`` (and
        ``known_depth (B, N, 3)`` in its known-depth modes); urope none; worldrope ``depth``,
        ``depth_split`` ``(B, N)`` and ``depth_sigma (B, N, 2)``. No planes."""
        self.check_inputs(planes, params)
        if head_dim % 2:
            raise EncodingError(f"encoding {self.name!r} needs an even head_dim, got {head_dim}")
        grid = cast("tuple[int, int]", tuple(grid))  # a list is accepted too
        dtype = geometry_dtype(cameras.K.dtype)
        params = self.token_params(cameras, grid, params, dtype)
        re, im = self.key_coefficients(cameras, grid, head_dim, dtype, **params)
        re, im = pad_pairs(re, im, head_dim // 2)
        return QueryFrameTransform(
            re, im, grid, self.execution, self.recompute, self.rotate_values, precision=self.precision
        )

    def token_params(
        self, cameras: Cameras, grid: tuple[int, int], params: dict[str, Tensor], dtype: torch.dtype, what: str = ""
    ) -> dict[str, Tensor]:
        """Checked per-token params ``(B, N, ...)`` -> ``(B, V, P, ...)`` in ``dtype`` (``what`` names the set)."""
        self.check_inputs(None, params)
        prefix = f"{what}: " if what else ""
        return {
            name: per_token_param(value, cameras, grid, self.param_shapes.get(name, ()), prefix + name, dtype)
            for name, value in params.items()
        }

    def extra_repr(self) -> str:
        values = "" if self.rotate_values else ", rotate_values=False"
        return f"name={self.name!r}, execution={self.execution!r}, recompute={self.recompute}{values}"
