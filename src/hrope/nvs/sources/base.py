"""The base class of every parameter source, and the helpers its subclasses share."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...cameras import Cameras
from .transfer import transfer_planes
from .specs import ParameterSpec

__all__ = ["ParameterSource", "fold_heads", "unfold_heads", "zero_linear", "camera_views"]


class ParameterSource(nn.Module):
    """Base class. Sources with ``predicts_in_layers`` predict from the blocks' normalised inputs
    (in every block when ``per_layer``, else once from the first); the others give one set of values
    per forward pass (``static``) for all views of the batch.

    ``targets`` says where the target views' values come from (a target view has no image):
    ``hidden`` (the target tokens' own hidden states; learned only), ``neutral`` (the decoders'
    zero-output values, e.g. hrope-lift's plane at infinity) or ``transfer`` (geometry carried over
    from the context views, :mod:`hrope.nvs.sources.transfer`; target patches no context surface reaches
    stay neutral). ``scope="all"`` (oracle, external) reads the target views' own ground truth
    instead: an upper bound that uses target geometry, labelled as such (:meth:`describe`).
    """

    predicts_in_layers = False
    per_layer = False
    attention_heads = 1  # > 1: one set of values per attention head (a heads axis after N)
    frozen: tuple[str, ...] = ()  # frozen user submodules: always in eval mode (fixed normalisation statistics)

    def __init__(self, specs: list[ParameterSpec], targets: str = "neutral", scope: str = "context") -> None:
        super().__init__()
        self.specs = specs
        self.targets, self.scope = targets, scope

    def train(self, mode: bool = True):
        super().train(mode)
        for name in self.frozen:
            if getattr(self, name) is not None:
                getattr(self, name).eval()
        return self

    def static(self, batch, cameras: Cameras, grid: tuple[int, int], num_context: int) -> dict[str, Tensor]:
        """Values ``{name: (B, V*P, ...)}`` for all V views of the (unfolded) batch."""
        raise NotImplementedError

    def layer(
        self, index: int, hidden: Tensor, cameras: Cameras, grid: tuple[int, int], num_context: int
    ) -> dict[str, Tensor]:
        """Values from ``hidden (B, N, dim)``, the normalised input of block ``index``."""
        raise NotImplementedError

    def describe(self, name: str) -> str:
        """The label of a run with this source (``name``: the predictor's name) in reports."""
        if self.scope == "all":
            return f"{name}, with target geometry"
        return name if self.targets == "hidden" else f"{name}, targets {self.targets}"

    def with_targets(
        self,
        values: dict[str, Tensor],
        cameras: Cameras,
        grid: tuple[int, int],
        num_context: int,
        transferred: tuple[dict[str, Tensor], Tensor] | None = None,
    ) -> dict[str, Tensor]:
        """Values of all V views: the context rows of ``values`` (``(B, Vc*P or V*P, ...)``) and target
        rows per ``targets``: ``values``' own rows (``hidden``, or ``scope="all"``), the neutral
        values, or ``transferred = (values (B, Vt*P, ...), hit (B, Vt*P))``: those values where
        ``hit`` and neutral elsewhere (default: planes transferred from the context rows of
        ``values["planes"]``)."""
        if self.targets == "hidden" or self.scope == "all":
            return values
        B, start = cameras.batch_size, num_context * grid[0] * grid[1]
        some = next(iter(values.values()))
        neutral = self.decode(some.new_zeros(B, cameras.num_views * grid[0] * grid[1], self.raw_dim), cameras, grid)
        if self.targets == "transfer" and transferred is None:
            planes, hit = transfer_planes(values["planes"][:, :start], cameras, grid, num_context)
            transferred = {"planes": planes}, hit
        out = {}
        for name, value in values.items():
            target = neutral[name][:, start:].to(value.dtype)
            if transferred is not None and name in transferred[0]:
                moved, hit = transferred
                shape = hit.shape + (1,) * (target.ndim - 2)
                target = torch.where(hit.reshape(shape), moved[name].to(value.dtype), target)
            out[name] = torch.cat([value[:, :start], target], dim=1)
        return out

    def decode(self, raw: Tensor, cameras: Cameras, grid: tuple[int, int]) -> dict[str, Tensor]:
        """Split ``raw (B, N, sum raw_dim)`` per spec and decode (geometry in float32)."""
        raw = raw.float()
        out, start = {}, 0
        for spec in self.specs:
            out[spec.name] = spec.decode(raw[..., start : start + spec.raw_dim], cameras, grid)
            start += spec.raw_dim
        return out

    @property
    def raw_dim(self) -> int:
        return sum(s.raw_dim for s in self.specs)


def zero_linear(in_dim: int, out_dim: int) -> nn.Linear:
    """``Linear(in_dim, out_dim)`` with zero weight and bias: a head whose output starts at zero."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def fold_heads(value: Tensor) -> Tensor:
    """Per-head values ``(B, N, heads, ...)`` -> ``(B * heads, N, ...)``, element ``b * heads + h``
    (the batch layout of :meth:`hrope.Cameras.repeat_batch`)."""
    return value.transpose(1, 2).flatten(0, 1)


def unfold_heads(value: Tensor, heads: int) -> Tensor:
    """The inverse of :func:`fold_heads`: ``(B * heads, N, ...)`` -> ``(B, N, heads, ...)``."""
    return value.unflatten(0, (-1, heads)).transpose(1, 2)


def camera_views(cameras: Cameras, start: int, stop: int | None = None) -> Cameras:
    """The views ``[start, stop)`` of ``cameras`` (to the last view by default)."""
    return cameras.select_views(list(range(start, cameras.num_views if stop is None else stop)))
