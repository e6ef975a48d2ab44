"""Training loop: AdamW + warmup/cosine, clipping, bf16, NaN guard, exact and safe resume, DDP.

``train(config)`` trains the LVSM model of ``config["model"]`` on the dataset of
``config["data"]`` and writes into ``config["train"]["out"]``: ``config.yaml`` (resolved config),
``checkpoint.safetensors`` (atomic, checksummed), ``segments.jsonl`` (one line of provenance per
training segment), ``tb/`` (TensorBoard scalars and image grids) and, for predicted planes on data
with ground-truth planes, ``plane_accuracy.jsonl`` (:mod:`hrope.nvs.plane_accuracy` of the logged
steps' training batches; a resumed run appends).

Exact resume: batches are a pure function of (seed, step, rank) (:func:`batch_indices`), the
learning rate a pure function of the step (:func:`learning_rate`), and the checkpoint holds the
model, the AdamW state, the step and the RNG state, so a run killed after checkpoint k and
resumed ends with the same parameters as an uninterrupted one (bit-equal on the same machine).
Safe resume: a resume under a config that changes the trajectory is refused
(:func:`hrope.nvs.runs.resume_differences`); ``train.init_from`` starts a new run from another run's weights.
SIGTERM finishes the current step, saves and returns; ``train.max_nonfinite_steps`` consecutive
non-finite steps stop the run with a :class:`TrainingError`.

DDP: launch with ``torchrun --nproc_per_node N -m hrope.nvs.cli train ...``; gloo on CPU, nccl on
GPU. Each rank draws its own batch; gradients are averaged; rank 0 writes outputs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .. import __version__
from ..errors import InputError
from .checkpoints import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .config import ConfigError, check_config, check_device, save_config
from .data.rng import stream_seed
from .build_data import build_dataset, collate
from .metrics import LPIPS
from .model import LVSM, build_model, count_parameters
from .plane_accuracy import GROUPS, LOG_NAME, METRICS, append_log, plane_accuracy
from .runs import append_segment, code_provenance, config_hash, resume_differences

__all__ = ["train", "TrainResult", "TrainingError", "StepLoader", "learning_rate", "batch_indices",
           "make_optimizer", "perceptual_loss", "setup_distributed", "parameter_grad_norm"]

logger = logging.getLogger("hrope.nvs.train")


class StepLoader:
    """The scenes of each training step, a pure function of (seed, step, rank).

    With ``prefetch`` the next step's scenes are loaded in one background thread while the current
    step trains (rendering and decoding release the GIL inside torch ops), so data generation
    overlaps with the model; the dataset is only ever touched by that thread, in step order.
    """

    def __init__(self, dataset, seed: int, rank: int, batch_size: int, prefetch: bool) -> None:
        self.dataset, self.seed, self.rank, self.batch_size = dataset, seed, rank, batch_size
        self._pool = ThreadPoolExecutor(max_workers=1) if prefetch else None
        self._pending: dict[int, Future] = {}

    def _load(self, step: int) -> list:
        if hasattr(self.dataset, "set_epoch"):  # uncached datasets: fresh views at every step
            self.dataset.set_epoch(step)
        indices = batch_indices(self.seed, step, self.rank, self.batch_size, len(self.dataset))
        return [self.dataset[i] for i in indices]

    def scenes(self, step: int, prefetch_next: bool = True) -> list:
        if self._pool is None:
            return self._load(step)
        pending = self._pending.pop(step, None) or self._pool.submit(self._load, step)
        if prefetch_next:
            self._pending[step + 1] = self._pool.submit(self._load, step + 1)
        return pending.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def learning_rate(step: int, train: dict) -> float:
    """Linear warmup (lr · (step + 1) / warmup at step ``step < warmup``), then cosine decay to
    ``min_lr_ratio * lr`` at ``steps``."""
    lr, warmup, total = train["lr"], train["warmup"], train["steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = train["min_lr_ratio"]
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_indices(seed: int, step: int, rank: int, batch_size: int, num_scenes: int) -> list[int]:
    """Scene indices of one rank's batch at ``step`` (deterministic; independent of history)."""
    generator = torch.Generator().manual_seed(stream_seed("batch", seed, step, rank))
    return torch.randint(num_scenes, (batch_size,), generator=generator).tolist()


