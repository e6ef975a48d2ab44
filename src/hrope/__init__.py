"""hrope: geometric relative positional encodings for multi-view transformers (torch only).

The library: :class:`Cameras`, :class:`Planes`, :func:`multiview_attention`, the registry
:data:`ENCODINGS` / :func:`get_encoding`, identity tokens (:class:`MixedTokens`),
:func:`cross_attention`, :class:`KVCache`, and the dense float64 references in
:mod:`hrope.reference` (``import hrope.reference``; not imported here). The novel-view-synthesis
toolkit lives in :mod:`hrope.nvs` (``pip install 'hrope[nvs]'``).
"""

from .about import package_version
from .attention import KVCache, cross_attention, multiview_attention
from .cameras import CameraError, Cameras
from .encodings import ENCODINGS, Encoding, EncodingError, Prepared, QueryFrameTransform, TokenTransform, get_encoding
from .errors import InputError
from .planes import PlaneError, Planes
from .tokens import MixedTokens

__version__ = package_version()  # the installed distribution's (pyproject.toml)

__all__ = [
    "InputError",
    "Cameras",
    "CameraError",
    "Planes",
    "PlaneError",
    "multiview_attention",
    "ENCODINGS",
    "Encoding",
    "EncodingError",
    "Prepared",
    "TokenTransform",
    "QueryFrameTransform",
    "get_encoding",
    "MixedTokens",
    "cross_attention",
    "KVCache",
    "__version__",
]
