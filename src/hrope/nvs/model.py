"""LVSM decoder-only novel-view-synthesis transformer with a switchable encoding (DESIGN.md §5).

Context tokens = Linear(patchified [RGB in [-1, 1] ⊕ 6-channel Plücker rays]); target tokens =
Linear(patchified rays only). Each target view is rendered from the sequence
[all context tokens ; that target's tokens]: targets are folded into the batch (context repeated
per target). Pre-norm blocks (LayerNorm without bias, attention with RMS QK-norm applied before
the encoding, GELU MLP), full bidirectional attention through the encoding's prepared transform,
final LayerNorm, Linear to patches, sigmoid. No biases except in the parameter heads.

Encodings: any registry name (``hrope.ENCODINGS``) or ``<name>-ape`` for a parameterised one:
the APE variant predicts the same per-token parameters, embeds them with a linear layer and
ADDS them to the tokens (the block's residual stream, before the block that predicted them),
and attends with no geometric encoding (``none``), with world-frame rays. ``additive: <name>``
adds the same embedding of ``<name>``'s parameters on top of any encoding without per-token inputs
(e.g. ``prope``: PRoPE's relative transform plus the planes in the tokens); ``<name>-ape`` is
``encoding: none, additive: <name>``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..cameras import Cameras
from ..encodings import Encoding, Prepared, get_encoding
from ..geometry import patchify
from ..nn import Factors, MultiviewAttention, factorize
from .config import APE_ENCODINGS, PRESETS, ModelConfig, ModelError, RunConfig, encoding_names
from .model_folder import PretrainedMixin
from .sources import (
    ParameterSource,
    build_parameter_source,
    encoding_inputs,
    flatten_values,
    fold_heads,
    parameter_specs,
)
from ..rays import plucker_rays

__all__ = [
    "ModelConfig",
    "PRESETS",
    "APE_ENCODINGS",
    "LVSM",
    "LVSMOutput",
    "ModelError",
    "unpatchify",
    "count_parameters",
    "encoding_names",
    "build_model",
]


def unpatchify(x: Tensor, patch_size: int, grid: tuple[int, int]) -> Tensor:
    """Inverse of :func:`hrope.geometry.patchify` with flattened patches: ``(B, V, P, C*p*p)`` ->
    ``(B, V, C, H, W)``."""
    B, V, _, D = x.shape
    p, (gh, gw) = patch_size, grid
    C = D // (p * p)
    x = x.reshape(B, V, gh, gw, C, p, p).permute(0, 1, 4, 2, 5, 3, 6)
    return x.reshape(B, V, C, gh * p, gw * p)


def count_parameters(module: nn.Module) -> dict[str, int]:
    """``{"total": ..., "trainable": ...}`` parameter counts."""
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}


class Block(nn.Module):
    """Pre-norm transformer block; ``forward(x, factors)`` attends through the encoding bound to
    the batch (:func:`hrope.nn.factorize`; unfolded: its prepared transform,
    :meth:`hrope.Encoding.prepare`). Attention: :class:`hrope.nn.MultiviewAttention` without
    biases, QK-norm (RMS per head, before the encoding, epsilon ``qk_norm_eps``) with ``qk_norm``;
    parameters ``qkv``, ``out``, ``q_norm``, ``k_norm``. ``normed``: ``norm1(x)`` when the caller
    has already computed it."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, qk_norm: bool, qk_norm_eps: float | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, bias=False)
        self.attn = MultiviewAttention(dim, heads, None, qk_norm=qk_norm, qk_norm_eps=qk_norm_eps)
        self.norm2 = nn.LayerNorm(dim, bias=False)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden, bias=False), nn.GELU(), nn.Linear(hidden, dim, bias=False))

    def forward(self, x: Tensor, factors: Factors, normed: Tensor | None = None) -> Tensor:
        h = self.norm1(x) if normed is None else normed
        x = x + self.attn(h, factors=factors)
        return x + self.mlp(self.norm2(x))


