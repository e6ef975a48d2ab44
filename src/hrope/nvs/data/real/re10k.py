"""RealEstate10K in the pixelSplat chunk format, and its evaluation index.

A split folder holds ``*.torch`` chunks (read with ``torch.load(weights_only=True)`` only) and
optionally ``index.json`` (scene key -> chunk file name). A chunk is a list of scene dicts:
``key`` (str), ``timestamps`` ``(n,)``, ``cameras`` ``(n, 18)`` float and ``images`` (n uint8
tensors, each the bytes of a JPEG file, 640x360 in the public data). A camera row is
``fx fy cx cy`` normalised by the image width/height (positive finite numbers), two unused
numbers, then a row-major 3x4 **world-to-camera** matrix with OpenCV axes. So
``K = diag(W, H, 1) @ [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` for the decoded ``(H, W)`` image
(pixel centres at +0.5, as pixelSplat uses it) and ``world_to_cam = [[row 6..17], [0, 0, 0, 1]]``:
no axis change.

The evaluation index (pixelSplat's ``evaluation_index_re10k.json``) maps a key to
``{"context": [i, j], "target": [a, b, c]}`` frame indices, or to null (scene skipped).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TypeGuard

import torch

from ...config.fields import one_line
from ..scene import SceneError
from .frames import Frame, pinhole, positive_number
from .source import SceneSource

__all__ = ["read_chunk", "re10k_frames", "read_evaluation_index", "RealEstate10KSource"]

logger = logging.getLogger("hrope.nvs.data")

_INTRINSICS = ("fx", "fy", "cx", "cy")


def read_chunk(path: str | Path) -> list[dict]:
    """The scene dicts of one ``.torch`` chunk (``torch.load(weights_only=True)``, on CPU)."""
    path = Path(path)
    try:
        chunk = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt or unsafe files
        message = re.sub(r"\x1b\[[0-9;]*m", "", one_line(error))  # torch's message carries terminal bold codes
        raise SceneError(f"{path}: cannot load chunk: {type(error).__name__}: {message}") from error
    if not isinstance(chunk, list) or not all(isinstance(example, dict) for example in chunk):
        raise SceneError(f"{path}: a chunk must be a list of scene dicts, got {type(chunk).__name__}")
    return chunk


def re10k_frames(example: dict, where: str) -> list[Frame]:
    """Frames of one scene dict (fields ``key``, ``cameras``, ``images``) from ``where``."""
    label = f"{where} scene {example.get('key', '?')!r}"
    cameras, images = example.get("cameras"), example.get("images")
    if not isinstance(cameras, torch.Tensor) or cameras.ndim != 2 or cameras.shape[1] != 18:
        shape = tuple(cameras.shape) if isinstance(cameras, torch.Tensor) else type(cameras).__name__
        raise SceneError(f"{label}: field 'cameras' must be an (n, 18) tensor, got {shape}")
    if not isinstance(images, (list, tuple)) or len(images) != len(cameras):
        count = len(images) if isinstance(images, (list, tuple)) else type(images).__name__
        raise SceneError(f"{label}: field 'images' must be a list of {len(cameras)} JPEG tensors, got {count}")
    cameras = cameras.double()
    frames = []
    for i, (row, image) in enumerate(zip(cameras, images)):
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
            raise SceneError(f"{label}: field images[{i}] must be a uint8 tensor of JPEG bytes")
        where = f"{label} frame {i} (cameras[{i}])"
        intrinsics = [positive_number(value, where, field) for value, field in zip(row[:4].tolist(), _INTRINSICS)]
        K = pinhole(*intrinsics)
        world_to_cam = torch.eye(4, dtype=torch.float64)
        world_to_cam[:3] = row[6:].reshape(3, 4)
        frames.append(Frame(image, K, world_to_cam, (1, 1), where))
    return frames


def _is_indices(value: object) -> TypeGuard[list[int]]:
    """Whether ``value`` is a list of frame indices (ints, not bools)."""
    return isinstance(value, list) and all(type(i) is int for i in value)


def read_evaluation_index(path: str | Path) -> dict[str, tuple[list[int], list[int]] | None]:
    """``key -> (context indices, target indices)`` or None, from an evaluation index JSON."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SceneError(f"{path}: cannot read JSON: {error}") from error
    if not isinstance(raw, dict):
        raise SceneError(f"{path}: expected an object mapping scene keys to views")
    index: dict[str, tuple[list[int], list[int]] | None] = {}
    for key, entry in raw.items():
        if entry is None:
            index[key] = None
            continue
        views = entry if isinstance(entry, dict) else {}
        context, target = views.get("context"), views.get("target")
        if not (_is_indices(context) and _is_indices(target)):
            raise SceneError(f"{path}: entry {key!r} needs lists of frame indices 'context' and 'target'")
        index[key] = (context, target)
    return index


