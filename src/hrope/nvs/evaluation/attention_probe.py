"""Attention probe: where one target patch looks in the context views, layer by layer.

:class:`AttentionRecorder` records, for one query token, the attention weights of every layer of
an :class:`hrope.nvs.model.LVSM` without changing what the model computes: a forward pre-hook on
each block's attention hands it factors whose prepared transform is wrapped: its ``attention``
first computes ``softmax((encoded q_i) · (encoded k_j) / sqrt(head_dim))`` for the chosen query i
(:func:`query_weights`, from the transform's own ``apply_q`` / ``apply_k``, or ``apply_kv`` in the
query's frame for the query-frame encodings), then calls the wrapped ``attention`` with the same
q, k, v. The recorded weights are float32 and sum to 1 over all keys (context and target tokens).

:func:`probe` runs one scene and also returns where the query patch's centre ray lands in every
context view: at the depth of the data's plane for that patch (the ground truth) and at the depth
of the model's own plane for the target token (plane encodings), in pixel coordinates (pixel
(x, y) covers [x, x + 1) x [y, y + 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor

from ...cameras import Cameras
from ...geometry import patch_rays
from ..viz.figures import VizError

__all__ = ["query_weights", "AttentionRecorder", "Probe", "probe", "landing_points", "query_token"]


def query_weights(prepared, q: Tensor, k: Tensor, index: int) -> Tensor:
    """Attention weights of query token ``index`` over all keys: q, k ``(B, heads, N, d)`` (before
    the encoding) -> ``(B, heads, N)`` (float32 or float64), as the encoded SDPA of ``prepared`` weighs them
    (default scale 1/sqrt(d), no mask)."""
    B, H, N, d = q.shape
    if hasattr(prepared, "heads") and hasattr(prepared, "prepared"):  # one transform per head (HeadsInBatch)
        fold = (B * H, 1, N, d)
        return query_weights(prepared.prepared, q.reshape(fold), k.reshape(fold), index).reshape(B, H, N)
    if prepared.query_frame:
        P = prepared.tokens_per_view
        view = index // P
        q_i = prepared.apply_q(q[:, :, view * P : (view + 1) * P], view)[:, :, index - view * P]
        k_encoded, _ = prepared.apply_kv(k, k, view)
    else:
        q_i = prepared.apply_q(q)[:, :, index]
        k_encoded = prepared.apply_k(k)
    dtype = torch.promote_types(q.dtype, torch.float32)  # half precision: the weights in float32
    logits = torch.einsum("bhd,bhnd->bhn", q_i.to(dtype), k_encoded.to(dtype)) / math.sqrt(d)
    return logits.softmax(-1)


class _Recording:
    """A prepared transform whose ``attention`` records the query's weights, then runs unchanged."""

    def __init__(self, prepared, recorder: AttentionRecorder, layer: int) -> None:
        self.prepared, self.recorder, self.layer = prepared, recorder, layer

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs) -> Tensor:
        with torch.no_grad():
            self.recorder.weights[self.layer] = query_weights(
                self.prepared, q.detach(), k.detach(), self.recorder.index
            )
        return self.prepared.attention(q, k, v, **sdpa_kwargs)


