"""`Frame`: one posed image as a loader reads it, and its assembly into a `Scene`.

Every format module turns its files into a list of frames already in the project's conventions
(K in pixels, world-to-camera, OpenCV axes), its sizes and intrinsics checked by
:func:`positive_number`; :func:`frames_to_scene` decodes the images, rescales K to the decoded
image size, optionally resizes + centre-crops, and validates each camera.
"""

from __future__ import annotations

import io
import math
import reprlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ...cameras import CameraError, Cameras
from .scene import Scene, SceneError
from .transforms import resize_crop, scale_intrinsics

__all__ = ["Frame", "positive_number", "number_array", "pinhole", "read_image", "frames_to_scene", "select_frames"]


@dataclass
class Frame:
    """One view before decoding.

    Attributes:
        image: a path to an image file, or the encoded bytes of one (JPEG, PNG, ...) as ``bytes``
            or a 1-D uint8 tensor.
        K: ``(3, 3)`` float64 intrinsics, in pixels of an image of size ``intrinsics_size``.
        world_to_cam: ``(4, 4)`` float64 world-to-camera transform, OpenCV axes.
        intrinsics_size: ``(H, W)`` the intrinsics refer to; None means the decoded image's size.
            Normalised intrinsics are intrinsics of a ``(1, 1)`` image. K is rescaled to the image
            actually decoded (e.g. a downsampled copy).
        label: where the frame came from (file and field), for error messages.
    """

    image: Path | bytes | Tensor
    K: Tensor
    world_to_cam: Tensor
    intrinsics_size: tuple[int, int] | None = None
    label: str = ""


def positive_number(value: object, where: str, field: str, *, whole: bool = False,
                    below: float = math.inf) -> float | int:
    """``value`` as a number when it is finite and in ``(0, below)`` (an int when ``whole``), else a
    :class:`SceneError` naming ``where`` and ``field``: every reader checks its sizes and intrinsics here."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not (0 < number < below and (not whole or number.is_integer())):
        kind = "whole" if whole else "finite"
        bound = "" if below == math.inf else f" below {below:g}"
        raise SceneError(f"{where}: field {field} must be a positive {kind} number{bound}, got {reprlib.repr(value)}")
    return int(number) if whole else number


def number_array(value: object, where: str, field: str) -> Tensor:
    """``value`` (a number or nested lists of numbers) as a float64 tensor, else a :class:`SceneError`."""
    try:
        return torch.from_numpy(np.array(value, dtype=np.float64))
    except (TypeError, ValueError, OverflowError) as error:
        raise SceneError(f"{where}: field {field} must be numeric, got {reprlib.repr(value)}") from error


def pinhole(fx: float, fy: float, cx: float, cy: float) -> Tensor:
    """The float64 intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``."""
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)


def read_image(image: Path | bytes | Tensor, label: str = "") -> Tensor:
    """Decode an image file or encoded bytes to ``(3, H, W)`` float32 RGB in [0, 1]."""
    if isinstance(image, Tensor):
        image = image.numpy().tobytes()
    try:
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as pil:
            array = np.asarray(pil.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        what = "image bytes" if isinstance(image, bytes) else f"image {image}"
        raise SceneError(f"{label}: cannot read {what}: {error}") from error
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0


def _check_camera(K: Tensor, world_to_cam: Tensor, image_size: tuple[int, int], label: str) -> None:
    """A :class:`SceneError` unless the camera is valid as the scene stores it (float32)."""
    try:
        Cameras(K[None, None].float(), world_to_cam[None, None].float(), image_size)
    except CameraError as error:
        raise SceneError(f"{label}: invalid camera: {error}") from error


def frames_to_scene(frames: list[Frame], name: str, image_size: tuple[int, int] | None = None,
                    views: list[int] | None = None) -> Scene:
    """Decode ``frames`` (or only ``frames[views]``, in that order) into a :class:`Scene`.

    Images are ``(V, 3, H, W)``, cameras float32. With ``image_size (H, W)`` every view is resized
    + centre-cropped to it (:func:`hrope.nvs.data.transforms.resize_crop`); otherwise all images must
    share one size.
    """
    if views is not None:
        if any(not -len(frames) <= int(i) < len(frames) for i in views):
            raise SceneError(f"{name}: view indices {list(views)} out of range for {len(frames)} frames")
        frames = [frames[int(i)] for i in views]
    if not frames:
        raise SceneError(f"{name}: no frames")
    images, Ks = [], []
    for frame in frames:
        image = read_image(frame.image, frame.label)
        size = tuple(image.shape[-2:])
        K = frame.K if frame.intrinsics_size is None else scale_intrinsics(frame.K, frame.intrinsics_size, size)
        _check_camera(K, frame.world_to_cam, size, frame.label)
        if image_size is not None:
            image, K = resize_crop(image[None], K[None], tuple(image_size))
            image, K = image[0].clamp(0, 1), K[0]
        images.append(image)
        Ks.append(K)
    sizes = {tuple(image.shape[-2:]) for image in images}
    if len(sizes) > 1:
        raise SceneError(f"{name}: views have different image sizes {sorted(sizes)}; pass image_size=(H, W)")
    world_to_cam = torch.stack([frame.world_to_cam for frame in frames])
    cameras = Cameras(torch.stack(Ks)[None].float(), world_to_cam[None].float(), sizes.pop(), validate=False)
    return Scene(images=torch.stack(images), cameras=cameras, name=name)


def select_frames(num_frames: int, num_views: int | None, sampling: str = "even", *,
                  max_span: int | None = None, generator: torch.Generator | None = None) -> list[int]:
    """Sorted indices of ``num_views`` of ``num_frames`` frames (all frames when None).

    ``sampling="even"`` is deterministic: evenly spaced over the whole sequence (evaluation).
    ``sampling="random"``: a random window of at most ``max_span`` consecutive frames, then
    ``num_views`` distinct frames drawn uniformly inside it (training).
    """
    if num_views is None:
        return list(range(num_frames))
    if num_views < 1 or num_views > num_frames:
        raise SceneError(f"cannot pick {num_views} views from {num_frames} frames")
    if sampling == "even":
        return torch.linspace(0, num_frames - 1, num_views, dtype=torch.float64).round().long().tolist()
    if sampling != "random":
        raise ValueError(f"sampling must be 'even' or 'random', got {sampling!r}")
    span = num_frames if max_span is None else max(num_views, min(max_span, num_frames))
    start = int(torch.randint(0, num_frames - span + 1, (), generator=generator))
    picks = torch.randperm(span, generator=generator)[:num_views].sort().values + start
    return picks.tolist()