class RealEstate10KSource(SceneSource):
    """Scenes of a pixelSplat RE10K split folder, loaded lazily (one chunk cached at a time).

    With ``evaluation_index`` (a path), scene ``i`` has the index's context views then its target
    views, in that order (:meth:`context_target` gives their positions); null entries and keys
    absent from the chunks are left out (the latter with a warning). Otherwise ``options``
    (``num_views``, ``sampling``, ``max_span``, ``image_size``, ``skip_errors``) work as in
    :class:`hrope.nvs.data.real.source.SceneSource`.

    Chunks are listed from ``index.json`` when present, else by opening every chunk once
    (unreadable chunks, scenes without a string ``key`` and repeats of a key, whose first copy is
    used, are left out with counted warnings).
    """

    def __init__(self, root: str | Path, *, evaluation_index: str | Path | None = None, **options) -> None:
        super().__init__(**options)
        self.root = Path(root)
        self._cache: tuple[Path, list[dict]] | None = None
        self.chunk_of = self._list_scenes()
        self.evaluation_views: dict[str, tuple[list[int], list[int]]] = {}
        if evaluation_index is None:
            self.keys = sorted(self.chunk_of)
        else:
            index = read_evaluation_index(evaluation_index)
            listed = {key: entry for key, entry in index.items() if entry is not None}
            wanted = list(listed)
            self.keys = [key for key in wanted if key in self.chunk_of]
            if len(wanted) < len(index):
                logger.info(
                    "%s: %d of %d entries are null (left out, as the index says)",
                    evaluation_index,
                    len(index) - len(wanted),
                    len(index),
                )
            if len(self.keys) < len(wanted):
                logger.warning(
                    "%s: %d of %d evaluation scenes are not in the chunks",
                    self.root,
                    len(wanted) - len(self.keys),
                    len(wanted),
                )
            self.evaluation_views = {key: listed[key] for key in self.keys}

    def _list_scenes(self) -> dict[str, Path]:
        if not self.root.is_dir():
            raise SceneError(f"{self.root}: RealEstate10K split folder not found")
        listing = self.root / "index.json"
        if listing.is_file():
            try:
                names = json.loads(listing.read_text())
            except (OSError, ValueError) as error:
                raise SceneError(f"{listing}: cannot read JSON: {error}") from error
            if not isinstance(names, dict) or not all(isinstance(name, str) for name in names.values()):
                raise SceneError(f"{listing}: expected an object mapping scene keys to chunk file names")
            return {key: self.root / name for key, name in names.items()}
        chunk_of, broken, unnamed, repeated = {}, 0, 0, 0
        for path in sorted(self.root.glob("*.torch")):
            try:
                chunk = read_chunk(path)
            except SceneError as error:
                broken += 1
                logger.warning("skipping chunk %s (%d chunk(s) skipped so far): %s", path.name, broken, error)
                continue
            for example in chunk:
                key = example.get("key")
                if not isinstance(key, str):
                    unnamed += 1
                elif key in chunk_of:
                    repeated += 1
                else:
                    chunk_of[key] = path
        if unnamed:
            logger.warning("%s: %d scene(s) without a string 'key' left out", self.root, unnamed)
        if repeated:
            logger.warning(
                "%s: %d scene(s) repeat an earlier scene's key and are left out (the first is used)",
                self.root,
                repeated,
            )
        if not chunk_of:
            raise SceneError(f"{self.root}: no readable *.torch chunks")
        return chunk_of

    def __len__(self) -> int:
        return len(self.keys)

    def scene_name(self, i: int) -> str:
        return self.keys[i]

    def describe(self, i: int) -> str:
        return f"RE10K scene {self.keys[i]!r} ({self.chunk_of[self.keys[i]].name})"

    def context_target(self, i: int) -> tuple[list[int], list[int]]:
        """Positions of the context and target views within ``self[i]`` (evaluation index only)."""
        context, target = self.evaluation_views[self.keys[i]]
        return list(range(len(context))), list(range(len(context), len(context) + len(target)))

    def frames(self, i: int) -> list[Frame]:
        key = self.keys[i]
        path = self.chunk_of[key]
        if self._cache is None or self._cache[0] != path:
            self._cache = None
            self._cache = (path, read_chunk(path))
        example = next((example for example in self._cache[1] if example.get("key") == key), None)
        if example is None:
            raise SceneError(f"{path}: scene {key!r} not found in the chunk")
        return re10k_frames(example, path.name)

    def views(self, i: int, num_frames: int) -> list[int]:
        key = self.keys[i]
        if key in self.evaluation_views:
            context, target = self.evaluation_views[key]
            return context + target
        return super().views(i, num_frames)
