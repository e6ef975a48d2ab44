"""`Rng`: a seeded torch random stream keyed by a tuple (deterministic across processes)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["Rng", "stream_seed"]


def stream_seed(*key) -> int:
    """A 63-bit seed from a key tuple such as ``(seed, index, "layout")`` (stable, hash-based)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Rng:
    """Random draws from one ``torch.Generator`` seeded by ``stream_seed(*key)``.

    ``child(name)`` derives an independent stream, so adding draws to one part of the generator
    (say the textures) never changes another (the trajectory).
    """

    def __init__(self, *key) -> None:
        self.key = key
        self.generator = torch.Generator().manual_seed(stream_seed(*key))

    def child(self, *name) -> Rng:
        return Rng(*self.key, *name)

    def uniform(self, low: float = 0.0, high: float = 1.0, shape: Sequence[int] = ()) -> Tensor:
        """Float64 uniform samples in ``[low, high)`` of ``shape``."""
        return low + (high - low) * torch.rand(tuple(shape), generator=self.generator, dtype=torch.float64)

    def scalar(self, low: float = 0.0, high: float = 1.0) -> float:
        return float(self.uniform(low, high))

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]`` (both inclusive)."""
        return int(torch.randint(low, high + 1, (1,), generator=self.generator))

    def permutation(self, n: int) -> list[int]:
        """A random ordering of ``range(n)``."""
        return torch.randperm(n, generator=self.generator).tolist()

    def choice(self, options: Sequence):
        return options[self.integer(0, len(options) - 1)]

    def sign(self) -> float:
        return 1.0 if self.scalar() < 0.5 else -1.0

    def angle(self, max_degrees: float) -> float:
        """A uniform angle in ``[-max_degrees, max_degrees]``, in radians."""
        return math.radians(self.scalar(-max_degrees, max_degrees))
