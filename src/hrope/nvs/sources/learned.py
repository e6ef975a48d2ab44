"""The ``learned`` source: linear heads on the blocks' hidden states."""

from __future__ import annotations

from torch import nn

from .base import ParameterSource, fold_heads, unfold_heads, zero_linear

__all__ = ["LearnedSource"]


class LearnedSource(ParameterSource):
    """``learned``: a zero-initialised ``Linear(dim, raw_dim)`` per token, in every layer
    (``per_layer``) or once, on the first block's input, for all layers.

    ``attention_heads`` > 1: one set of values per attention head (``Linear(dim, heads * raw_dim)``),
    returned with a heads axis, ``{name: (B, N, heads, ...)}``; each head's target values follow
    ``targets`` on their own (e.g. transferred from that head's context planes)."""

    predicts_in_layers = True

    def __init__(
        self,
        specs,
        dim: int,
        num_layers: int,
        per_layer: bool = True,
        targets: str = "hidden",
        attention_heads: int = 1,
    ) -> None:
        super().__init__(specs, targets)
        self.per_layer = per_layer
        self.attention_heads = attention_heads
        self.heads = nn.ModuleList(
            zero_linear(dim, attention_heads * self.raw_dim) for _ in range(num_layers if per_layer else 1)
        )

    def layer(self, index, hidden, cameras, grid, num_context):
        raw = self.heads[index if self.per_layer else 0](hidden)
        count = self.attention_heads
        if count == 1:
            return self.with_targets(self.decode(raw, cameras, grid), cameras, grid, num_context)
        raw = fold_heads(raw.unflatten(-1, (count, self.raw_dim)))  # decoded and completed head by head
        cameras = cameras.repeat_batch(count)
        values = self.with_targets(self.decode(raw, cameras, grid), cameras, grid, num_context)
        return {name: unfold_heads(value, count) for name, value in values.items()}
