"""Data-parallel training: joining the torchrun process group, agreeing across ranks, failing together.

Launch with ``torchrun --nproc_per_node N -m hrope.nvs.cli train ...``: gloo on CPU, nccl on GPU
(one device per rank, ``LOCAL_RANK``). A single process (``WORLD_SIZE`` unset or 1) joins no group.

Failure: a collective waits at most ``train.dist_timeout`` seconds for the other ranks (the
process group's timeout). A rank that fails publishes its error in the group's key-value store
(:func:`publish_failure`; the first one published wins) before it exits. A rank whose collective
then fails (the peer's connection closed, or the timeout passed) stops with a
:class:`RankFailedError` that repeats the failed rank's error, or, when none was published (a rank
killed by SIGKILL or the out-of-memory killer), says that contact was lost. torchrun stops the
remaining ranks once one has exited with an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ...errors import InputError
from ..config.fields import one_line
from ..config.schema import check_device

__all__ = [
    "DistContext",
    "RankFailedError",
    "setup_distributed",
    "any_rank",
    "from_main",
    "publish_failure",
    "is_communication_error",
    "FAILURE_KEY",
]

FAILURE_KEY = "hrope/failure"


class RankFailedError(InputError):
    """This rank stopped because another rank failed or could no longer be reached."""


@dataclass
class DistContext:
    """This process's rank, the number of ranks and its device; rank 0 writes the outputs."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this call created the process group (and destroys it at the end)
    timeout: float = 600.0  # seconds a collective waits (the process group's timeout)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_option: str, timeout: float = 600.0) -> DistContext:
    """Join the torchrun process group when ``WORLD_SIZE > 1`` (gloo on CPU, nccl on GPU), its
    collectives bounded by ``timeout`` seconds."""
    use_cuda = check_device(device_option, "train.device").type == "cuda"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistContext(device=torch.device("cuda" if use_cuda else "cpu"), timeout=timeout)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout))
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return DistContext(rank, world_size, device, owns_group, timeout)


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """``flag`` on any rank (one all-reduce under DDP), so that all ranks stop at the same step."""
    if ctx.world_size == 1:
        return flag
    value = torch.tensor([float(flag)], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def from_main(value, ctx: DistContext):
    """Rank 0's ``value`` (a small picklable object, e.g. an error message or None) on every rank."""
    if ctx.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed: a peer's connection closed or the timeout passed."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    markers = ("gloo", "NCCL", "Connection closed", "Connection reset", "timed out", "Timed out")
    return isinstance(error, RuntimeError) and any(marker in text for marker in markers)


def publish_failure(error: BaseException, ctx: DistContext) -> str | None:
    """Publish ``rank R: Type: message`` of ``error`` unless a rank published first; returns the
    first published failure (None when the store cannot be reached)."""
    line = f"rank {ctx.rank}: {type(error).__name__}: {one_line(error)}"
    try:
        store = dist.distributed_c10d._get_default_store()
        return store.compare_set(FAILURE_KEY, "", line).decode("utf-8", "replace")
    except Exception:  # the store went with the rank that hosted it
        return None
