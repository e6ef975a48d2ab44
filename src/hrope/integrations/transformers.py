"""hrope's encodings as a Hugging Face ``transformers`` attention implementation (``hrope[transformers]``).

Importing this module registers the attention function :func:`attention_forward` under the name
``"hrope"`` (:data:`NAME`) in ``transformers.AttentionInterface``, with transformers' SDPA masks
(``AttentionMaskInterface``). Build a model with ``attn_implementation="hrope"`` (or
``model.set_attn_implementation("hrope")``) and pass the cameras of each call as a
:class:`Geometry`::

    geometry = Geometry("hrope", cameras, grid, planes=planes, camera_tokens=mask)
    out = model(pixel_values, hrope_geometry=geometry)        # every layer reuses one prepared transform
    with geometry:                                             # generate() refuses unknown kwargs
        ids = model.generate(inputs_embeds=embeds, max_new_tokens=8)

The attention function gets the model's q ``(B, heads, L, d)`` and k, v ``(B, heads_kv, T, d)``
(after the model's own rotary embedding, if it has one), encodes them with the geometry's
transform and runs one SDPA call with the model's mask, dropout and scaling. Keys and values
are stored in transformers' cache as the model computes them; every call encodes all T keys
(an O(T) transform per layer, like the SDPA call itself), and the L queries are the last L of the
T positions (a full forward: L = T; ``DynamicCache`` decoding: the new tokens). Static and
sliding-window caches are not supported.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any, cast

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..attention import cross_attention
from ..cameras import Cameras
from ..encodings import Encoding, EncodingError, Prepared, get_encoding
from ..planes import Planes
from ..tokens import CameraTokens, MixedTokens, camera_positions

__all__ = ["NAME", "KWARG", "Geometry", "attention_forward", "SDPA_GROUPS_HEADS"]

# SDPA groups key / value heads itself (enable_gqa) from torch 2.5; before, they are repeated to the
# query heads (before the encoding or after it alike: it transforms every head the same way)
SDPA_GROUPS_HEADS = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)

NAME = "hrope"  # attn_implementation
KWARG = "hrope_geometry"  # the model-call keyword argument
_ACTIVE: ContextVar[Geometry | None] = ContextVar("hrope_geometry", default=None)


class Geometry:
    """The cameras of one model call: what ``hrope.multiview_attention`` takes besides q, k, v.

    Args:
        encoding: a registry name or an :class:`~hrope.Encoding` instance (keep the instance
            of an encoding with learnable options in your model).
        cameras: :class:`hrope.Cameras` ``(B, V)``, one set per sample of the batch.
        grid: ``(grid_h, grid_w)`` patches per view.
        planes, params: the encoding's per-token inputs ``(B, V * grid_h * grid_w, ...)``.
        camera_tokens: None (the model's sequence is exactly the V * grid_h * grid_w camera
            tokens, view-major), or where they sit in the sequence (a slice, integer positions or
            a boolean mask, as :class:`hrope.MixedTokens`); the other tokens (cls, registers,
            text) get the identity. Read against the first sequence the geometry sees (the
            prompt, when generating); the camera tokens keep those positions as tokens are added.

    Pass it as ``hrope_geometry=`` to the model call, or enter it (``with geometry:``) around
    calls that cannot take the keyword (``generate``). One geometry per model call or generation:
    it prepares the transform once (per head_dim) and every layer reuses it.
    """

    def __init__(
        self,
        encoding: str | Encoding,
        cameras: Cameras,
        grid: tuple[int, int],
        planes: Planes | None = None,
        params: dict[str, Tensor] | None = None,
        camera_tokens: CameraTokens | None = None,
    ) -> None:
        if not isinstance(cameras, Cameras):
            raise EncodingError(f"Geometry: cameras must be hrope.Cameras, got {type(cameras).__name__}")
        if len(grid) != 2 or not all(isinstance(g, int) and g > 0 for g in grid):
            raise EncodingError(f"Geometry: grid must be (grid_h, grid_w) with positive ints, got {grid!r}")
        self.encoding = get_encoding(encoding)
        self.cameras, self.planes, self.params = cameras, planes, dict(params or {})
        self.grid = cast("tuple[int, int]", tuple(grid))
        self.camera_tokens = camera_tokens
        self._prepared: dict[tuple[int, bool], Prepared] = {}
        self._positions: list[int] | None = None
        self._mixed: tuple[tuple[int, int, bool], MixedTokens] | None = None
        self._tokens: list[Token[Geometry | None]] = []

    def prepared(self, head_dim: int, dtype: torch.dtype) -> Prepared:
        """The encoding prepared over the camera tokens (once per head_dim; float64 geometry for float64 q)."""
        key = (head_dim, dtype == torch.float64)
        if key not in self._prepared:
            cameras = self.cameras.to(dtype=torch.float64) if key[1] else self.cameras
            self._prepared[key] = self.encoding.prepare(cameras, self.grid, head_dim, planes=self.planes, **self.params)
        return self._prepared[key]

    def transform(self, length: int, head_dim: int, dtype: torch.dtype) -> Prepared:
        """The transform of a sequence of ``length`` tokens: the prepared one, or a
        :class:`~hrope.MixedTokens` over it with the camera tokens at their positions."""
        prepared = self.prepared(head_dim, dtype)
        if self.camera_tokens is None:
            return prepared
        if self._positions is None:
            self._positions = camera_positions(self.camera_tokens, length, prepared.num_tokens)
        key = (length, head_dim, dtype == torch.float64)
        if self._mixed is None or self._mixed[0] != key:  # the latest only: decoding grows the length by one
            self._mixed = key, MixedTokens(prepared, self._positions, length)
        return self._mixed[1]

    def has_camera_tokens_from(self, start: int) -> bool:
        """Whether a camera token sits at sequence position ``start`` or later (after :meth:`transform`)."""
        return self._positions is None or max(self._positions) >= start

    def __enter__(self) -> Geometry:
        self._tokens.append(_ACTIVE.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._tokens.pop())


def _call_geometry(kwargs: dict[str, Any]) -> Geometry:
    """The :class:`Geometry` of an attention call (its ``hrope_geometry`` keyword, else the innermost
    ``with geometry:``); an :class:`EncodingError` without one, or for options it cannot apply."""
    geometry = kwargs.get(KWARG)
    geometry = _ACTIVE.get() if geometry is None else geometry
    if not isinstance(geometry, Geometry):
        got = "nothing" if geometry is None else type(geometry).__name__
        raise EncodingError(
            f"attn_implementation={NAME!r} needs {KWARG}=hrope.integrations.transformers.Geometry(...) "
            f"in the model call (or `with geometry:` around it), got {got}"
        )
    for option in ("softcap", "position_bias"):
        if kwargs.get(option) is not None:
            raise EncodingError(f"attn_implementation={NAME!r} takes no {option} (use a model without it)")
    return geometry


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: q ``(B, heads, L, d)``, k and v
    ``(B, heads_kv, T, d)`` -> ``((B, L, heads, d), None)``, encoded with the call's :class:`Geometry`.

    The geometry comes from the ``hrope_geometry`` keyword of the model call, else from the
    innermost ``with geometry:``. ``attention_mask`` (transformers' SDPA mask), ``dropout``,
    ``scaling`` and causality (``is_causal``, else the module's ``is_causal``, for L > 1
    without a mask, as transformers' ``sdpa``) go to SDPA; grouped-query heads are encoded
    before SDPA groups them (``enable_gqa``).
    """
    geometry = _call_geometry(kwargs)
    L, T = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    sdpa: dict[str, Any] = dict(
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(L > 1 and attention_mask is None and causal),
    )
    if key.shape[1] != query.shape[1] and SDPA_GROUPS_HEADS:
        sdpa["enable_gqa"] = True
    elif key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    transform = geometry.transform(T, query.shape[-1], query.dtype)
    if L == T:
        out = transform.attention(query, key, value, **sdpa)
    else:  # new tokens over cached ones: text after the frames, identity queries over the encoded keys
        if transform.query_frame:
            raise EncodingError(
                f"attn_implementation={NAME!r}: query-frame encodings ({geometry.encoding.name}) "
                "re-encode keys per query and cannot decode with a cache; use a relative encoding"
            )
        if geometry.has_camera_tokens_from(T - L):
            raise EncodingError(
                f"attn_implementation={NAME!r}: the {L} new tokens include camera tokens; with a "
                "cache, give every frame in the first call (the prompt) and append only text"
            )
        if sdpa["is_causal"]:  # the queries are the last L of the T positions: causal aligned lower-right
            from torch.nn.attention.bias import causal_lower_right  # not loaded by import torch

            sdpa.update(attn_mask=causal_lower_right(L, T), is_causal=False)
        out = cross_attention(query, key, value, query=None, key=transform, **sdpa)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)
