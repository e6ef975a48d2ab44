"""Training loop: AdamW + warmup/cosine, clipping, bf16, NaN guard, exact and safe resume, DDP.

``train(config)`` trains the LVSM model of ``config.model`` on the dataset of
``config.data`` and writes into ``config.train.out``: ``config.yaml`` (the config's plain form),
``checkpoint.safetensors`` (atomic, checksummed), ``segments.jsonl`` (one line of provenance per
training segment), ``tb/`` (TensorBoard scalars and image grids) and, for predicted planes on data
with ground-truth planes, ``plane_accuracy.jsonl`` (:mod:`hrope.nvs.evaluation.plane_accuracy` of the logged
steps' training batches; a resumed run appends).

The loop is :class:`Trainer`, read top to bottom: its constructor builds the model and the
optimiser and resumes; :meth:`~Trainer.setup` opens the data, the loss and the logs;
:meth:`~Trainer.step` takes one step (:func:`hrope.nvs.running.train_step.train_step`: schedule, forward,
loss, backward, clipping, update) and logs it (:meth:`~Trainer.log`); :meth:`~Trainer.save` writes
the checkpoint; :meth:`~Trainer.run` loops, stops and records the segment.

Exact resume: batches are a pure function of (seed, step, rank) (:func:`batch_indices`), the
learning rate a pure function of the step (:func:`hrope.nvs.running.train_step.learning_rate`), and the
checkpoint holds the model, the AdamW state, the step and the RNG state, so a run killed after
checkpoint k and resumed ends with the same parameters as an uninterrupted one (bit-equal on the
same machine). Safe resume: a resume under a config that changes the trajectory is refused
(:func:`hrope.nvs.running.runs.resume_differences`); ``train.init_from`` starts a new run from another run's weights.
SIGTERM finishes the current step, saves and returns; ``train.max_nonfinite_steps`` consecutive
non-finite steps stop the run with a :class:`TrainingError`.

DDP (:mod:`hrope.nvs.running.distributed`): launch with ``torchrun --nproc_per_node N -m hrope.nvs.cli
train ...``. Each rank draws its own batch; gradients are averaged; rank 0 writes outputs.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ... import __version__
from ...errors import InputError
from .atomic import StorageError
from .checkpoints import CHECKPOINT_NAME, checkpoint_step, load_checkpoint, resumable, save_checkpoint
from ..config import ConfigError, RunConfig, save_config
from ..data.rng import stream_seed
from ..build_data import build_dataset, collate
from .distributed import (
    DistContext,
    RankFailedError,
    any_rank,
    from_main,
    is_communication_error,
    publish_failure,
    setup_distributed,
)
from .folder_lock import FolderInUseError, FolderLock
from ..model import LVSM, build_model, count_parameters
from ..evaluation.plane_accuracy import GROUPS, LOG_NAME, METRICS, append_log, plane_accuracy
from ..pretrained import init_weights
from .provenance import code_provenance
from .runs import append_segment, config_hash, resume_differences
from .train_step import StepResult, make_optimizer, perceptual_loss, train_step

__all__ = ["train", "Trainer", "TrainResult", "TrainingError", "StepLoader", "batch_indices"]

logger = logging.getLogger("hrope.nvs.running.train")


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


def batch_indices(seed: int, step: int, rank: int, batch_size: int, num_scenes: int) -> list[int]:
    """Scene indices of one rank's batch at ``step`` (deterministic; independent of history)."""
    generator = torch.Generator().manual_seed(stream_seed("batch", seed, step, rank))
    return torch.randint(num_scenes, (batch_size,), generator=generator).tolist()


# ----------------------------------------------------------------------------- resume
class TrainingError(InputError):
    """A run that cannot go on: its loss or gradients stayed non-finite (too high a learning rate, bad
    data...): the config's doing, so it is reported as a one-line input error."""


