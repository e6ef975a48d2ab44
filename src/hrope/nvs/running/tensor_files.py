"""Safetensors files as the toolkit reads them: whole (:func:`read_safetensors`), checked
(:func:`checksum`), and into a model with one-line errors (:func:`load_model_state`).

Checkpoints (:mod:`hrope.nvs.running.checkpoints`) and saved models (:mod:`hrope.nvs.model_folder`)
are both safetensors files; a file that cannot be read or does not fit is a :class:`CheckpointError`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load
from torch import Tensor, nn

from ...errors import InputError

__all__ = ["CheckpointError", "MAX_HEADER_BYTES", "checksum", "listed", "load_model_state", "read_safetensors"]


class CheckpointError(InputError):
    """A missing, malformed, damaged or mismatched checkpoint file."""


def listed(keys: list[str], limit: int = 3) -> str:
    """``a, b, c (+N more)``: the first ``limit`` keys and a count of the rest."""
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def checksum(tensors: dict[str, Tensor], metadata: dict[str, str]) -> str:
    """sha256 over the metadata (sorted, without ``checksum``) and every tensor's name, dtype, shape and
    bytes (sorted by name); CPU tensors."""
    digest = hashlib.sha256()
    for key in sorted(metadata):
        if key != "checksum":
            digest.update(f"{key}\0{metadata[key]}\0".encode())
    for key in sorted(tensors):
        tensor = tensors[key].contiguous()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


# the format's own cap on the JSON header (safetensors refuses larger ones)
MAX_HEADER_BYTES = 100_000_000


def read_safetensors(path: str | Path, with_tensors: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors (none unless ``with_tensors``) and ``__metadata__`` of the safetensors file ``path``,
    read through one open file, so that a file replaced while it is read (a checkpoint that
    training rewrites) is read whole, old or new. ``safe_open`` opens the file by name twice (the
    header, then the tensor storage) and can pair one file's header with the next one's tensors.
    Raises ``ValueError`` (or safetensors' own error) for a file that is not safetensors; the
    whole file is held in memory while its tensors are copied out."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ValueError("the file is shorter than a safetensors header")
        size = int.from_bytes(prefix, "little")
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"the header claims {size} bytes")
        header_bytes = handle.read(size)
        if len(header_bytes) != size:
            raise ValueError("the header is cut short")
        header = json.loads(header_bytes)
        metadata = (header.get("__metadata__") or {}) if isinstance(header, dict) else None
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("the header is not a safetensors header")
        if not with_tensors:
            entries = [entry for key, entry in header.items() if key != "__metadata__"]
            end = max((int(entry["data_offsets"][1]) for entry in entries), default=0)
            if os.fstat(handle.fileno()).st_size != 8 + size + end:
                raise ValueError("the tensor data is cut short or followed by other bytes")
            return {}, metadata
        data = prefix + header_bytes + handle.read()
    return load(data), metadata


def load_model_state(model: nn.Module, state: dict[str, Tensor], source: str | Path) -> None:
    """``model.load_state_dict(state)`` (strict), or a one-line :class:`CheckpointError` naming the
    missing, unexpected and mis-shaped tensors of ``source``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} in the file, {tuple(v.shape)} in the model"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    )
    problems = [
        f"{name}: {listed(keys)}"
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes))
        if keys
    ]
    if problems:
        raise CheckpointError(f"{source} does not fit the model ({'; '.join(problems)})")
    model.load_state_dict(state)
