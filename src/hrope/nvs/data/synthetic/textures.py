"""Procedural and photographic textures, and mip-mapped (anti-aliased) texture lookup.

Textures are ``(3, S, S)`` RGB in [0, 1] with S a power of two. Photographs come from
scikit-image's bundled sample images (no download). Texture coordinates are in *tiles*
(1 tile = one texture width) and repeat with mirroring, so tiling has no seams.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from ..rng import Rng

__all__ = ["PHOTO_NAMES", "make_texture", "MipTextures"]

PHOTO_NAMES = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "immunohistochemistry",
    "camera",
    "brick",
    "grass",
    "gravel",
    "moon",
    "coins",
    "clock",
    "text",
)
_PHOTO_MAX_SIDE = 512
_MIN_LEVEL_SIZE = 4


@lru_cache(maxsize=1)
def _photos() -> tuple[Tensor, ...]:
    """scikit-image sample photos as float ``(3, h, w)`` tensors (loaded once per process)."""
    import skimage.data

    photos = []
    for name in PHOTO_NAMES:
        array = torch.as_tensor(getattr(skimage.data, name)()).float() / 255.0
        image = array.permute(2, 0, 1)[:3] if array.ndim == 3 else array[None].expand(3, -1, -1)
        scale = _PHOTO_MAX_SIDE / max(image.shape[-2:])
        if scale < 1:
            image = F.interpolate(image[None], scale_factor=scale, mode="bilinear", antialias=True)[0]
        photos.append(image.contiguous())
    return tuple(photos)


def _random_colour(rng: Rng) -> Tensor:
    return rng.uniform(0.1, 0.95, (3,)).float()


def _two_colours(rng: Rng, pattern: Tensor) -> Tensor:
    """Blend two random colours with a ``(S, S)`` pattern in [0, 1] -> ``(3, S, S)``."""
    c0, c1 = _random_colour(rng), _random_colour(rng)
    return c0[:, None, None] + (c1 - c0)[:, None, None] * pattern


def _value_noise(rng: Rng, size: int, octaves: int = 5, base_cells: int = 4) -> Tensor:
    """Multi-octave smooth noise ``(S, S)`` normalised to [0, 1].

    Octave k adds random values on a grid twice as fine as octave k - 1 with 0.6 times its weight;
    the running sum is upsampled (bicubic) by 2 between octaves and to ``size`` at the end.
    """
    cells = min(base_cells, size)
    total = torch.rand(1, 1, cells, cells, generator=rng.generator)
    for octave in range(1, octaves):
        if cells * 2 > size:
            break
        cells *= 2
        total = F.interpolate(total, size=(cells, cells), mode="bicubic", align_corners=False)
        total = total + 0.6**octave * torch.rand(1, 1, cells, cells, generator=rng.generator)
    total = F.interpolate(total, size=(size, size), mode="bicubic", align_corners=False)[0, 0]
    return (total - total.min()) / (total.max() - total.min()).clamp_min(1e-6)


def _pixel_grid(size: int) -> tuple[Tensor, Tensor]:
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    rows, columns = torch.meshgrid(coords, coords, indexing="ij")
    return rows, columns


def _noise(rng: Rng, size: int) -> Tensor:
    return _two_colours(rng, _value_noise(rng, size, base_cells=rng.choice((2, 4, 8))))


def _checker(rng: Rng, size: int) -> Tensor:
    cells = rng.choice((2, 4, 8, 16))
    y, x = _pixel_grid(size)
    parity = ((x * cells).floor() + (y * cells).floor()) % 2
    return _two_colours(rng, parity) * (0.85 + 0.15 * _value_noise(rng, size))


def _stripes(rng: Rng, size: int) -> Tensor:
    y, x = _pixel_grid(size)
    angle, frequency = rng.scalar(0, math.pi), rng.choice((2, 3, 5, 8, 12, 20))
    phase = 2 * math.pi * frequency * (x * math.cos(angle) + y * math.sin(angle))
    wave = 0.5 + 0.5 * torch.sin(phase)
    if rng.scalar() < 0.5:
        wave = (wave > 0.5).float()
    return _two_colours(rng, wave) * (0.85 + 0.15 * _value_noise(rng, size))


def _photo(rng: Rng, size: int) -> Tensor:
    image = rng.choice(_photos())
    h, w = image.shape[-2:]
    side = int(min(h, w) * rng.scalar(0.4, 1.0))
    top, left = rng.integer(0, h - side), rng.integer(0, w - side)
    crop = image[None, :, top : top + side, left : left + side]
    crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    if float((crop.amax(0) - crop.amin(0)).mean()) < 0.02:  # grayscale photo: tint it
        crop = crop * (0.5 + 0.5 * _random_colour(rng))[:, None, None]
    return crop.clamp(0, 1)


_PROCEDURAL = (_noise, _checker, _stripes)


def make_texture(rng: Rng, size: int, kind: str = "any", photo_probability: float = 0.4) -> Tensor:
    """A random ``(3, size, size)`` texture; ``kind`` is "photo", "procedural" or "any"."""
    if kind not in ("photo", "procedural", "any"):
        raise ValueError(f"texture kind must be 'photo', 'procedural' or 'any', got {kind!r}")
    use_photo = kind == "photo" or (kind == "any" and rng.scalar() < photo_probability)
    return _photo(rng, size) if use_photo else rng.choice(_PROCEDURAL)(rng, size)


def _mirror(s: Tensor) -> Tensor:
    """Mirrored repeat: maps any real coordinate to [0, 1] continuously (0->0, 1->1, 2->0)."""
    return 1.0 - ((s % 2.0) - 1.0).abs()


class MipTextures:
    """A stack of N same-size textures ``(N, 3, S, S)`` with a box-filtered mip pyramid.

    :meth:`sample` does trilinear mip-mapping: the level is chosen per lookup from the texture
    footprint of one output pixel, so minified surfaces are pre-filtered instead of aliasing.
    All levels live in one atlas ``(1, 3, rows, S)``: level l (size S_l = S / 2^l) of texture i
    starts at row ``level_row[l] + i * S_l``. Lookups are clamped to texel centres of their own
    texture and level, so bilinear filtering never bleeds into a neighbour.
    """

    def __init__(self, textures: Tensor) -> None:
        if textures.ndim != 4 or textures.shape[1] != 3 or textures.shape[2] != textures.shape[3]:
            raise ValueError(f"textures must be (N, 3, S, S), got {tuple(textures.shape)}")
        size = textures.shape[-1]
        if size < _MIN_LEVEL_SIZE or size & (size - 1):
            raise ValueError(f"texture size must be a power of two >= {_MIN_LEVEL_SIZE}, got {size}")
        self.count, self.size = textures.shape[0], size
        blocks, level = [], textures.float()
        while level.shape[-1] >= _MIN_LEVEL_SIZE:
            block = level.permute(1, 0, 2, 3).reshape(3, -1, level.shape[-1])
            blocks.append(F.pad(block, (0, size - level.shape[-1])))
            level = F.avg_pool2d(level, 2)
        self.num_levels = len(blocks)
        self.level_row = torch.tensor([0] + [b.shape[1] for b in blocks[:-1]]).cumsum(0)
        self.atlas = torch.cat(blocks, 1)[None]

    def sample(self, index: Tensor, s: Tensor, t: Tensor, footprint: Tensor) -> Tensor:
        """Colours ``(3, *shape)`` of textures ``index`` at tile coordinates ``s, t`` (all ``shape``).

        ``footprint`` is the size of one output pixel in level-0 texels.
        """
        level = footprint.clamp_min(1.0).log2().clamp(max=self.num_levels - 1)
        lower = level.floor().long()
        upper = (lower + 1).clamp(max=self.num_levels - 1)
        s, t = _mirror(s), _mirror(t)
        low, high = self._lookup(lower, index, s, t), self._lookup(upper, index, s, t)
        return torch.lerp(low, high, (level - lower).unsqueeze(0))

    def _lookup(self, level: Tensor, index: Tensor, s: Tensor, t: Tensor) -> Tensor:
        """Bilinear lookup ``(3, *shape)`` at per-element mip ``level``; ``s, t`` in [0, 1]."""
        size = (self.size >> level).float()
        x = (s * size).clamp(min=0.5).minimum(size - 0.5)
        y = (t * size).clamp(min=0.5).minimum(size - 0.5) + self.level_row[level] + index * size
        rows = self.atlas.shape[-2]
        grid = torch.stack([2 * x / self.size - 1, 2 * y / rows - 1], -1).float()
        colour = F.grid_sample(self.atlas, grid.reshape(1, 1, -1, 2), mode="bilinear", align_corners=False)
        return colour.reshape(3, *s.shape)
