"""One optimisation step of the LVSM model: the optimiser, the learning-rate schedule, the loss and the update.

:func:`train_step` is the step :func:`hrope.nvs.running.train.train` takes at every step of a run, and the
one the training benchmarks time: the schedule's learning rate, the forward pass (under bf16
autocast with ``train.bf16``), MSE plus ``train.perceptual_weight`` times the perceptual loss
(``train.perceptual_loss``: LPIPS, or LVSM's VGG-19 loss), backward, clipping to
``train.grad_clip`` and the AdamW update, skipped when the loss or the gradient is non-finite or,
with ``train.skip_grad_factor``, when the gradient norm exceeds that many times the clip (LVSM's rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import RunConfig, TrainSettings
from ..evaluation.metrics import LPIPS
from ..model import LVSMOutput
from .perceptual import VGGPerceptualLoss

__all__ = ["train_step", "StepResult", "learning_rate", "make_optimizer", "perceptual_loss", "parameter_grad_norm"]


def learning_rate(step: int, train: TrainSettings) -> float:
    """Linear warmup (lr · (step + 1) / warmup at step ``step < warmup``), then cosine decay to
    ``min_lr_ratio * lr`` at ``steps``."""
    lr, warmup, total = train.lr, train.warmup, train.steps
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = train.min_lr_ratio
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: nn.Module, train: TrainSettings) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95); weight decay on matrices only (not on norms, biases, scalars). The
    parameter source's weights (the plane / parameter heads) learn at ``train.parameter_lr_scale``
    times the learning rate (each group's ``lr_scale``, applied by :func:`train_step`)."""
    source = getattr(model, "source", None)
    heads = {id(p) for p in source.parameters()} if source is not None else set()
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for is_head, scale in ((False, 1.0), (True, train.parameter_lr_scale)):
        for decays in (True, False):
            params = [p for p in trainable if (id(p) in heads) == is_head and (p.ndim >= 2) == decays]
            if params:
                groups.append(
                    {"params": params, "weight_decay": train.weight_decay if decays else 0.0, "lr_scale": scale}
                )
    return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95))


def perceptual_loss(config: RunConfig, device: torch.device):
    """The frozen perceptual loss module when ``train.perceptual_weight > 0``: ``train.perceptual_loss``
    ``lpips`` (the LPIPS of local ``eval.lpips_weights``, backbone ``eval.lpips_net``) or ``vgg19``
    (LVSM's loss, :class:`~hrope.nvs.running.perceptual.VGGPerceptualLoss`, local ``train.vgg19_weights``);
    the config holds the local weights then (:class:`~hrope.nvs.config.RunConfig`)."""
    train = config.train
    if not train.perceptual_weight:
        return None
    if train.perceptual_loss == "vgg19":
        assert train.vgg19_weights is not None  # RunConfig: the vgg19 loss needs them
        return VGGPerceptualLoss(train.vgg19_weights).to(device)
    assert config.eval.lpips_weights is not None  # RunConfig: an LPIPS loss needs them
    return LPIPS(config.eval.lpips_weights, config.eval.lpips_net).to(device)


def parameter_grad_norm(model) -> float | None:
    """The 2-norm of the gradients of the parameter source's trainable parameters (the plane heads,
    ...), before clipping; None for a model without them or before any backward pass."""
    grads = [p.grad for p in (model.source.parameters() if model.source is not None else ()) if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


@dataclass
class StepResult:
    """What one :func:`train_step` computed."""

    output: LVSMOutput  # the forward pass: images (B, Vt, 3, H, W), per-layer decoded parameters
    loss: Tensor  # 0-d, detached: MSE (+ perceptual_weight · perceptual loss) of the predicted target views
    grad_norm: Tensor  # 0-d: the total gradient norm before clipping
    heads_norm: float | None  # the parameter heads' gradient norm before clipping (measure_heads only)
    finite: bool  # loss and gradient finite (on every rank)
    lr: float  # the schedule's learning rate at this step (each group's is lr · its lr_scale)
    applied: bool = True  # the update was applied: finite and, with train.skip_grad_factor, within its bound


def train_step(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch,
    step: int,
    train: TrainSettings,
    perceptual: nn.Module | None = None,
    *,
    measure_heads: bool = False,
) -> StepResult:
    """One optimisation step at ``step`` on ``batch`` (its views ``num_context:`` are the targets).

    Sets each parameter group's learning rate to :func:`learning_rate` · ``lr_scale``; forward
    (bf16 autocast when ``train.bf16``), loss = MSE of the predicted target views in float32 (+
    ``train.perceptual_weight`` · mean ``perceptual`` distance), backward, clipping of the gradient
    norm to ``train.grad_clip``, then the AdamW step unless the loss or the gradient norm is
    non-finite or (``train.skip_grad_factor`` set) the norm exceeds ``skip_grad_factor · grad_clip``.
    ``net`` is the LVSM model or its ``DistributedDataParallel`` wrapper (then the ranks agree on
    finiteness, so all skip together; the norm is of the averaged gradients, the same on every
    rank). ``measure_heads``: also measure :func:`parameter_grad_norm` (a device sync, so the
    training loop asks on logged steps only).
    """
    lr = learning_rate(step, train)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # checkpoints older than lr_scale: 1
    model: nn.Module = net.module if isinstance(net, nn.parallel.DistributedDataParallel) else net
    distributed = model is not net
    num_context = int(batch.num_context)
    with torch.autocast(batch.images.device.type, dtype=torch.bfloat16, enabled=train.bf16):
        output = net(batch)
    prediction = output.images
    target = batch.images[:, num_context:].float()
    loss = F.mse_loss(prediction.float(), target)
    if perceptual is not None:
        distance = perceptual(prediction.float().flatten(0, 1), target.flatten(0, 1))
        loss = loss + train.perceptual_weight * distance.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    heads_norm = parameter_grad_norm(model) if measure_heads else None
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
    finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
    if distributed:
        flag = finite.float()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        finite = flag > 0
    bound = train.skip_grad_factor
    applied = bool(finite) and (bound is None or float(grad_norm) <= bound * train.grad_clip)
    if applied:
        optimizer.step()
    return StepResult(output, loss.detach(), grad_norm, heads_norm, bool(finite), lr, applied)
