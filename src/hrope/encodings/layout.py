"""How a relative encoding splits one head's channels (:class:`HeadLayout`), and the 2D RoPE of
the patch grid that fills the last 4F of them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.types import Device

from .banded import RopeTables, rope_diagonals

__all__ = ["ROPE_BASE", "HeadLayout", "patch_index_rope_angles", "rope_tables"]

ROPE_BASE = 100.0


@dataclass(frozen=True)
class HeadLayout:
    """How one head's ``head_dim`` channels are split.

    ``[geometric: n_blocks tiles of block x block | identity remainder | RoPE-x: 2F | RoPE-y: 2F]``
    with F = head_dim // 8 frequencies per axis when ``rope`` is on (PRoPE's layout: for
    head_dim % 8 == 0 the geometric part is exactly the first half). Channels of the geometric
    part that do not fill a whole block are left untouched.
    """

    head_dim: int
    block: int = 0
    rope: bool = True

    @property
    def num_freqs(self) -> int:
        return self.head_dim // 8 if self.rope else 0

    @property
    def rope_dim(self) -> int:
        return 4 * self.num_freqs

    @property
    def geo_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def num_blocks(self) -> int:
        return self.geo_dim // self.block if self.block else 0

    @property
    def tiled_dim(self) -> int:
        return self.num_blocks * self.block


def patch_index_rope_angles(
    grid: tuple[int, int],
    num_freqs: int,
    *,
    base: float = ROPE_BASE,
    device: Device = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Angles ``(P, 2, F)`` of the relative encodings' 2D RoPE: ``[p, 0, f] = ix * w_f`` and
    ``[p, 1, f] = iy * w_f``.

    Integer patch indices, ``w_f = base^(-f / F)``, P = grid_h * grid_w row-major (x fastest). This
    RoPE fills the last 4F channels of a head (PRoPE's layout, :class:`HeadLayout`) with split pairing
    inside each axis quarter (channel c with c + F); the query-frame encodings use another layout
    (:func:`hrope.encodings.query_frame.image_position_rope_freqs`, docs/encodings.md "Two 2D RoPE layouts").
    """
    grid_h, grid_w = grid
    freqs = base ** (-torch.arange(num_freqs, device=device, dtype=torch.float64) / max(num_freqs, 1))
    iy, ix = torch.meshgrid(
        torch.arange(grid_h, device=device, dtype=torch.float64),
        torch.arange(grid_w, device=device, dtype=torch.float64),
        indexing="ij",
    )
    pos = torch.stack([ix.reshape(-1), iy.reshape(-1)], dim=-1)  # (P, 2)
    return (pos[..., None] * freqs).to(dtype)


@functools.lru_cache(maxsize=32)
def rope_tables(grid: tuple[int, int], num_freqs: int, base: float, device: torch.device) -> RopeTables:
    """RoPE of R(θ) as the diagonal tables of :func:`~hrope.encodings.banded.rope_diagonals`
    ``(P, 4F)``, ``(P, 3F)``, ``(P, 3F)`` (float64, cached per grid)."""
    return rope_diagonals(patch_index_rope_angles(grid, num_freqs, base=base, device=device))
