"""The encoding registry: every encoding by name, and a factory.

    >>> import torch
    >>> from hrope.testing import random_cameras, random_planes, random_qkv
    >>> cameras, planes = random_cameras(B=1, V=2), random_planes(B=1, N=2 * 4 * 4)   # 2 views of 4x4 patches
    >>> q, k, v = random_qkv(B=1, heads=2, N=32, head_dim=32)                           # (B, heads, N, head_dim)
    >>> transform = get_encoding("hrope-lift").prepare(cameras, (4, 4), 32, planes=planes)
    >>> sdpa = torch.nn.functional.scaled_dot_product_attention
    >>> out = transform.apply_o(sdpa(transform.apply_q(q), transform.apply_k(k), transform.apply_v(v)))
    >>> out.shape
    torch.Size([1, 2, 32, 32])
    >>> torch.allclose(out, transform.attention(q, k, v))
    True

``prepare`` returns a :class:`TokenTransform` for the relative encodings and a
:class:`QueryFrameTransform` for the query-frame ones (rayrope, urope, worldrope), which
re-encode keys and values per query view (``hrope-lift-uv`` too: hrope-lift's
plane transform on half of each head, 2D RoPE on query-view positions of the key's plane point on
the other); ``transform.attention(q, k, v)`` works for both.
"""

from __future__ import annotations

from typing import Any

from .ablations import HRoPEDepth, HRoPEFull, HRoPEPF, HRoPESE3, HRoPESO3, tangent_frames
from .base import Encoding, EncodingError, Prepared, TokenTransform
from .precision import PRECISIONS
from .layout import HeadLayout, patch_index_rope_angles
from .camera import GTA, CaPE, NoEncoding, PRoPE, RoPE2D
from .homography import HRoPE, HRoPELift
from .query_frame import QueryFrameTransform
from .rayrope import RayRoPE
from .urope import URoPE
from .worldrope import WorldRoPE
from .lift_uv import HRoPELiftUV
from .ray_segments import sample_ray_depths

ENCODINGS: dict[str, type[Encoding]] = {
    cls.name: cls
    for cls in (
        NoEncoding,
        RoPE2D,
        PRoPE,
        GTA,
        CaPE,
        HRoPE,
        HRoPELift,
        HRoPELiftUV,
        HRoPEDepth,
        HRoPESO3,
        HRoPESE3,
        HRoPEPF,
        HRoPEFull,
        RayRoPE,
        URoPE,
        WorldRoPE,
    )
}


def get_encoding(name: str | Encoding, **options: Any) -> Encoding:
    """An encoding instance from its registry name (options go to its constructor); an instance is
    returned as it is.

        >>> enc = get_encoding("prope")
        >>> enc.name, enc.encodes_pose, enc.needs_planes
        ('prope', True, False)
        >>> get_encoding(enc) is enc
        True
    """
    if isinstance(name, Encoding):
        if options:
            raise EncodingError("options can only be given with an encoding name")
        return name
    try:
        cls = ENCODINGS[name]
    except KeyError:
        raise EncodingError(f"unknown encoding {name!r}; available: {', '.join(ENCODINGS)}") from None
    return cls(**options)


__all__ = [
    "ENCODINGS",
    "PRECISIONS",
    "get_encoding",
    "Encoding",
    "EncodingError",
    "HeadLayout",
    "Prepared",
    "TokenTransform",
    "QueryFrameTransform",
    "sample_ray_depths",
    "patch_index_rope_angles",
    "tangent_frames",
    "NoEncoding",
    "RoPE2D",
    "PRoPE",
    "GTA",
    "CaPE",
    "HRoPE",
    "HRoPELift",
    "HRoPELiftUV",
    "HRoPEDepth",
    "HRoPESO3",
    "HRoPESE3",
    "HRoPEPF",
    "HRoPEFull",
    "RayRoPE",
    "URoPE",
    "WorldRoPE",
]