def make_optimizer(model: nn.Module, train: dict) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95); weight decay on matrices only (not on norms, biases, scalars). The
    parameter source's weights (the plane / parameter heads) learn at ``train.parameter_lr_scale``
    times the learning rate (each group's ``lr_scale``, applied by the schedule in :func:`train`)."""
    source = getattr(model, "source", None)
    heads = {id(p) for p in source.parameters()} if source is not None else set()
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for is_head, scale in ((False, 1.0), (True, train["parameter_lr_scale"])):
        for decays in (True, False):
            params = [p for p in trainable if (id(p) in heads) == is_head and (p.ndim >= 2) == decays]
            if params:
                groups.append({"params": params, "weight_decay": train["weight_decay"] if decays else 0.0,
                               "lr_scale": scale})
    return torch.optim.AdamW(groups, lr=train["lr"], betas=(0.9, 0.95))


def perceptual_loss(config: dict, device: torch.device):
    """The frozen LPIPS module when ``train.perceptual_weight > 0`` (needs local ``eval.lpips_weights``)."""
    if not config["train"]["perceptual_weight"]:
        return None
    weights = config["eval"]["lpips_weights"]
    if not weights:
        raise ConfigError("train.perceptual_weight > 0 needs local LPIPS weights in eval.lpips_weights")
    return LPIPS(weights).to(device)


# ----------------------------------------------------------------------------- distributed
@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this call created the process group (and destroys it at the end)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_option: str) -> DistContext:
    """Join the torchrun process group when ``WORLD_SIZE > 1`` (gloo on CPU, nccl on GPU)."""
    use_cuda = check_device(device_option, "train.device").type == "cuda"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistContext(device=torch.device("cuda" if use_cuda else "cpu"))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return DistContext(rank, world_size, device, owns_group)


# ----------------------------------------------------------------------------- resume
class TrainingError(InputError):
    """A run that cannot go on: its loss or gradients stayed non-finite (too high a learning rate, bad
    data...): the config's doing, so it is reported as a one-line input error."""


@dataclass
class _Origin:
    """Where a training segment starts."""

    config: dict  # the run's config: stored in its checkpoints and config.yaml
    step: int
    state: dict = field(default_factory=dict)  # the resumed checkpoint's training state
    resumed: bool = False
    overrides: dict = field(default_factory=dict)  # harmless keys that differ from the run's config


def _start(config: dict, checkpoint: Path, model: nn.Module, optimizer, world_size: int) -> _Origin:
    """Resume from ``checkpoint`` (refused under a config that changes the trajectory), else step 0,
    from ``train.init_from``'s model weights when set."""
    if not checkpoint.is_file():
        if config["train"]["init_from"]:
            load_checkpoint(config["train"]["init_from"], model)
        return _Origin(config, 0)
    stored = load_checkpoint(checkpoint)  # metadata only: compare before loading anything
    refused, harmless = resume_differences(stored["config"], config)
    ranks = stored["state"].get("world_size", world_size)
    if ranks != world_size:
        refused["torchrun ranks"] = (ranks, world_size)
    if refused:
        changes = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in refused.items())
        raise ConfigError(f"{checkpoint} was trained under another config ({changes}); resume with the run's "
                          f"config.yaml, or train into a new train.out (train.init_from: {checkpoint} fine-tunes "
                          "from its weights)")
    info = load_checkpoint(checkpoint, model, optimizer, restore_rng=True)
    return _Origin(stored["config"], info["step"], info["state"], True, {k: list(v) for k, v in harmless.items()})


class _Sigterm:
    """While entered on the main thread, SIGTERM sets ``requested`` instead of killing the process; the
    previous handler comes back on exit."""

    def __init__(self) -> None:
        self.requested, self._installed, self._previous = False, False, None

    def _request(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> "_Sigterm":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._request)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)


def _any_rank(flag: bool, ctx: DistContext) -> bool:
    """``flag`` on any rank (one all-reduce under DDP), so that all ranks stop at the same step."""
    if ctx.world_size == 1:
        return flag
    value = torch.tensor([float(flag)], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    model: LVSM
    step: int
    skipped_steps: int  # over the whole run, resumed segments included
    last_loss: float  # of the last finite step (NaN when no step was finite, or unknown: a v1 checkpoint)
    out: Path
    outcome: str = "completed"  # completed | stopped (stop_at) | terminated (SIGTERM) | already trained


def _image_grid(batch, prediction: Tensor) -> Tensor:
    """``(3, H, W*(Vc+2))``: context views | prediction | ground truth of the first sample/target."""
    Vc = int(batch.num_context)
    views = [*batch.images[0, :Vc], prediction[0, 0], batch.images[0, Vc]]
    return torch.cat([v.detach().float().clamp(0, 1).cpu() for v in views], dim=-1)


def _log_plane_accuracy(writer, out: Path, step: int, accuracy: dict | None,
                        parameter_grad_norm: float | None) -> None:
    """The 8 plane errors to TensorBoard (``planes/<group>/<metric>``) and ``out/plane_accuracy.jsonl``,
    with the parameter heads' gradient norm (nothing when ``accuracy`` is None: no predicted planes
    or no ground truth)."""
    if accuracy is None:
        return
    for group in GROUPS:
        for metric in METRICS:
            writer.add_scalar(f"planes/{group}/{metric}", accuracy[group][metric], step)
    record = accuracy if parameter_grad_norm is None else {**accuracy, "parameter_grad_norm": parameter_grad_norm}
    append_log(out / LOG_NAME, step, record)


def parameter_grad_norm(model) -> float | None:
    """The 2-norm of the gradients of the parameter source's trainable parameters (the plane heads,
    ...), before clipping; None for a model without them or before any backward pass."""
    grads = [p.grad for p in (model.source.parameters() if model.source is not None else ()) if p.grad is not None]
    if not grads:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))