@dataclass
class LVSMOutput:
    """``images (B, Vt, 3, H, W)`` in [0, 1]; ``parameters``: per layer (or one entry for static
    sources) the decoded per-token values ``{name: (B*Vt, (Vc+1)*P, ...)}`` on the folded
    sequences (target-major: fold index = b * Vt + t); empty when the encoding takes none."""

    images: Tensor
    parameters: list[dict[str, Tensor]]


class LVSM(PretrainedMixin, nn.Module):
    """Decoder-only LVSM. ``forward(batch)`` with ``batch.images (B, V, 3, H, W)`` (first
    ``batch.num_context`` views are the context), ``batch.cameras`` (B, V) and, for geometric
    predictors, ``batch.depth`` / ``batch.normals`` / ``batch.planes(p)``. ``LVSM.from_pretrained(folder)``
    and ``model.save_pretrained(folder)`` read and write a saved model folder (:mod:`hrope.nvs.model_folder`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        p2 = c.patch_size**2
        self.context_tokenizer = nn.Linear(9 * p2, c.dim, bias=False)
        self.target_tokenizer = nn.Linear(6 * p2, c.dim, bias=False)
        self.input_norm = nn.LayerNorm(c.dim, bias=False)
        self.blocks = nn.ModuleList(
            Block(c.dim, c.heads, c.mlp_ratio, c.qk_norm, c.qk_norm_eps) for _ in range(c.layers)
        )
        self.output_norm = nn.LayerNorm(c.dim, bias=False)
        self.head = nn.Linear(c.dim, 3 * p2, bias=False)
        self._init_weights()
        # Geometric encoding (a module: learnable options such as GTA's translation scale train).
        base = c.encoding_module()
        self.encoding: Encoding = (get_encoding("none") if c.is_ape else base).use_backend(c.transform_backend)
        parameterised = c.parameterised_encoding(base)
        plane_decoder = getattr(c.predictor_options, "plane_decoder", None)  # learned and backbone options
        specs = (
            parameter_specs(parameterised, c.depth_init, plane_decoder) if parameterised.takes_token_inputs() else []
        )
        self.source: ParameterSource | None = None
        self.ape: nn.ModuleList | None = None
        if specs:
            self.source = build_parameter_source(
                c.predictor,
                specs,
                dim=c.dim,
                num_layers=c.layers,
                patch_size=c.patch_size,
                options=c.predictor_options,
                depth_init=c.depth_init,
                attention_heads=c.heads,
                data_params=parameterised.data_param_names,
            )
            if c.embedded_encoding is not None:
                embed_dim = sum(s.embed_dim for s in specs)
                count = c.layers if self.source.per_layer else 1
                self.ape = nn.ModuleList(nn.Linear(embed_dim, c.dim, bias=False) for _ in range(count))

    def _init_weights(self) -> None:
        """LVSM's depth init: N(0, 0.02 / sqrt(2 (l + 1))) in block l, N(0, 0.02) elsewhere."""
        for module in (self.context_tokenizer, self.target_tokenizer, self.head):
            nn.init.normal_(module.weight, std=0.02)
        for index, block in enumerate(self.blocks):
            for layer in block.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, std=0.02 / (2 * (index + 1)) ** 0.5)

    # ------------------------------------------------------------------ folding
    @staticmethod
    def fold_cameras(cameras: Cameras, num_context: int) -> Cameras:
        """(B, Vc+Vt) cameras -> (B*Vt, Vc+1): each target view appended to the context views."""
        V = cameras.num_views
        Vt = V - num_context
        index = torch.arange(num_context, device=cameras.device).expand(Vt, -1)
        index = torch.cat([index, torch.arange(num_context, V, device=cameras.device)[:, None]], dim=1)
        K = cameras.K[:, index].flatten(0, 1)
        E = cameras.world_to_cam[:, index].flatten(0, 1)
        return Cameras(K, E, cameras.image_size, validate=False)

    @staticmethod
    def fold_tokens(x: Tensor, num_context: int, num_views: int) -> Tensor:
        """Per-token ``(B, V*P, ...)`` -> folded ``(B*Vt, (Vc+1)*P, ...)`` (same order as the tokens)."""
        B, N, *rest = x.shape
        P, Vt = N // num_views, num_views - num_context
        x = x.reshape(B, num_views, P, *rest)
        context = x[:, None, :num_context].expand(B, Vt, num_context, P, *rest)
        folded = torch.cat([context, x[:, num_context:, None]], dim=2)  # (B, Vt, Vc+1, P, ...)
        return folded.reshape(B * Vt, (num_context + 1) * P, *rest)

    # ------------------------------------------------------------------ forward
    def tokens(self, images: Tensor, cameras: Cameras, num_context: int) -> Tensor:
        """Folded input tokens ``(B*Vt, (Vc+1)*P, dim)``."""
        c = self.config
        rays = plucker_rays(cameras, c.ray_frame).to(images.dtype)
        context = torch.cat([images[:, :num_context] * 2 - 1, rays[:, :num_context]], dim=2)
        context = self.context_tokenizer(patchify(context, c.patch_size).flatten(-2))  # (B, Vc, P, D)
        target = self.target_tokenizer(patchify(rays[:, num_context:], c.patch_size).flatten(-2))  # (B, Vt, P, D)
        B, Vt, P, D = target.shape
        context = context.flatten(1, 2)[:, None].expand(B, Vt, num_context * P, D)
        return torch.cat([context, target], dim=2).reshape(B * Vt, (num_context + 1) * P, D)

    def forward(self, batch) -> LVSMOutput:
        """Render every target view from the context views (each target decoded on its own sequence).

        Args:
            batch: a :class:`hrope.nvs.data.SceneBatch` or any object with ``images (B, V, 3, H, W)`` in
                [0, 1] (H = W = ``image_size``), ``cameras`` :class:`hrope.Cameras` ``(B, V)`` and
                ``num_context`` Vc (0 < Vc < V; views ``Vc:`` are the Vt = V - Vc targets). The
                ``external`` predictor also reads ``depth (B, V, H, W)`` (and ``normals
                (B, V, 3, H, W)`` when present), the ``oracle`` one ``planes(patch_size)``.

        Returns:
            :class:`LVSMOutput`: ``images (B, Vt, 3, H, W)`` in [0, 1] and ``parameters``, the
            per-token values ``{name: (B*Vt, (Vc+1)*P, ...)}`` per layer (one entry for static
            sources; empty when the encoding takes none), P = grid_h * grid_w.
        """
        c = self.config
        images, cameras, num_context = batch.images, batch.cameras, int(batch.num_context)
        B, V, _, H, W = images.shape
        if (H, W) != (c.image_size, c.image_size):
            raise ModelError(f"model is configured for {c.image_size}x{c.image_size} images, got {H}x{W}")
        if not 0 < num_context < V:
            raise ModelError(f"need at least one context and one target view, got {num_context} of {V}")
        grid = c.grid
        x = self.input_norm(self.tokens(images, cameras, num_context))
        folded_cameras = self.fold_cameras(cameras, num_context)
        parameters: list[dict[str, Tensor]] = []
        source = self.source
        layer_source = source if source is not None and source.predicts_in_layers else None
        static_values: dict[str, Tensor] = {}
        if source is not None and layer_source is None:
            static_values = source.static(batch, cameras, grid, num_context)
            static_values = {k: self.fold_tokens(v, num_context, V) for k, v in static_values.items()}
            parameters.append(static_values)
            if self.ape is not None:
                x = x + self.ape[0](flatten_values(static_values, source.specs).to(x.dtype))
        # One prepare per forward unless parameters change per layer (learned per layer, non-APE).
        shared = None
        if layer_source is None or self.ape is not None:  # APE variants attend with no per-token values
            shared = self._prepare(folded_cameras, {} if self.ape is not None else static_values)
        for index, block in enumerate(cast("list[Block]", self.blocks)):
            prepared, normed = shared, None
            if layer_source is not None and (layer_source.per_layer or index == 0):  # from the block's normed input
                normed = block.norm1(x)
                values = layer_source.layer(index, normed, folded_cameras, grid, num_context)
                parameters.append(values)
                if self.ape is not None:  # x changes, so the block normalises it again
                    x = x + self.ape[index](flatten_values(values, layer_source.specs).to(x.dtype))
                    normed = None
                else:
                    prepared = self._prepare(folded_cameras, values)
                    if not layer_source.per_layer:  # predicted once: every later layer reuses it
                        shared = prepared
            x = self._block(block, x, prepared, normed)
        Vt = V - num_context
        P = grid[0] * grid[1]
        out = self.head(self.output_norm(x[:, num_context * P :]))
        out = torch.sigmoid(unpatchify(out.reshape(B, Vt, P, -1), c.patch_size, grid))
        return LVSMOutput(images=out, parameters=parameters)

    def _block(self, block: Block, x: Tensor, factors: Factors | None, normed: Tensor | None) -> Tensor:
        """``block(x, factors, normed)``, its activations recomputed in the backward pass when training
        with ``checkpoint_blocks``."""
        if self.config.checkpoint_blocks and self.training and torch.is_grad_enabled():
            return checkpoint(block, x, factors, normed, use_reentrant=False)
        return block(x, factors, normed)

    def _prepare(self, cameras: Cameras, values: dict[str, Tensor]) -> Factors:
        """The encoding bound to the folded cameras and per-token ``values`` (with a heads axis
        after N for a per-head source: then one transform per head, :class:`HeadsInBatch`), split
        for folding where ``model.folded_attention`` asks (the one place that decides it)."""
        heads = self.source.attention_heads if self.source is not None and values else 1
        if heads > 1:
            values = {name: fold_heads(value) for name, value in values.items()}
            cameras = cameras.repeat_batch(heads)
        planes, params = encoding_inputs(values)
        head_dim = self.config.dim // self.config.heads
        fold = self.config.folded_attention  # per-head sources are refused with it at construction
        factors = factorize(self.encoding, cameras, self.config.grid, head_dim, planes=planes, params=params, fold=fold)
        return factors if heads == 1 else replace(factors, full=HeadsInBatch(factors.full, heads))


