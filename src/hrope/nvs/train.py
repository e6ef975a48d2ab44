"""Training loop: AdamW + warmup/cosine, clipping, bf16, NaN guard, exact resume, DDP.

``train(config)`` trains the LVSM model of ``config["model"]`` on the dataset of
``config["data"]`` and writes into ``config["train"]["out"]``: ``config.yaml`` (resolved config),
``checkpoint.safetensors`` (atomic), ``tb/`` (TensorBoard scalars and image grids) and, for
predicted planes on data with ground-truth planes, ``plane_accuracy.jsonl``
(:mod:`hrope.nvs.plane_accuracy` of the logged steps' training batches; a resumed run appends).

Exact resume: batches are a pure function of (seed, step, rank) (:func:`batch_indices`), the
learning rate a pure function of the step (:func:`learning_rate`), and the checkpoint holds the
model, the AdamW state, the step and the RNG state, so a run killed after checkpoint k and
resumed ends with the same parameters as an uninterrupted one (bit-equal on the same machine).

DDP: launch with ``torchrun --nproc_per_node N -m hrope.nvs.cli train ...``; gloo on CPU, nccl on
GPU. Each rank draws its own batch; gradients are averaged; rank 0 writes outputs.
"""

from __future__ import annotations

import logging
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoints import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .config import ConfigError, save_config
from .data.rng import stream_seed
from .datasets import build_dataset, collate
from .metrics import LPIPS
from .model import LVSM, build_model, count_parameters
from .plane_accuracy import GROUPS, LOG_NAME, METRICS, append_log, plane_accuracy

__all__ = ["train", "TrainResult", "StepLoader", "learning_rate", "batch_indices", "make_optimizer",
           "perceptual_loss", "setup_distributed"]

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
    use_cuda = torch.cuda.is_available() if device_option == "auto" else device_option == "cuda"
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


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    model: LVSM
    step: int
    skipped_steps: int
    last_loss: float
    out: Path


def _image_grid(batch, prediction: Tensor) -> Tensor:
    """``(3, H, W*(Vc+2))``: context views | prediction | ground truth of the first sample/target."""
    Vc = int(batch.num_context)
    views = [*batch.images[0, :Vc], prediction[0, 0], batch.images[0, Vc]]
    return torch.cat([v.detach().float().clamp(0, 1).cpu() for v in views], dim=-1)


def _log_plane_accuracy(writer, out: Path, step: int, accuracy: dict | None) -> None:
    """The 8 plane errors to TensorBoard (``planes/<group>/<metric>``) and ``out/plane_accuracy.jsonl``
    (nothing when ``accuracy`` is None: no predicted planes or no ground truth)."""
    if accuracy is None:
        return
    for group in GROUPS:
        for metric in METRICS:
            writer.add_scalar(f"planes/{group}/{metric}", accuracy[group][metric], step)
    append_log(out / LOG_NAME, step, accuracy)


def _forward_backward(net, model, optimizer, batch, opts: dict, perceptual, ctx: DistContext):
    """Model output, loss, gradients and clipping for one batch; ``finite`` is agreed on by all ranks."""
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
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), opts["grad_clip"])
    finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)
    if ctx.world_size > 1:  # every rank skips together
        flag = finite.float().to(ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        finite = flag > 0
    return output, loss.detach(), grad_norm, bool(finite)


def train(config: dict, *, stop_at: int | None = None, progress: bool = True, dataset=None) -> TrainResult:
    """Train (resuming from ``out/checkpoint.safetensors`` when present).

    ``stop_at``: save a checkpoint and return after this step (as if the run were killed there).
    ``dataset``: the training dataset to use instead of ``build_dataset(config, "train")`` (e.g.
    one :class:`CachedDataset` shared by several runs, so its scenes are rendered once).
    """
    from tqdm import tqdm

    opts = config["train"]
    for key in ("steps", "batch_size", "warmup", "checkpoint_every", "log_every"):
        if not isinstance(opts[key], int) or opts[key] < (0 if key == "warmup" else 1):
            kind = "a non-negative" if key == "warmup" else "a positive"
            raise ConfigError(f"train.{key} must be {kind} integer, got {opts[key]!r}")
    ctx = setup_distributed(opts["device"])
    if opts["threads"]:
        torch.set_num_threads(int(opts["threads"]))
    out = Path(opts["out"])
    torch.manual_seed(opts["seed"])
    model = build_model(config).to(ctx.device)
    optimizer = make_optimizer(model, opts)
    checkpoint = out / CHECKPOINT_NAME
    start = 0
    if checkpoint.is_file():
        start = load_checkpoint(checkpoint, model, optimizer, restore_rng=True)["step"]
    if ctx.is_main:
        save_config(config, out)
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
    num_context = config["data"]["num_context"]
    skipped, loss_value, saved = 0, float("nan"), start
    end = opts["steps"] if stop_at is None else min(stop_at, opts["steps"])
    bar = tqdm(range(start, end), initial=start, total=opts["steps"], disable=not (progress and ctx.is_main),
               desc=f"train {config['model']['encoding']}", dynamic_ncols=True)
    tick, tick_step = time.perf_counter(), start
    model.train()
    loader = StepLoader(dataset, opts["seed"], ctx.rank, opts["batch_size"], config["data"]["prefetch"])
    try:
        for step in bar:
            lr = learning_rate(step, opts)
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)  # checkpoints older than lr_scale: 1
            batch = collate(loader.scenes(step, prefetch_next=step + 1 < end), num_context, ctx.device)
            output, loss, grad_norm, finite = _forward_backward(net, model, optimizer, batch, opts, perceptual, ctx)
            done = step + 1
            if finite:
                optimizer.step()
                loss_value = float(loss)
            else:  # the step counter still advances, so checkpoints and resume stay on schedule
                skipped += 1
                logger.warning("step %d: non-finite loss or gradient (loss %s, grad norm %s); step skipped",
                               step, float(loss), float(grad_norm))
                if writer is not None:
                    writer.add_scalar("train/skipped_steps", skipped, step)
            if finite and ctx.is_main and (done % opts["log_every"] == 0 or done == end):
                now = time.perf_counter()
                rate = (done - tick_step) / max(now - tick, 1e-9)
                tick, tick_step = now, done
                bar.set_postfix(loss=f"{loss_value:.4f}", steps_per_s=f"{rate:.2f}")
                writer.add_scalar("train/loss", loss_value, done)
                writer.add_scalar("train/lr", lr, done)
                writer.add_scalar("train/grad_norm", float(grad_norm), done)
                writer.add_scalar("train/steps_per_s", rate, done)
                _log_plane_accuracy(writer, out, done, plane_accuracy(output.parameters, batch, model))
            if finite and ctx.is_main and opts["image_every"] and done % opts["image_every"] == 0:
                writer.add_image("train/context|prediction|target", _image_grid(batch, output.images), done)
            if ctx.is_main and done % opts["checkpoint_every"] == 0:
                save_checkpoint(checkpoint, model, optimizer, done, config)
                saved = done
        final_step = max(end, start)
        if ctx.is_main and (saved != final_step or not checkpoint.is_file()):
            save_checkpoint(checkpoint, model, optimizer, final_step, config)
    finally:  # release the prefetch thread, the log writer and the process group on errors too
        bar.close()
        loader.close()
        if writer is not None:
            writer.close()
        if ctx.owns_group:
            dist.destroy_process_group()
    return TrainResult(model=model, step=final_step, skipped_steps=skipped, last_loss=loss_value, out=out)