class AttentionRecorder:
    """``with AttentionRecorder(model, index) as recorder: model(batch)`` fills ``recorder.weights``:
    per layer ``(B*Vt, heads, N)``, the attention of token ``index`` of every folded sequence
    (``(Vc+1)*P`` tokens, context first) over all its tokens."""

    def __init__(self, model, index: int) -> None:
        self.model, self.index = model, index
        self.weights: dict[int, Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> AttentionRecorder:
        for layer, block in enumerate(self.model.blocks):
            self._handles.append(block.attn.register_forward_pre_hook(partial(self._wrap, layer), with_kwargs=True))
        return self

    def _wrap(self, layer: int, module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        factors = kwargs["factors"]
        if factors.folds or factors.rope_dim:
            raise VizError("the attention probe reads the unfolded transform: set model.folded_attention false")
        return args, {**kwargs, "factors": replace(factors, full=_Recording(factors.full, self, layer))}

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def stacked(self) -> Tensor:
        """``(layers, B*Vt, heads, N)``."""
        return torch.stack([self.weights[layer] for layer in sorted(self.weights)])


def query_token(query: tuple[int, int], grid: tuple[int, int], num_context: int) -> int:
    """The folded-sequence index of target patch ``query = (x, y)`` (column, row on ``grid``)."""
    x, y = query
    if not (0 <= x < grid[1] and 0 <= y < grid[0]):
        raise VizError(f"--query {x},{y} is outside the {grid[1]}x{grid[0]} patch grid (x in 0..{grid[1] - 1})")
    return num_context * grid[0] * grid[1] + y * grid[1] + x


def landing_points(m: Tensor, cameras: Cameras, grid: tuple[int, int], query: tuple[int, int]) -> Tensor | None:
    """Pixel coordinates ``(Vc, 2)`` in the context views (all but the last of ``cameras``, batch 1)
    of the point where the centre ray of target patch ``query`` meets the plane ``m (3,)`` (target
    camera frame); None when the plane does not cross that ray in front of the camera. Points
    behind a context camera are NaN."""
    cameras = cameras.to(dtype=torch.float64)
    x, y = query
    ray = patch_rays(cameras.normalized_K()[:, -1:], grid)[0, 0, y * grid[1] + x]  # (3,), z = 1
    inverse_depth = float(m.double().cpu() @ ray)
    if inverse_depth <= 1e-6:
        return None
    to_world = cameras.cam_to_world()[0, -1]
    point = to_world[:3, :3] @ (ray / inverse_depth) + to_world[:3, 3]
    E = cameras.world_to_cam[0, :-1]
    in_context = E[:, :3, :3] @ point + E[:, :3, 3]  # (Vc, 3)
    pixels = (cameras.K[0, :-1] @ in_context[..., None])[..., 0]
    uv = pixels[:, :2] / pixels[:, 2:]
    return torch.where(in_context[:, 2:] > 1e-6, uv, torch.full_like(uv, float("nan"))).float()


@dataclass
class Probe:
    """One model's probe of one target patch: ``weights (layers, heads, N)`` over the folded
    sequence's N = (Vc+1)*P tokens (context first), ``truth`` and per-layer ``planes`` landing points
    (:func:`landing_points`; None where unknown)."""

    name: str
    weights: Tensor
    truth: Tensor | None
    planes: list[Tensor | None]


def probe(model, batch, query: tuple[int, int], name: str = "") -> Probe:
    """Probe the first target view of the first scene of ``batch`` (a :class:`SceneBatch`)."""
    config = model.config
    grid, p = config.grid, config.patch_size
    Vc = int(batch.num_context)
    index = query_token(query, grid, Vc)
    model.eval()
    with torch.no_grad(), AttentionRecorder(model, index) as recorder:
        output = model(batch)
    weights = recorder.stacked()[:, 0]  # the first target's sequence
    cameras = batch.cameras.select_views(list(range(Vc + 1)))
    truth_planes = batch.planes(p)
    truth = None
    if truth_planes is not None:
        m = truth_planes.m(batch.cameras, grid, torch.float64)[0, index]  # the first target's token, unfolded
        truth = landing_points(m, cameras, grid, query)
    planes: list[Tensor | None] = [None] * config.layers
    values = [v["planes"][0, index] for v in output.parameters if "planes" in v]
    if values and not config.is_ape:
        per_layer = values if len(values) == config.layers else values * config.layers
        planes = [landing_points(m if m.ndim == 1 else m[0], cameras, grid, query) for m in per_layer]
    return Probe(name or config.encoding, weights.cpu(), truth, planes)