class HeadsInBatch(Prepared):
    """A transform prepared per attention head, on a batch of ``B * heads`` (element ``b * heads +
    h``): ``attention(q, k, v)`` with ``(B, heads, N, head_dim)`` runs every head as its own batch
    element with one head, in one SDPA call."""

    def __init__(self, prepared: Prepared, heads: int) -> None:
        self.prepared, self.heads = prepared, heads
        self.batch_size, self.device = prepared.batch_size // heads, prepared.device
        self.query_frame, self.transform_values = prepared.query_frame, prepared.transform_values

    @property
    def head_dim(self) -> int:
        return self.prepared.head_dim

    @property
    def num_tokens(self) -> int:
        return self.prepared.num_tokens

    def attention(self, q: Tensor, k: Tensor, v: Tensor, **sdpa_kwargs: Any) -> Tensor:
        B, H, N, d = q.shape
        if H != self.heads:
            raise ModelError(f"the transform was prepared for {self.heads} heads, got {H}")
        out = self.prepared.attention(*(x.reshape(B * H, 1, N, d) for x in (q, k, v)), **sdpa_kwargs)
        return out.reshape(B, H, N, d)


def build_model(config: RunConfig) -> LVSM:
    """The LVSM of a run config's ``model`` section (``config.model``)."""
    return LVSM(config.model)