@dataclass
class _Origin:
    """Where a training segment starts."""

    config: RunConfig  # the run's config: stored in its checkpoints and config.yaml
    step: int
    state: dict = field(default_factory=dict)  # the resumed checkpoint's training state
    resumed: bool = False
    overrides: dict = field(default_factory=dict)  # harmless keys that differ from the run's config


def _start(config: RunConfig, checkpoint: Path, model: nn.Module, optimizer, world_size: int) -> _Origin:
    """Resume from ``checkpoint`` (refused under a config that changes the trajectory), else step 0,
    from ``train.init_from``'s model weights when set (:func:`hrope.nvs.pretrained.init_weights`)."""
    if not checkpoint.is_file():
        if config.train.init_from:
            init_weights(config.train.init_from, model)
        return _Origin(config, 0)
    stored = load_checkpoint(checkpoint)  # metadata only: compare before loading anything
    refused, harmless = resume_differences(stored["config"], config)
    ranks = stored["state"].get("world_size", world_size)
    if ranks != world_size:
        refused["torchrun ranks"] = (ranks, world_size)
    if refused:
        changes = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in refused.items())
        raise ConfigError(
            f"{checkpoint} was trained under another config ({changes}); resume with the run's "
            f"config.yaml, or train into a new train.out (train.init_from: {checkpoint} fine-tunes "
            "from its weights)"
        )
    info = load_checkpoint(checkpoint, model, optimizer, restore_rng=True)
    return _Origin(stored["config"], info["step"], info["state"], True, {k: list(v) for k, v in harmless.items()})


class _Sigterm:
    """While entered on the main thread, SIGTERM sets ``requested`` instead of killing the process; the
    previous handler comes back on exit."""

    def __init__(self) -> None:
        self.requested, self._installed = False, False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None

    def _request(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> _Sigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._request)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)