def _forward_backward(net, model, optimizer, batch, opts: dict, perceptual, ctx: DistContext,
                      measure_heads: bool = False):
    """Model output, loss, gradients and clipping for one batch; ``finite`` is agreed on by all ranks.
    ``measure_heads``: also return the parameter heads' gradient norm before clipping (else None;
    it costs a device sync, so only logged steps ask for it)."""
    num_context = int(batch.num_context)
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bool(opts["bf16"])):
        output = net(batch)
    prediction = output.images
    target = batch.images[:, num_context:].float()
    loss = F.mse_loss(prediction.float(), target)
    if perceptual is not None:
        distance = perceptual(prediction.float().flatten(0, 1), target.flatten(0, 1))
        loss = loss + opts["perceptual_weight"] * distance.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    heads_norm = parameter_grad_norm(model) if measure_heads else None
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), opts["grad_clip"])
    finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
    if ctx.world_size > 1:  # every rank skips together
        flag = finite.float().to(ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        finite = flag > 0
    return output, loss.detach(), grad_norm, heads_norm, bool(finite)


def train(config: dict, *, stop_at: int | None = None, progress: bool = True, dataset=None) -> TrainResult:
    """Train (resuming from ``out/checkpoint.safetensors`` when present; docs/model.md, "Training").

    ``stop_at``: save a checkpoint and return after this step (as if the run were killed there).
    ``dataset``: the training dataset to use instead of ``build_dataset(config, "train")`` (e.g.
    one :class:`CachedDataset` shared by several runs, so its scenes are rendered once).
    Raises :class:`ConfigError` for a resume under a config that changes the trajectory and
    :class:`TrainingError` after ``train.max_nonfinite_steps`` consecutive non-finite steps; on
    SIGTERM it saves the step reached and returns (``outcome == "terminated"``).
    """
    check_config(config)  # also a config dict edited after resolve()
    ctx = setup_distributed(config["train"]["device"])
    try:
        return _train(config, ctx, stop_at, progress, dataset)
    finally:
        if ctx.owns_group:
            dist.destroy_process_group()


def _train(config: dict, ctx: DistContext, stop_at: int | None, progress: bool, dataset) -> TrainResult:
    from tqdm import tqdm

    opts = config["train"]
    if opts["threads"]:
        torch.set_num_threads(int(opts["threads"]))
    out = Path(opts["out"])
    began, tick = datetime.now(timezone.utc), time.perf_counter()
    torch.manual_seed(opts["seed"])
    model = build_model(config).to(ctx.device)
    optimizer = make_optimizer(model, opts)
    checkpoint = out / CHECKPOINT_NAME
    origin = _start(config, checkpoint, model, optimizer, ctx.world_size)
    start = origin.step
    skipped, loss_value = origin.state.get("skipped_steps", 0), origin.state.get("last_loss", float("nan"))
    end = opts["steps"] if stop_at is None else min(stop_at, opts["steps"])
    if start >= end:
        logger.info("%s is already at step %d (train.steps %d); nothing to train", checkpoint, start, opts["steps"])
        return TrainResult(model, start, skipped, loss_value, out, "already trained")
    if ctx.is_main:
        if not origin.overrides:  # a new run, or the run's own config
            save_config(origin.config, out)
        counts = count_parameters(model)
        logger.info("model %s: %d parameters (%d trainable)", config["model"]["encoding"], counts["total"],
                    counts["trainable"])
    net = model
    if ctx.world_size > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    if dataset is None:
        dataset = build_dataset(config, "train")
    perceptual = perceptual_loss(config, ctx.device)
    writer = None
    if ctx.is_main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"))

    def save(step: int) -> None:
        if ctx.is_main:
            state = {"last_loss": loss_value, "skipped_steps": skipped, "world_size": ctx.world_size}
            save_checkpoint(checkpoint, model, optimizer, step, origin.config, state)

    num_context = config["data"]["num_context"]
    saved = start if origin.resumed else None  # the step of the checkpoint on disk
    reached, streak, outcome = start, 0, "failed"
    bar = tqdm(range(start, end), initial=start, total=opts["steps"], disable=not (progress and ctx.is_main),
               desc=f"train {config['model']['encoding']}", dynamic_ncols=True)
    rate_tick, tick_step = time.perf_counter(), start
    model.train()
    loader = StepLoader(dataset, opts["seed"], ctx.rank, opts["batch_size"], config["data"]["prefetch"])
    try:
        with _Sigterm() as sigterm:
            for step in bar:
                lr = learning_rate(step, opts)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # checkpoints older than lr_scale: 1
                batch = collate(loader.scenes(step, prefetch_next=step + 1 < end), num_context, ctx.device)
                logged = ctx.is_main and ((step + 1) % opts["log_every"] == 0 or step + 1 == end)
                output, loss, grad_norm, heads_norm, finite = _forward_backward(net, model, optimizer, batch, opts,
                                                                                perceptual, ctx, measure_heads=logged)
                done = reached = step + 1
                if finite:
                    optimizer.step()
                    loss_value, streak = float(loss), 0
                else:  # the step counter still advances, so checkpoints and resume stay on schedule
                    skipped, streak = skipped + 1, streak + 1
                    logger.warning("step %d: non-finite loss or gradient (loss %s, grad norm %s); step skipped",
                                   step, float(loss), float(grad_norm))
                    if writer is not None:
                        writer.add_scalar("train/skipped_steps", skipped, step)
                    if streak >= opts["max_nonfinite_steps"]:
                        outcome = "diverged"
                        last = f"step {saved} in {checkpoint}" if saved is not None else "none was written"
                        raise TrainingError(
                            f"training diverged: {streak} consecutive non-finite steps ({done - streak}-{step}) "
                            f"reached train.max_nonfinite_steps = {opts['max_nonfinite_steps']}; last good "
                            f"checkpoint: {last}")
                if finite and logged:
                    now = time.perf_counter()
                    rate = (done - tick_step) / max(now - rate_tick, 1e-9)
                    rate_tick, tick_step = now, done
                    bar.set_postfix(loss=f"{loss_value:.4f}", steps_per_s=f"{rate:.2f}")
                    writer.add_scalar("train/loss", loss_value, done)
                    writer.add_scalar("train/lr", lr, done)
                    writer.add_scalar("train/grad_norm", float(grad_norm), done)
                    if heads_norm is not None:
                        writer.add_scalar("train/parameter_grad_norm", heads_norm, done)
                    writer.add_scalar("train/steps_per_s", rate, done)
                    _log_plane_accuracy(writer, out, done, plane_accuracy(output.parameters, batch, model), heads_norm)
                if finite and ctx.is_main and opts["image_every"] and done % opts["image_every"] == 0:
                    writer.add_image("train/context|prediction|target", _image_grid(batch, output.images), done)
                if done % opts["checkpoint_every"] == 0:
                    save(done)
                    saved = done
                if done < end and _any_rank(sigterm.requested, ctx):
                    outcome = "terminated"
                    break
            if saved != reached:
                save(reached)
                saved = reached
        if outcome == "terminated":
            logger.warning("SIGTERM: stopped after step %d of %d; checkpoint %s saved; run the same command to "
                           "resume", reached, opts["steps"], checkpoint)
        else:
            outcome = "completed" if reached == opts["steps"] else "stopped"
    finally:  # release the prefetch thread and the log writer on errors too; record the segment
        bar.close()
        loader.close()
        if writer is not None:
            writer.close()
        if ctx.is_main:
            append_segment(out, {
                "start_step": start, "end_step": reached, "checkpoint_step": saved, "outcome": outcome,
                "resumed_from_step": start if origin.resumed else None,
                "init_from": None if origin.resumed else opts["init_from"], "overrides": origin.overrides,
                "started": began.isoformat(timespec="seconds"), "seconds": round(time.perf_counter() - tick, 3),
                "hrope": __version__, "torch": torch.__version__, **code_provenance(),
                "config_sha256": config_hash(config),
            })
    return TrainResult(model, reached, skipped, loss_value, out, outcome)
