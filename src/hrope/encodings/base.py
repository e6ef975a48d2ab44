"""The shared machinery of the relative encodings: token inputs, block transforms and the Encoding base.

Every relative encoding gives token t an invertible block-diagonal transform D_t over each
head's channels and applies (DESIGN.md §3)

    q_i <- D_i^T q_i,   k_j <- D_j^-1 k_j,   v_j <- D_j^-1 v_j,   o_i <- D_i o_i

around one ``scaled_dot_product_attention`` call, so each logit is q_i^T (D_i D_j^-1) k_j.
Tokens are view-major, then row-major inside a view (x fastest): N = V * grid_h * grid_w.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cameras import Cameras
from . import fused_triton
from .banded import BandedOperator, RopeTables, banded_operator, banded_product, inverse_rope, is_small
from ..errors import EncodingError
from ..planes import Planes
from ..shapes import check_finite, check_shapes
from .layout import ROPE_BASE, HeadLayout, rope_tables
from .precision import attend_in, attention_dtype, check_precision, transform_dtype

__all__ = [
    "BACKENDS",
    "per_token_param",
    "check_prepared_input",
    "check_mask_options",
    "TokenTransform",
    "Encoding",
    "Prepared",
    "EncodingError",
]

# How a TokenTransform applies D: "torch" (banded.py's passes, every device), "triton" (the fused
# kernel, fused_triton.py: CUDA, or the CPU interpreter), "auto" (triton on CUDA when available).
BACKENDS = ("torch", "triton", "auto")
_T = TypeVar("_T")


def per_token_param(
    x: Tensor, cameras: Cameras, grid: tuple[int, int], trailing: tuple[int, ...], what: str, dtype: torch.dtype
) -> Tensor:
    """A per-token input ``x (B, N, *trailing)`` on the cameras' device, cast to ``dtype``, checked
    finite (unless ``torch.compile`` traces: :func:`hrope.errors.checking_values`), reshaped to
    ``(B, V, P, *trailing)``."""
    B, V, P = cameras.batch_size, cameras.num_views, grid[0] * grid[1]
    pattern = " ".join(["B N", *map(str, trailing)])
    check_shapes(
        {what: (x, pattern)},
        error=EncodingError,
        dims={"B": B, "N": V * P},
        device=cameras.device,
        floating=True,
        messages={"device": "{name} is on {device} but the cameras are on {expected}"},
    )
    x = x.to(dtype)
    check_finite({what: x}, error=EncodingError, message="{name} must be finite in {dtype} (found NaN or inf)")
    return x.reshape(B, V, P, *trailing)


# a prepared transform's input: one message for the shape, whatever is wrong with it
_PREPARED_SHAPE = "expected {expected} (the prepared B, N, head_dim), got {shape}"
_PREPARED_MESSAGES = {
    "type": _PREPARED_SHAPE,
    "shape": _PREPARED_SHAPE,
    "device": "transform prepared on {expected}, applied to a tensor on {device}",
    "floating": "expected a floating-point tensor, got {dtype}",
}


def check_prepared_input(x: Tensor, batch_size: int, tokens: int, head_dim: int, device: torch.device) -> None:
    """A prepared transform's input check: x ``(batch_size, heads, tokens, head_dim)``, floating
    point, on ``device`` (metadata only, no data pass); one-line :class:`EncodingError` otherwise."""
    check_shapes(
        {"x": (x, "B heads N head_dim")},
        error=EncodingError,
        dims={"B": batch_size, "N": tokens, "head_dim": head_dim},
        device=device,
        floating=True,
        messages=_PREPARED_MESSAGES,
    )


def check_mask_options(sdpa_kwargs: dict[str, Any]) -> None:
    """SDPA's ``attn_mask`` and ``is_causal`` are exclusive (one-line :class:`EncodingError`)."""
    if sdpa_kwargs.get("is_causal") and sdpa_kwargs.get("attn_mask") is not None:
        raise EncodingError("pass either attn_mask or is_causal, not both")


