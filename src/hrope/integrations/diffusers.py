"""hrope encodings inside diffusers' attention (``pip install 'hrope[diffusers]'``).

:class:`MultiViewAttnProcessor` is an attention processor for
``diffusers.models.attention_processor.Attention`` that runs diffusers' ``AttnProcessor2_0``
step for step (norms, projections, mask, output projection, residual) with an hrope encoding
applied to q, k, v and the output. Self-attention (no ``encoder_hidden_states``) is
:func:`hrope.multiview_attention` over one token set; cross-attention is
:func:`hrope.cross_attention`: queries from ``hidden_states`` (say the target views), keys and
values from ``encoder_hidden_states`` (the reference views), each set with its own cameras, as
in EscherNet.

Geometry travels in ``cross_attention_kwargs``, which ``UNet2DConditionModel``,
``Transformer2DModel`` and ``BasicTransformerBlock`` forward to every attention layer:
``geometry`` describes the tokens of ``hidden_states``, ``encoder_geometry`` those of
``encoder_hidden_states`` (None: tokens without cameras, e.g. text). Each is a
:class:`TokenGeometry`, some views of a :class:`SceneGeometry` that holds every camera of the
batch, or a list of them, one per resolution of a U-Net (the one whose token count matches the
sequence is used)::

    scene = SceneGeometry(cameras, grid, planes=planes)      # references 0..R-1, targets R..V-1
    model.set_attn_processor(MultiViewAttnProcessor("hrope"))   # or set_processor(model, ...)
    model(..., cross_attention_kwargs={"geometry": scene.tokens(targets),
                                       "encoder_geometry": scene.tokens(references)})

A scene prepares each encoding once and shares it across layers and token sets
(:meth:`hrope.TokenTransform.select_views`), so both sides of a cross-attention live in one
gauge (``hrope``'s centroid gauge depends on all cameras): build one per forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor, nn

try:
    from diffusers.models.attention_processor import Attention
except ImportError as error:  # the extra is not installed
    raise ImportError("hrope.integrations.diffusers needs diffusers: pip install 'hrope[diffusers]'") from error

from ..attention import cross_attention
from ..cameras import Cameras
from ..encodings import Encoding, EncodingError, Prepared, TokenTransform, get_encoding
from ..planes import Planes
from ..tokens import CameraTokens, MixedTokens, camera_positions

__all__ = ["SceneGeometry", "TokenGeometry", "MultiViewAttnProcessor", "set_processor"]


class SceneGeometry:
    """Every view of a batch: ``cameras`` ``(B, V)``, ``grid`` patches per view, and the
    encoding's per-token ``planes`` / ``params`` over all V * grid_h * grid_w tokens (view-major).

    :meth:`tokens` names the token sets of a model's sequences; the encoding is prepared once per
    (encoding, head_dim, float64 or not) on first use, over all V views.
    """

    def __init__(
        self,
        cameras: Cameras,
        grid: tuple[int, int],
        planes: Planes | None = None,
        params: dict[str, Tensor] | None = None,
    ) -> None:
        if not isinstance(cameras, Cameras):
            raise EncodingError(f"SceneGeometry: cameras must be hrope.Cameras, got {type(cameras).__name__}")
        if len(grid) != 2 or not all(isinstance(g, int) and g > 0 for g in grid):
            raise EncodingError(f"SceneGeometry: grid must be (grid_h, grid_w) with positive ints, got {grid}")
        self.cameras, self.planes, self.params = cameras, planes, dict(params or {})
        self.grid = cast("tuple[int, int]", tuple(grid))
        self._prepared: dict[tuple[Encoding, int, bool], Prepared] = {}

    @property
    def num_views(self) -> int:
        return self.cameras.num_views

    def prepare(self, encoding: Encoding, head_dim: int, dtype: torch.dtype) -> Prepared:
        """``encoding`` prepared over all views (geometry in float64 for float64 ``dtype``, as
        :func:`hrope.multiview_attention`), cached."""
        key = (encoding, head_dim, dtype == torch.float64)
        if key not in self._prepared:
            cameras = self.cameras
            if dtype == torch.float64 and cameras.K.dtype != torch.float64:
                cameras = cameras.to(dtype=torch.float64)
            self._prepared[key] = encoding.prepare(cameras, self.grid, head_dim, planes=self.planes, **self.params)
        return self._prepared[key]

    def tokens(
        self,
        views: Sequence[int] | None = None,
        *,
        camera_tokens: CameraTokens | None = None,
        length: int | None = None,
    ) -> TokenGeometry:
        """The token set of ``views`` (view indices in token order; None: all views).

        ``camera_tokens`` and ``length``: where the len(views) * grid_h * grid_w camera tokens sit
        in a sequence of ``length`` tokens with others (registers, text: identity), as
        :class:`hrope.MixedTokens` takes them; without them the sequence is the camera tokens."""
        views = list(range(self.num_views)) if views is None else views
        if not (
            isinstance(views, (list, tuple, range))
            and views
            and all(isinstance(c, int) and 0 <= c < self.num_views for c in views)
        ):
            raise EncodingError(
                f"views must be None or a non-empty list of view indices in [0, {self.num_views}), got {views!r}"
            )
        count = len(views) * self.grid[0] * self.grid[1]
        if (camera_tokens is None) != (length is None):
            raise EncodingError(
                "camera_tokens and length go together: give both (camera tokens among other "
                f"tokens) or neither, got camera_tokens={camera_tokens!r}, length={length!r}"
            )
        if length is not None and camera_tokens is not None:  # both or neither (above)
            if not isinstance(length, int) or length < count:
                raise EncodingError(f"length must be an int of at least the {count} camera tokens, got {length!r}")
            camera_positions(camera_tokens, length, count)  # one-line EncodingError for a bad layout
        return TokenGeometry(self, list(views), camera_tokens, count if length is None else length)


class TokenGeometry:
    """The tokens of one sequence: some views of a :class:`SceneGeometry` (made by
    :meth:`SceneGeometry.tokens`), ``num_tokens`` long, with the camera layout of its tokens."""

    def __init__(
        self, scene: SceneGeometry, views: list[int], camera_tokens: CameraTokens | None, num_tokens: int
    ) -> None:
        self.scene, self.views, self.camera_tokens, self.num_tokens = scene, views, camera_tokens, num_tokens
        self._transforms: dict[tuple[Encoding, int, bool], Prepared] = {}

    def transform(self, encoding: Encoding, head_dim: int, dtype: torch.dtype) -> Prepared:
        """The prepared transform of these tokens: the scene's, restricted to ``views`` and placed
        among the identity tokens (cached, so every layer reuses its tables)."""
        key = (encoding, head_dim, dtype == torch.float64)
        if key not in self._transforms:
            prepared = self.scene.prepare(encoding, head_dim, dtype)
            if self.views != list(range(self.scene.num_views)):
                if prepared.query_frame:
                    raise EncodingError(
                        f"encoding {encoding.name!r} re-encodes keys per query view, so a token set "
                        f"of some views ({self.views}) of a scene is undefined; build a SceneGeometry "
                        "of those views"
                    )
                prepared = cast(TokenTransform, prepared).select_views(self.views)  # a relative encoding's
            if self.camera_tokens is not None:
                prepared = MixedTokens(prepared, self.camera_tokens, self.num_tokens)
            self._transforms[key] = prepared
        return self._transforms[key]


def _select(geometry: object, x: Tensor, kwarg: str) -> TokenGeometry | None:
    """The :class:`TokenGeometry` of the sequence x ``(B, heads, L, d)`` among ``geometry`` (one, a
    list or tuple of them, one per resolution, or None), checked against x's batch."""
    if geometry is None:
        return None
    options = geometry if isinstance(geometry, (list, tuple)) else [geometry]
    if not options or not all(isinstance(g, TokenGeometry) for g in options):
        got = [type(g).__name__ for g in options] if isinstance(geometry, (list, tuple)) else type(geometry).__name__
        raise EncodingError(
            f"cross_attention_kwargs {kwarg!r} must be a TokenGeometry (SceneGeometry.tokens(...)) "
            f"or a list of them, one per resolution; got {got}"
        )
    geometries = cast("Sequence[TokenGeometry]", options)  # checked above
    batch, length = x.shape[0], x.shape[2]
    matching = [g for g in geometries if g.num_tokens == length]
    if len(matching) != 1:
        counts = [g.num_tokens for g in geometries]
        what = "no" if not matching else "more than one"
        raise EncodingError(
            f"cross_attention_kwargs {kwarg!r}: {what} TokenGeometry for a sequence of {length} tokens "
            f"(given: {counts} tokens); give one per resolution"
        )
    cameras_batch = matching[0].scene.cameras.batch_size
    if cameras_batch != batch:
        raise EncodingError(
            f"cross_attention_kwargs {kwarg!r}: cameras have batch {cameras_batch}, the hidden states "
            f"{batch}; give one set of cameras per sample"
        )
    return matching[0]