# ----------------------------------------------------------------------------- the loop
@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model, the step reached and how the segment ended."""

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


def _log_plane_accuracy(writer, out: Path, step: int, accuracy: dict | None, parameter_grad_norm: float | None) -> None:
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


class Trainer:
    """One training segment of the run in ``train.out``: from the step it starts at (0, or the
    resumed checkpoint's) to ``stop_at`` or ``train.steps``.

    The constructor sets the CPU threads and the seed, builds the model and its optimiser and
    resumes (:func:`_start`); :meth:`run` does the rest. :func:`train` is the entry point.
    """

    def __init__(self, config: RunConfig, ctx: DistContext, stop_at: int | None = None) -> None:
        self.config, self.opts, self.ctx = config, config.train, ctx
        if self.opts.threads:
            torch.set_num_threads(self.opts.threads)
        self.out = Path(self.opts.out)
        self.began, self.tick = datetime.now(timezone.utc), time.perf_counter()
        torch.manual_seed(self.opts.seed)
        self.model = build_model(config).to(ctx.device)
        self.optimizer = make_optimizer(self.model, self.opts)
        self.checkpoint = self.out / CHECKPOINT_NAME
        self.origin = _start(config, self.checkpoint, self.model, self.optimizer, ctx.world_size)
        self.start = self.reached = self.origin.step  # reached: the steps taken so far
        self.saved = self.start if self.origin.resumed else None  # the step of the checkpoint on disk
        self.skipped = self.origin.state.get("skipped_steps", 0)
        self.loss_value = self.origin.state.get("last_loss", float("nan"))  # of the last finite step
        self.end = self.opts.steps if stop_at is None else min(stop_at, self.opts.steps)
        self.streak, self.outcome = 0, "failed"  # consecutive non-finite steps; the outcome until known

    def setup(self, dataset=None, progress: bool = True) -> None:
        """``config.yaml`` (unless resumed under harmless overrides), the DDP wrapper, the data
        (``dataset``, else the config's), the perceptual loss, TensorBoard, the progress bar and the
        step loader; rank 0 writes."""
        from tqdm import tqdm

        config, opts, ctx = self.config, self.opts, self.ctx
        if ctx.is_main:
            if not self.origin.overrides:  # a new run, or the run's own config
                save_config(self.origin.config, self.out)
            counts = count_parameters(self.model)
            logger.info(
                "model %s: %d parameters (%d trainable)",
                config.model.encoding,
                counts["total"],
                counts["trainable"],
            )
        self.net: nn.Module = self.model
        if ctx.world_size > 1:
            device_ids = [ctx.device] if ctx.device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)
        if dataset is None:
            dataset = build_dataset(config, "train")
        self.perceptual = perceptual_loss(config, ctx.device)
        self.writer = None
        if ctx.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tb"))
        self.bar = tqdm(
            range(self.start, self.end),
            initial=self.start,
            total=opts.steps,
            disable=not (progress and ctx.is_main),
            desc=f"train {config.model.encoding}",
            dynamic_ncols=True,
        )
        self.rate_tick, self.tick_step = time.perf_counter(), self.start
        self.model.train()
        self.loader = StepLoader(dataset, opts.seed, ctx.rank, opts.batch_size, config.data.prefetch)

    def step(self, step: int) -> StepResult:
        """Train on the batch of ``step`` (then ``reached == step + 1``): a step without update is
        skipped (:meth:`skip`), an applied one logged on the logged steps and image steps."""
        scenes = self.loader.scenes(step, prefetch_next=step + 1 < self.end)
        batch = collate(scenes, self.config.data.num_context, self.ctx.device)
        done = step + 1
        logged = self.ctx.is_main and (done % self.opts.log_every == 0 or done == self.end)
        result = train_step(self.net, self.optimizer, batch, step, self.opts, self.perceptual, measure_heads=logged)
        self.reached = done
        if not result.applied:
            self.skip(step, result)
            return result
        self.loss_value, self.streak = float(result.loss), 0
        if logged:
            self.log(done, result, batch)
        if self.writer is not None and self.opts.image_every and done % self.opts.image_every == 0:
            self.writer.add_image("train/context|prediction|target", _image_grid(batch, result.output.images), done)
        return result

    def skip(self, step: int, result: StepResult) -> None:
        """Count a step without update (the step counter still advances, so checkpoints and resume stay
        on schedule): a finite one's gradient norm exceeded ``train.skip_grad_factor`` times the clip;
        ``train.max_nonfinite_steps`` non-finite ones in a row stop the run with a :class:`TrainingError`."""
        self.skipped, self.streak = self.skipped + 1, 0 if result.finite else self.streak + 1
        reason = (
            "gradient norm above train.skip_grad_factor x grad_clip" if result.finite else "non-finite loss or gradient"
        )
        loss, norm = float(result.loss), float(result.grad_norm)
        logger.warning("step %d: %s (loss %s, grad norm %s); step skipped", step, reason, loss, norm)
        if self.writer is not None:
            self.writer.add_scalar("train/skipped_steps", self.skipped, step)
        if self.streak >= self.opts.max_nonfinite_steps:
            self.outcome = "diverged"
            last = f"step {self.saved} in {self.checkpoint}" if self.saved is not None else "none was written"
            raise TrainingError(
                f"training diverged: {self.streak} consecutive non-finite steps ({step + 1 - self.streak}-{step}) "
                f"reached train.max_nonfinite_steps = {self.opts.max_nonfinite_steps}; last good "
                f"checkpoint: {last}"
            )

    def log(self, done: int, result: StepResult, batch) -> None:
        """Rank 0's record of step ``done``: loss and steps/s on the progress bar; loss, learning rate,
        gradient norms and steps/s in TensorBoard (``train/*``); the plane accuracy."""
        assert self.writer is not None, "only rank 0 logs, and it has the writer"
        now = time.perf_counter()
        rate = (done - self.tick_step) / max(now - self.rate_tick, 1e-9)
        self.rate_tick, self.tick_step = now, done
        self.bar.set_postfix(loss=f"{self.loss_value:.4f}", steps_per_s=f"{rate:.2f}")
        self.writer.add_scalar("train/loss", self.loss_value, done)
        self.writer.add_scalar("train/lr", result.lr, done)
        self.writer.add_scalar("train/grad_norm", float(result.grad_norm), done)
        if result.heads_norm is not None:
            self.writer.add_scalar("train/parameter_grad_norm", result.heads_norm, done)
        self.writer.add_scalar("train/steps_per_s", rate, done)
        accuracy = plane_accuracy(result.output.parameters, batch, self.model)
        _log_plane_accuracy(self.writer, self.out, done, accuracy, result.heads_norm)

    def save(self, step: int) -> None:
        """The checkpoint of ``step`` (rank 0 writes it): model, AdamW and RNG state, the run's config,
        the last finite loss, the skipped steps and the number of ranks."""
        if self.ctx.is_main:
            state = {"last_loss": self.loss_value, "skipped_steps": self.skipped, "world_size": self.ctx.world_size}
            save_checkpoint(self.checkpoint, self.model, self.optimizer, step, self.origin.config, state)
        self.saved = step

    def run(self, dataset=None, progress: bool = True, sigterm: _Sigterm | None = None) -> TrainResult:
        """Set up (:meth:`setup`) and train to ``end``: a checkpoint every ``train.checkpoint_every``
        steps and at the end; on SIGTERM (on any rank) after the current step; the segment is recorded
        whatever happens once set up. ``sigterm``: an entered :class:`_Sigterm` of the caller (else
        SIGTERM is caught while the loop runs)."""
        if self.start >= self.end:
            logger.info(
                "%s is already at step %d (train.steps %d); nothing to train",
                self.checkpoint,
                self.start,
                self.opts.steps,
            )
            return self.result("already trained")
        self.setup(dataset, progress)
        try:
            with nullcontext(sigterm) if sigterm is not None else _Sigterm() as sigterm:
                for step in self.bar:
                    self.step(step)
                    if self.reached % self.opts.checkpoint_every == 0:
                        self.save(self.reached)
                    if self.reached < self.end and any_rank(sigterm.requested, self.ctx):
                        self.outcome = "terminated"
                        break
                if self.saved != self.reached:
                    self.save(self.reached)
            self.stopped()
        finally:
            self.close()
        return self.result(self.outcome)

    def stopped(self) -> None:
        """The outcome of a loop that ended without an error (a warning on how to resume after SIGTERM)."""
        if self.outcome == "terminated":
            logger.warning(
                "SIGTERM: stopped after step %d of %d; checkpoint %s saved; run the same command to resume",
                self.reached,
                self.opts.steps,
                self.checkpoint,
            )
        else:
            self.outcome = "completed" if self.reached == self.opts.steps else "stopped"

    def close(self) -> None:
        """Release the prefetch thread and the log writer (on errors too) and record the segment; a
        failed segment the file system refuses to record is logged, so that its own error goes on."""
        self.bar.close()
        self.loader.close()
        if self.writer is not None:
            self.writer.close()
        if self.ctx.is_main:
            try:
                append_segment(self.out, self.segment())
            except StorageError as error:
                if self.outcome not in ("failed", "diverged"):  # no error of the segment's own is under way
                    raise
                logger.warning("the segment is not recorded: %s", error)

    def segment(self) -> dict:
        """This segment's line of ``segments.jsonl``: steps, outcome, origin, timing and provenance."""
        origin = self.origin
        return {
            "start_step": self.start,
            "end_step": self.reached,
            "checkpoint_step": self.saved,
            "outcome": self.outcome,
            "resumed_from_step": self.start if origin.resumed else None,
            "init_from": None if origin.resumed else self.opts.init_from,
            "overrides": origin.overrides,
            "started": self.began.isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - self.tick, 3),
            "hrope": __version__,
            "torch": torch.__version__,
            **code_provenance(),
            "config_sha256": config_hash(self.config),
        }

    def result(self, outcome: str) -> TrainResult:
        return TrainResult(self.model, self.reached, self.skipped, self.loss_value, self.out, outcome)


@contextmanager
def _locked_run_folder(out: Path, ctx: DistContext) -> Iterator[None]:
    """Rank 0 holds ``out``'s :class:`FolderLock` while the block runs; when another process holds
    it, every rank raises the same :class:`FolderInUseError` (rank 0's message)."""
    lock, refusal = FolderLock(out, "train.out"), None
    if ctx.is_main:
        try:
            lock.acquire()
        except FolderInUseError as error:
            refusal = str(error)
    refusal = from_main(refusal, ctx)
    if refusal is not None:
        raise FolderInUseError(refusal)
    try:
        yield
    finally:
        lock.release()


def _first_sentence(error: Exception) -> str:
    """The first sentence of ``error``'s message, without a leading ``[source:line]`` (gloo's)."""
    line = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip().split("\n")[0])
    return re.split(r"(?<=\.)\s", line)[0][:200] or type(error).__name__


def _fail_together(error: Exception, ctx: DistContext, checkpoint: Path) -> None:
    """Under DDP: publish this rank's failure (:func:`hrope.nvs.running.distributed.publish_failure`); a
    collective that failed because another rank failed or cannot be reached becomes a
    :class:`RankFailedError` naming that rank's error and the last checkpoint (any other error
    is left to propagate)."""
    first = publish_failure(error, ctx)
    if not is_communication_error(error):
        return
    step = checkpoint_step(checkpoint)
    last = "no checkpoint was written" if step is None else f"last checkpoint: step {step} in {checkpoint}"
    if first is not None and not first.startswith(f"rank {ctx.rank}: "):
        raise RankFailedError(f"{first}; rank {ctx.rank} stopped too ({last})") from error
    reason = _first_sentence(error)
    raise RankFailedError(
        f"rank {ctx.rank} lost contact with the other ranks: one was killed (SIGKILL, out of memory) or did not "
        f"answer within train.dist_timeout = {ctx.timeout:g} s ({reason}); {last}"
    ) from error


def train(config: RunConfig, *, stop_at: int | None = None, progress: bool = True, dataset=None) -> TrainResult:
    """Train (resuming from ``out/checkpoint.safetensors`` when present; docs/model.md, "Training").

    ``stop_at``: save a checkpoint and return after this step (as if the run were killed there).
    ``dataset``: the training dataset to use instead of ``build_dataset(config, "train")`` (e.g.
    one :class:`CachedDataset` shared by several runs, so its scenes are rendered once).
    The run folder is locked for the run (:class:`hrope.nvs.running.folder_lock.FolderLock`, rank 0):
    another process training into it raises :class:`FolderInUseError` naming the holder.
    Under torchrun a rank whose peers failed raises :class:`RankFailedError`
    (:mod:`hrope.nvs.running.distributed`, "Failure").
    Raises :class:`ConfigError` for a resume under a config that changes the trajectory,
    :class:`TrainingError` after ``train.max_nonfinite_steps`` consecutive non-finite steps and
    :class:`StorageError` for a write the file system refused (full, read-only: it names the
    checkpoint that is intact and the command that resumes from it); on
    SIGTERM it saves the step reached and returns (``outcome == "terminated"``).
    """
    ctx = setup_distributed(config.train.device, config.train.dist_timeout)
    # SIGTERM is caught from here to the end, so that torchrun, stopping the other ranks after one
    # failed, never kills this rank before it has raised its error
    with _Sigterm() as sigterm:
        try:
            with resumable(Path(config.train.out)), _locked_run_folder(Path(config.train.out), ctx):
                return Trainer(config, ctx, stop_at).run(dataset, progress, sigterm)
        except Exception as error:
            if ctx.world_size > 1:
                _fail_together(error, ctx, Path(config.train.out) / CHECKPOINT_NAME)
            raise
        finally:
            if ctx.owns_group:
                dist.destroy_process_group()