class Prepared:
    """An encoding bound to one set of cameras, grid and per-token parameters.

    Every prepared transform has ``batch_size``, ``device``, ``head_dim`` and ``num_tokens`` (the
    shape it applies to), ``query_frame`` (keys re-encoded per query view) and ``transform_values``.
    """

    query_frame: bool = False
    transform_values: bool = True
    batch_size: int
    device: torch.device

    if TYPE_CHECKING:  # subclasses hold these as attributes or properties

        @property
        def head_dim(self) -> int: ...

        @property
        def num_tokens(self) -> int: ...

        def apply_q(self, x: Tensor) -> Tensor: ...

        def apply_o(self, x: Tensor) -> Tensor: ...

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        """Encoded SDPA over all N tokens: q, k, v ``(B, heads, N, head_dim)`` -> ``(B, heads, N, head_dim)``."""
        raise NotImplementedError

    def attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype :meth:`attention` runs SDPA in for q, k, v of ``dtype`` (here: ``dtype``)."""
        return dtype


class TokenTransform(Prepared):
    """Precomputed block-diagonal D_t for every token; the precompute-then-apply object.

    Args:
        layout: the head layout.
        num_views, grid: N = num_views * grid_h * grid_w tokens.
        geo, geo_inv: ``(B, V, 1 or P, b, b)`` geometric blocks D and D^-1, per view (1) or per
            token (P), in the geometry dtype; None when the layout has no geometric blocks.
        batch_size, device: the batch B and the device the transform was prepared for.
        transform_values: False for encodings that act on q and k only (CaPE).
        backend: how D is applied (:data:`BACKENDS`): ``"torch"`` (default) the banded passes below,
            ``"triton"`` the fused kernel of :mod:`hrope.encodings.fused_triton` (one read and one
            write of x per tensor; CUDA, or Triton's CPU interpreter), ``"auto"`` the fused kernel
            for CUDA tensors when triton is installed, the banded passes otherwise. Same values up to
            float rounding; gradients reach the blocks either way.
        precision: what float16 / bfloat16 x is computed in (:data:`PRECISIONS`): ``"auto"`` (default;
            :meth:`attention` in :meth:`attention_dtype`) and ``"float32"`` transform in float32, the
            result rounded to x's dtype once, ``"input"`` in x's dtype.

    What it is applied to must have the prepared B, N and head_dim (any number of heads) and lie on
    the prepared device, else :class:`EncodingError` (shape and device checks only, no data pass).
    Any floating dtype is accepted and returned: float32 and float64 x are computed in their dtype,
    half-precision x as ``precision`` says (:func:`transform_dtype`; autocast is off inside).

    Applied as a banded product (:mod:`hrope.encodings.banded`): a few elementwise passes per
    tensor. The tables of D and D^-1 are built on first use (per compute dtype)
    and reused by every later forward call, D^T sharing D's: keep one object per batch for all
    layers. It holds them while it lives (for per-token b x b blocks about b * N * head_dim
    numbers each, whatever the number of heads); the backward pass rebuilds per-token tables
    from the saved blocks instead of keeping them for backward (per-view tables, which are small, it
    reuses). With geometry that needs gradients (learned planes), one object shared by layers under reentrant
    ``torch.utils.checkpoint`` fails (each layer's recomputation backpropagates through the shared
    blocks again): use ``use_reentrant=False`` or one object per checkpointed layer.

    ``apply_q``, ``apply_k``, ``apply_v`` and ``apply_o`` take ``(B, heads, N, head_dim)``.
    Tokens without a camera (registers, text): :class:`hrope.MixedTokens`; cross-attention between
    two token sets: :func:`hrope.cross_attention`; incremental decoding: :class:`hrope.KVCache`;
    a subset of the views (one chunk of a cache, one side of a cross-attention) with the blocks
    prepared over all views: :meth:`select_views`.
    """

    def __init__(
        self,
        layout: HeadLayout,
        num_views: int,
        grid: tuple[int, int],
        geo: Tensor | None = None,
        geo_inv: Tensor | None = None,
        *,
        batch_size: int,
        device: torch.device,
        transform_values: bool = True,
        rope_base: float = ROPE_BASE,
        backend: str = "torch",
        precision: str = "auto",
    ) -> None:
        if backend not in BACKENDS:
            raise EncodingError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        check_precision(precision)
        self.layout = layout
        self.backend = backend
        self.precision = precision
        self.rope_base = rope_base
        self.num_views = num_views
        self.grid = grid
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.transform_values = transform_values
        self._geo: dict[str, Tensor] = {}
        if geo is not None:
            self._geo.update(D=geo, D_inv=cast(Tensor, geo_inv))  # given together
        self._rope: RopeTables | None = None
        if layout.rope:
            grid_key = cast("tuple[int, int]", tuple(grid))  # hashable for the cache when given as a list
            self._rope = rope_tables(grid_key, layout.num_freqs, rope_base, self.device)
        self._cache: dict[tuple[Any, ...], Any] = {}

    def geometric_blocks(self) -> tuple[Tensor, Tensor] | None:
        """The geometric blocks ``(D, D^-1)``, each ``(B, V, 1 or P, b, b)``, or None."""
        if not self._geo:
            return None
        return self._geo["D"], self._geo["D_inv"]

    @property
    def num_tokens(self) -> int:
        return self.num_views * self.grid[0] * self.grid[1]

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    def select_views(self, views: Sequence[int]) -> TokenTransform:
        """The transform of the views ``views`` (a list of view indices, in the new order), sharing
        this one's blocks: what preparing those views alone gives, except where D depends on all
        the cameras (``hrope``'s default ``gauge="centroid"``), which keeps this transform's gauge."""
        views = list(views) if isinstance(views, (list, tuple, range)) else views
        if (
            not isinstance(views, list)
            or not views
            or not all(isinstance(c, int) and 0 <= c < self.num_views for c in views)
        ):
            got = views if isinstance(views, list) else type(views).__name__
            raise EncodingError(f"views must be a non-empty list of view indices in [0, {self.num_views}), got {got}")
        blocks = self.geometric_blocks()
        geo = () if blocks is None else tuple(b[:, views] for b in blocks)
        return TokenTransform(
            self.layout,
            len(views),
            self.grid,
            *geo,
            batch_size=self.batch_size,
            device=self.device,
            transform_values=self.transform_values,
            rope_base=self.rope_base,
            backend=self.backend,
            precision=self.precision,
        )

    # --------------------------------------------------------------------------- apply
    def apply_q(self, x: Tensor) -> Tensor:
        """``D_i^T q_i`` (queries): x ``(B, heads, N, head_dim)`` -> same shape."""
        return self._apply(x, "D", transpose=True)

    def apply_k(self, x: Tensor) -> Tensor:
        """``D_j^-1 k_j`` (keys): x ``(B, heads, N, head_dim)`` -> same shape."""
        return self._apply(x, "D_inv")

    def apply_v(self, x: Tensor) -> Tensor:
        """``D_j^-1 v_j`` (values; identity when values are not transformed): x ``(B, heads, N, head_dim)``
        -> same shape."""
        return self._apply(x, "D_inv") if self.transform_values else x

    def apply_o(self, x: Tensor) -> Tensor:
        """``D_i o_i`` (attention outputs; identity when values are not transformed): x
        ``(B, heads, N, head_dim)`` -> same shape."""
        return self._apply(x, "D") if self.transform_values else x

    def attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype :meth:`attention` runs SDPA in for q, k, v of ``dtype``: float32 for half-precision
        ones under ``"auto"`` when D has geometric blocks (they can amplify rounding), else ``dtype``."""
        return attention_dtype(dtype, self.precision, amplifies=bool(self._geo))

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        """``apply_o(sdpa(apply_q(q), apply_k(k), apply_v(v)))``, logits q_i^T D_i D_j^-1 k_j: q, k, v
        ``(B, heads, N, head_dim)`` -> ``(B, heads, N, head_dim)``; ``sdpa_kwargs`` go to SDPA.
        Computed in :meth:`attention_dtype` (the output rounded to q's dtype once)."""
        check_mask_options(sdpa_kwargs)  # as QueryFrameTransform
        return attend_in(self.attention_dtype(q.dtype), self._attention, q, k, v, **sdpa_kwargs)

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        # temporaries only: the encoded q, k, v are freed before apply_o allocates (no fresh pages)
        out = F.scaled_dot_product_attention(self.apply_q(q), *self._keys_values(k, v), **sdpa_kwargs)
        return self.apply_o(out)

    def _keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_k(k), apply_v(v)``; small k and v alike go through one pass (concatenated over
        heads), which halves the per-op overhead that dominates their cost."""
        if (
            self.transform_values
            and isinstance(k, Tensor)
            and isinstance(v, Tensor)
            and k.shape == v.shape
            and k.dtype == v.dtype
            and is_small(k)
        ):
            check_prepared_input(k, self.batch_size, self.num_tokens, self.head_dim, self.device)  # names k's shape
            keys, values = self.apply_k(torch.cat([k, v], 1)).chunk(2, 1)
            return keys, values
        return self.apply_k(k), self.apply_v(v)

    def _cached(self, key: tuple[Any, ...], make: Callable[[], _T]) -> _T:
        """``make()`` on the first call with ``key``, the stored value after."""
        if key not in self._cache:
            self._cache[key] = make()
        return cast(_T, self._cache[key])

    def _inputs(self, which: str, dtype: torch.dtype) -> tuple[Tensor | None, RopeTables | None]:
        """The blocks and RoPE tables of ``which`` ("D" or "D_inv") in ``dtype`` (cached; a cast made
        under no_grad is not reused where gradients must reach the blocks)."""
        blocks: Tensor | None = None
        if which in self._geo:
            blocks = self._cached(
                ("blocks", which, dtype, torch.is_grad_enabled()), lambda: self._geo[which].to(dtype=dtype)
            )
        rope: RopeTables | None = None
        if (tables := self._rope) is not None:
            rope = self._cached(("rope", dtype), lambda: _cast_rope(tables, dtype))
            if which == "D_inv":
                rope = inverse_rope(rope)
        return blocks, rope

    def _apply(self, x: Tensor, which: str, transpose: bool = False) -> Tensor:
        """D x ("D"), D^T x ("D", transpose) or D^-1 x ("D_inv") for x ``(B, heads, N, head_dim)``.

        The banded operator of D and of D^-1 is built once per compute dtype and reused by every
        forward call (D^T shares D's tables); gradients reach the blocks through banded_product,
        whose backward rebuilds its transposed tables from the blocks. Both backends take x in its
        dtype with the tables in the compute dtype and return x's dtype."""
        layout = self.layout
        check_prepared_input(x, self.batch_size, self.num_tokens, layout.head_dim, self.device)
        if not layout.num_blocks and not layout.rope:
            return x
        with torch.autocast(x.device.type, enabled=False):
            dtype = transform_dtype(x.dtype, self.precision)
            blocks, rope = self._inputs(which, dtype)
            x = x.unflatten(-2, (self.num_views, -1))  # type: ignore[no-untyped-call]
            if self._fused(x):
                if transpose:
                    blocks, rope = _transposed(blocks, rope)
                return fused_triton.fused_banded_product(x, blocks, layout.num_blocks, rope).flatten(-3, -2)

            def build() -> BandedOperator:
                with torch.no_grad():
                    return banded_operator(blocks, layout.num_blocks, rope, layout.head_dim)

            operator = self._cached(("operator", which, dtype), build)
            if transpose:
                operator = operator.transpose()
                blocks, rope = _transposed(blocks, rope)
            y = banded_product(x, blocks, layout.num_blocks, rope, operator)
        return y.flatten(-3, -2)

    def _fused(self, x: Tensor) -> bool:
        """Whether D is applied to ``x`` by the fused Triton kernel (see ``backend``)."""
        if self.backend == "auto":
            return x.is_cuda and fused_triton.is_available()
        return self.backend == "triton"


def _cast_rope(rope: RopeTables, dtype: torch.dtype) -> RopeTables:
    """RoPE tables in ``dtype``."""
    cos, plus, minus = (t.to(dtype=dtype) for t in rope)
    return cos, plus, minus


def _transposed(blocks: Tensor | None, rope: RopeTables | None) -> tuple[Tensor | None, RopeTables | None]:
    """The blocks and RoPE tables of D^T from those of D: M^T per block, R(-θ)."""
    return (None if blocks is None else blocks.mT), (None if rope is None else inverse_rope(rope))


class Encoding(nn.Module):
    """Base class of every registered encoding (an ``nn.Module`` so learnable options train).

    ``prepare(cameras, grid, head_dim, planes=None, **params)`` binds the encoding to one batch
    and returns a :class:`Prepared` (a :class:`TokenTransform` for relative encodings).
    """

    # Facts about an encoding, read by the toolkit and the tests instead of checks on its name.
    name: ClassVar[str] = ""
    needs_planes: ClassVar[bool] = False  # prepare needs planes=hrope.Planes(...)
    param_names: tuple[str, ...] = ()  # the per-token params prepare needs (hrope's depend on its options)
    data_param_names: tuple[str, ...] = ()  # those of param_names fed from data (e.g. known depth), not predicted
    query_frame: ClassVar[bool] = False  # keys re-encoded per query view (QueryFrameTransform)
    encodes_pose: ClassVar[bool] = True  # attention sees the relative camera pose (else tokens need world rays)
    transform_values: ClassVar[bool] = True  # v and the output are transformed too (False: q and k only)
    neutral_planes: ClassVar[str | None] = None  # planes at zero learned output: "infinity" or "fronto-parallel"
    planes_in_front: ClassVar[bool] = False  # every plane must cross its patch-centre ray in front of the camera
    transform_kind: ClassVar[str | None] = None  # the ``transform`` param: "rigid" or "invertible" (any GL(4))
    # The part of D_t shared by every token of a view (hrope.nn folds it into the projection weights):
    # "blocks": the whole geometric block, D_t = blockdiag(G_c tiles, I, R_t); "left": a left factor of
    # per-token blocks, D_t = blockdiag(G_c A_t tiles, I, R_t), G_c from view_factor; None: nothing.
    per_view: ClassVar[str | None] = None

    @classmethod
    def takes_token_inputs(cls) -> bool:
        """Whether ``prepare`` needs per-token planes or params."""
        return cls.needs_planes or bool(cls.param_names)

    def __init__(self, rope_base: float = ROPE_BASE) -> None:
        super().__init__()
        self.rope_base = rope_base
        self.backend = "torch"
        self.precision = "auto"

    def use_backend(self, backend: str) -> Encoding:
        """Apply this encoding's transforms with ``backend`` (:data:`BACKENDS`; default ``"torch"``);
        returns the encoding. Query-frame encodings have one backend and accept only ``"torch"``
        and ``"auto"``."""
        if backend not in BACKENDS or (self.query_frame and backend == "triton"):
            accepted = ", ".join(b for b in BACKENDS if not (self.query_frame and b == "triton"))
            raise EncodingError(f"encoding {self.name!r}: backend must be one of {accepted}, got {backend!r}")
        self.backend = backend
        return self

    def use_precision(self, precision: str) -> Encoding:
        """Compute float16 / bfloat16 q, k, v in ``precision`` (:data:`PRECISIONS`, docs/encodings.md
        "Numerics in half precision"); returns the encoding. ``"auto"`` (default): transforms in
        float32, and SDPA too where they have geometric blocks (all but ``none``, ``rope2d``,
        ``rayrope``, ``urope``, ``worldrope``); ``"float32"``: transforms in float32, SDPA in the
        tensors' dtype; ``"input"``: all in the tensors' dtype. float32 / float64: their own dtype."""
        check_precision(precision)
        self.precision = precision
        return self

    def token_transform(
        self,
        layout: HeadLayout,
        cameras: Cameras,
        grid: tuple[int, int],
        geo: Tensor | None = None,
        geo_inv: Tensor | None = None,
    ) -> TokenTransform:
        """A :class:`TokenTransform` over ``cameras``' views with this encoding's RoPE base,
        ``transform_values``, backend and precision."""
        return TokenTransform(
            layout,
            cameras.num_views,
            grid,
            geo,
            geo_inv,
            batch_size=cameras.batch_size,
            device=cameras.device,
            rope_base=self.rope_base,
            transform_values=self.transform_values,
            backend=self.backend,
            precision=self.precision,
        )

    def prepare(
        self, cameras: Cameras, grid: tuple[int, int], head_dim: int, planes: Planes | None = None, **params: Tensor
    ) -> Prepared:
        """Bind the encoding to one batch of N = V * grid_h * grid_w tokens (view-major).

        Args:
            cameras: :class:`hrope.Cameras` ``(B, V)``.
            grid: ``(grid_h, grid_w)`` patches per view.
            head_dim: channels per attention head.
            planes: :class:`hrope.Planes` ``(B, N)``, one plane per token, for encodings with
                ``needs_planes``; otherwise None.
            **params: the per-token inputs named by ``param_names``, e.g. ``depth (B, N)``,
                ``rotation (B, N, 3, 3)``, ``transform (B, N, 4, 4)``, or the query-frame
                encodings' ``log_depth``, ``depth_split``, ... (unknown or missing names raise).

        Returns:
            A :class:`TokenTransform` (the D_t of every token) for the relative encodings, a
            :class:`~hrope.encodings.query_frame.QueryFrameTransform` for ``rayrope``, ``urope``
            and ``worldrope``.
        """
        raise NotImplementedError

    def view_factor(self, cameras: Cameras) -> tuple[Tensor, Tensor]:
        """G_c and G_c^-1 ``(B, V, b, b)`` in the geometry dtype, the per-view left factor of the
        geometric blocks of an encoding with ``per_view == "left"`` (D_t = G_c A_t)."""
        raise EncodingError(f"encoding {self.name!r} has no per-view left factor (per_view={self.per_view!r})")

    def rank_one_rest(self, cameras: Cameras, grid: tuple[int, int], planes: Planes) -> tuple[Tensor, Tensor]:
        """ĉ_c ``(B, V, b)`` and u_t ``(B, V, P, b)`` in the geometry dtype, the per-token rest
        A_t = I - ĉ_c u_t^T (with u_t^T ĉ_c = 0) left of :meth:`view_factor` by an encoding with
        ``per_view == "left"``."""
        raise EncodingError(f"encoding {self.name!r} has no rank-one rest (per_view={self.per_view!r})")

    def check_inputs(self, planes: Planes | None, params: dict[str, Tensor]) -> None:
        """Clear errors for missing planes and missing or unknown per-token parameters."""
        if self.needs_planes and planes is None:
            raise EncodingError(f"encoding {self.name!r} needs planes=hrope.Planes(...)")
        if planes is not None and not isinstance(planes, Planes):
            raise EncodingError(
                f"planes must be hrope.Planes (Planes(normal, depth) or Planes.from_m(m)), got {type(planes).__name__}"
            )
        unknown = set(params) - set(self.param_names)
        if unknown:
            accepted = ", ".join(self.param_names) or "none"
            raise EncodingError(f"encoding {self.name!r} got unknown params {sorted(unknown)}; accepts: {accepted}")
        missing = [p for p in self.param_names if params.get(p) is None]
        if missing:
            raise EncodingError(f"encoding {self.name!r} needs params {missing}")

    def extra_repr(self) -> str:
        return f"name={self.name!r}"
