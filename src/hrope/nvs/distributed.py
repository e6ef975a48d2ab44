"""Data-parallel training: joining the torchrun process group and agreeing across ranks.

Launch with ``torchrun --nproc_per_node N -m hrope.nvs.cli train ...``: gloo on CPU, nccl on GPU
(one device per rank, ``LOCAL_RANK``). A single process (``WORLD_SIZE`` unset or 1) joins no group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import check_device

__all__ = ["DistContext", "setup_distributed", "any_rank"]


@dataclass
class DistContext:
    """This process's rank, the number of ranks and its device; rank 0 writes the outputs."""

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


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """``flag`` on any rank (one all-reduce under DDP), so that all ranks stop at the same step."""
    if ctx.world_size == 1:
        return flag
    value = torch.tensor([float(flag)], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
