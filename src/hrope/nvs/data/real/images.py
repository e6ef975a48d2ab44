"""Decoding image files as users have them: `read_image` (and `read_image_size`, from the header).

Every image becomes ``(3, H, W)`` float32 RGB in [0, 1], whatever its file holds:

- **Modes.** RGB as it is; greyscale (``L``, 1-bit) repeated over the three channels; palette
  images through their palette; CMYK JPEGs converted by PIL;
  16-bit greyscale PNGs (``I;16``) and 32-bit integer images (``I``) divided by 65535 (values
  above are clipped to 1). PIL reads 16-bit RGB(A) PNGs as 8-bit RGB(A). Floating-point images
  (mode ``F``: HDR or depth TIFFs, not photographs) are refused.
- **Alpha.** An image with alpha (RGBA, LA, or a palette / greyscale image with a transparent
  colour) is composited over ``background`` (default white, :data:`WHITE`, the convention of
  NeRF-synthetic / Blender scenes and of Zero123's Objaverse renderings): the colour under a
  transparent pixel is undefined in most files. ``background=None`` drops alpha.
- **EXIF orientation** is ignored: pixels are read as stored. COLMAP reads images this way (an
  orientation tag would otherwise make the same camera's images disagree in size and intrinsics),
  and nerfstudio's loader does too; their cameras refer to the stored pixels.
- **Size.** With a target size, a JPEG is decoded at a reduced scale (libjpeg's DCT scaling by
  1/2, 1/4 or 1/8, PIL's ``draft``), other opaque images are box-reduced by that factor before the
  float conversion (PIL's ``reduce``), when the factor divides both sides exactly (so K scales
  exactly) and still leaves at least twice the resolution the resize needs; the antialiased
  resize does the rest. A file larger than PIL's decompression-bomb limit (twice
  ``PIL.Image.MAX_IMAGE_PIXELS``, about 179 megapixels by default) is refused before decoding.
- **Not an image** (text, an empty or truncated file, an unknown format): a one-line
  :class:`~hrope.nvs.data.scene.SceneError` naming the file.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from ...config.fields import one_line
from ..scene import SceneError
from ..transforms import resize_crop_plan

__all__ = ["WHITE", "read_image", "read_image_size", "decoding_scale"]

WHITE = (1.0, 1.0, 1.0)
"""The default colour images with alpha are composited over."""

_WIDE_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N"}  # integer greyscale, read as 16-bit levels
_WIDE_MAX = 65535.0


def decoding_scale(size: tuple[int, int], target: tuple[int, int]) -> int:
    """The largest reduction ``s`` in 8, 4, 2 that divides ``size (H, W)`` exactly and leaves at
    least twice the size that resizing to ``target`` needs; 1 when there is none."""
    (height, width), _, _ = resize_crop_plan(size, target)
    for scale in (8, 4, 2):
        if not (size[0] % scale or size[1] % scale) and size[0] >= 2 * scale * height and size[1] >= 2 * scale * width:
            return scale
    return 1


def _has_alpha(pil: Image.Image) -> bool:
    return "A" in pil.getbands() or "transparency" in pil.info


def _pixels(pil: Image.Image, scale: int, background: tuple[float, float, float] | None) -> Tensor:
    """``(3, H, W)`` float32 in [0, 1] of an opened image, reduced by ``scale`` unless it has alpha
    (module doc)."""
    if pil.mode == "F":
        raise ValueError("a floating-point image (mode F) is not a photograph; save it as 8- or 16-bit")
    alpha = background is not None and _has_alpha(pil)
    if pil.mode in _WIDE_MODES:
        pil = pil.convert("I")
        pil = pil.reduce(scale) if scale > 1 else pil
        grey = torch.from_numpy(np.asarray(pil, dtype=np.float32) / _WIDE_MAX).clamp(0, 1)
        return grey.expand(3, -1, -1).contiguous()
    pil = pil.convert("RGBA" if alpha else "RGB")
    if scale > 1 and not alpha:
        pil = pil.reduce(scale)
    pixels = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255.0
    if alpha:
        assert background is not None  # alpha is only composited over a colour
        colour = torch.tensor(background, dtype=torch.float32).view(3, 1, 1)
        pixels = pixels[:3] * pixels[3:] + colour * (1 - pixels[3:])
    return pixels


def _what(image: Path | bytes) -> str:
    return "the encoded image" if isinstance(image, bytes) else f"image {image}"


def _start(image: Path | bytes) -> str:
    """What an image file starts with, for an error message ('' for bytes held in memory)."""
    if isinstance(image, bytes):
        return ""
    try:
        with open(image, "rb") as file:
            return f" (it starts with {file.read(16)!r})"
    except OSError:
        return ""


def read_image(
    image: Path | bytes | Tensor,
    label: str = "",
    *,
    target: tuple[int, int] | None = None,
    background: tuple[float, float, float] | None = WHITE,
) -> Tensor:
    """Decode an image file or encoded bytes to ``(3, H, W)`` float32 RGB in [0, 1] (module doc).

    ``target (H, W)``: the size the image is resized to next, which allows decoding it at a
    reduced scale. ``background``: the RGB colour in [0, 1] an image with alpha is composited
    over (None: alpha is dropped). A :class:`SceneError` naming ``label`` and the file otherwise.
    """
    image = _encoded(image)
    with _decoding(image, label), Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as pil:
        scale = 1 if target is None else decoding_scale((pil.height, pil.width), target)
        if scale > 1 and pil.format == "JPEG":
            pil.draft("RGB", (pil.width // scale, pil.height // scale))
            scale = 1
        return _pixels(pil, scale, background)


def read_image_size(image: Path | bytes | Tensor, label: str = "") -> tuple[int, int]:
    """``(H, W)`` of an image file or encoded bytes, from its header (nothing is decoded); the
    errors of :func:`read_image`."""
    image = _encoded(image)
    with _decoding(image, label), Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as pil:
        return pil.height, pil.width


def _encoded(image: Path | bytes | Tensor) -> Path | bytes:
    return image.numpy().tobytes() if isinstance(image, Tensor) else image


@contextmanager
def _decoding(image: Path | bytes, label: str) -> Iterator[None]:
    """PIL's errors while reading ``image`` as one-line :class:`SceneError` naming ``label`` and the file."""
    try:
        yield
    except UnidentifiedImageError:
        raise SceneError(f"{label}: {_what(image)} is in no image format PIL can read{_start(image)}") from None
    except Image.DecompressionBombError as error:
        raise SceneError(
            f"{label}: {_what(image)} is too large to decode ({one_line(error)}); use a downsampled copy "
            f"(images_N/) or raise PIL.Image.MAX_IMAGE_PIXELS"
        ) from None
    except (OSError, ValueError, SyntaxError) as error:
        raise SceneError(f"{label}: cannot read {_what(image)}: {one_line(error)}") from None
