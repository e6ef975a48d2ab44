"""hrope: geometric relative positional encodings for multi-view transformers.

Layer 1 (torch only): :class:`Cameras`, :class:`Planes`, :func:`multiview_attention`, the
registry :data:`ENCODINGS` and the dense float64 references in :mod:`hrope.reference`.
"""

from . import reference
from .attention import multiview_attention
from .cameras import CameraError, Cameras
from .encodings import ENCODINGS, Encoding, EncodingError, Prepared, QueryFrameTransform, TokenTransform, get_encoding
from .planes import PlaneError, Planes

__version__ = "0.1.0"

__all__ = [
    "Cameras", "CameraError", "Planes", "PlaneError", "multiview_attention", "ENCODINGS", "Encoding",
    "EncodingError", "Prepared", "TokenTransform", "QueryFrameTransform", "get_encoding", "reference", "__version__",
]