class MultiViewAttnProcessor(nn.Module):
    """A diffusers attention processor that applies ``encoding`` (a registry name or an
    :class:`hrope.Encoding`; an ``nn.Module`` here, so learnable options train with the model).

    Called by ``Attention`` as ``processor(attn, hidden_states, encoder_hidden_states=None,
    attention_mask=None, temb=None, geometry=..., encoder_geometry=...)``; the last two come from
    ``cross_attention_kwargs`` (module docstring). Self-attention needs ``geometry``;
    cross-attention needs at least one of the two (a missing side is identity). Everything else
    is ``AttnProcessor2_0``'s: with ``encoding="none"`` the outputs are identical. Query-frame
    encodings (rayrope, urope, worldrope) work in self-attention over all of a scene's views only.
    """

    def __init__(self, encoding: str | Encoding) -> None:
        super().__init__()
        self.encoding = get_encoding(encoding)

    def __call__(
        self,
        attn: Attention,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        temb: Tensor | None = None,
        geometry: TokenGeometry | Sequence[TokenGeometry] | None = None,
        encoder_geometry: TokenGeometry | Sequence[TokenGeometry] | None = None,
    ) -> Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        keys_from = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch_size, sequence_length, _ = keys_from.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        is_cross = encoder_hidden_states is not None
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key, value = attn.to_k(encoder_hidden_states), attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads
        query, key, value = (x.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2) for x in (query, key, value))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        hidden_states = self.attention(query, key, value, attention_mask, is_cross, geometry, encoder_geometry)

        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))  # linear projection, dropout
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_cross: bool,
        geometry: TokenGeometry | Sequence[TokenGeometry] | None = None,
        encoder_geometry: TokenGeometry | Sequence[TokenGeometry] | None = None,
    ) -> Tensor:
        """Encoded SDPA of q ``(B, heads, Lq, d)`` over k, v ``(B, heads, Lk, d)`` (diffusers' mask)."""
        head_dim, dtype = q.shape[-1], q.dtype
        query = _select(geometry, q, "geometry")
        if not is_cross:
            if query is None:
                raise EncodingError(
                    "MultiViewAttnProcessor: self-attention needs cross_attention_kwargs "
                    "{'geometry': SceneGeometry(...).tokens(...)}"
                )
            return query.transform(self.encoding, head_dim, dtype).attention(q, k, v, attn_mask=mask)
        key = _select(encoder_geometry, k, "encoder_geometry")
        if query is None and key is None:
            raise EncodingError(
                "MultiViewAttnProcessor: cross-attention needs cross_attention_kwargs 'geometry' "
                "(the queries' tokens), 'encoder_geometry' (the keys' tokens) or both"
            )
        transforms = [None if g is None else g.transform(self.encoding, head_dim, dtype) for g in (query, key)]
        return cross_attention(q, k, v, query=transforms[0], key=transforms[1], attn_mask=mask)


def set_processor(module: nn.Module, processor: Callable[..., Tensor]) -> int:
    """``processor`` on every diffusers ``Attention`` inside ``module`` (models of one's own built
    from diffusers' blocks); returns how many. diffusers' models also have ``set_attn_processor``."""
    layers = [m for m in module.modules() if isinstance(m, Attention)]
    for layer in layers:
        layer.set_processor(processor)  # type: ignore[arg-type]  # diffusers annotates its own AttnProcessor only
    return len(layers)
