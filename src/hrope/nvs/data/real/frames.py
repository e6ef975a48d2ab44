"""`Frame`: one posed image as a loader reads it, and its assembly into a `Scene`.

Every format module turns its files into a list of frames already in the project's conventions
(K in pixels, world-to-camera, OpenCV axes), its sizes and intrinsics checked by
:func:`positive_number`; :func:`frames_to_scene` decodes the images (:func:`load_view`), rescales K
to the decoded image size, removes lens distortion (:mod:`hrope.nvs.data.real.undistort`), optionally
resizes + centre-crops, and validates each camera. Readers share :func:`image_folder` (which of
``images/``, ``images_2/``, ... to read) and :func:`report_missing` (listed frames whose image file
is absent are skipped with one warning, as instant-ngp's loader does).

Images are decoded by :func:`hrope.nvs.data.real.images.read_image` (every mode, alpha, EXIF
orientation, reduced decoding of large files).
"""

from __future__ import annotations

import logging
import os
import math
import reprlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
from torch import Tensor

from ....cameras import CameraError, Cameras
from ..scene import Scene, SceneError
from ..transforms import crop_intrinsics, resize_crop, resize_crop_plan, scale_intrinsics
from .image_cache import ImageCache
from .images import WHITE, read_image
from .undistort import Distortion, undistort_image

__all__ = [
    "Frame",
    "positive_number",
    "number_array",
    "pinhole",
    "read_image",
    "load_view",
    "frames_to_scene",
    "select_frames",
    "image_folders",
    "image_folder",
    "image_file_exists",
    "report_missing",
    "drop_repeated_frames",
]

logger = logging.getLogger("hrope.nvs.data")


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
        depth_map, normal_map: optional depth / normal map files of this view, and ``tracks``
            ``(points3D file, POINTS2D)`` of a COLMAP image (its POINTS2D line as text, or the
            POINT3D_IDs of a binary model); read only on request (``data.depth``,
            :mod:`hrope.nvs.data.real.depth_maps`).
        distortion: the lens model of the image file (None: pinhole); removed when decoded.
        background: the RGB colour in [0, 1] an image with alpha is composited over (default
            white; None: alpha is dropped).
        mask, depth_prior, normal_prior: optional files of this view's object mask and monocular
            depth / normal priors, read only on request (``masks=True``, ``priors=True``:
            :mod:`hrope.nvs.data.real.view_maps`).
    """

    image: Path | bytes | Tensor
    K: Tensor
    world_to_cam: Tensor
    intrinsics_size: tuple[int, int] | None = None
    label: str = ""
    depth_map: Path | None = None
    normal_map: Path | None = None
    tracks: tuple[Path, str | Tensor] | None = None
    distortion: Distortion | None = None
    background: tuple[float, float, float] | None = WHITE
    mask: Path | None = None
    depth_prior: Path | None = None
    normal_prior: Path | None = None


@overload
def positive_number(value: Any, where: str, field: str, *, whole: Literal[True], below: float = math.inf) -> int: ...
@overload
def positive_number(
    value: Any, where: str, field: str, *, whole: Literal[False] = False, below: float = math.inf
) -> float: ...
@overload
def positive_number(
    value: Any, where: str, field: str, *, whole: bool = False, below: float = math.inf
) -> float | int: ...
def positive_number(value: Any, where: str, field: str, *, whole: bool = False, below: float = math.inf) -> float | int:
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


def _check_camera(K: Tensor, world_to_cam: Tensor, image_size: tuple[int, int], label: str) -> None:
    """A :class:`SceneError` unless the camera is valid as the scene stores it (float32)."""
    try:
        Cameras(K[None, None].float(), world_to_cam[None, None].float(), image_size)
    except CameraError as error:  # one camera: the batch and view index say nothing
        raise SceneError(f"{label}: invalid camera: {str(error).replace('[b=0, v=0]', '', 1)}") from error


def _intrinsics(frame: Frame, size: tuple[int, int]) -> Tensor:
    """The frame's K in pixels of its image decoded at ``size``. Rescaling needs the aspect ratios to
    agree up to a pixel of rounding (downsampled copies are often rounded), unless K is normalised."""
    if frame.intrinsics_size is None:
        return frame.K
    (height, width), (h, w) = frame.intrinsics_size, size
    if (height, width) != (1, 1) and abs(h * width - w * height) > max(height, width):
        raise SceneError(
            f"{frame.label}: the image is {h}x{w} but the camera is for {height}x{width}, another "
            f"aspect ratio (a rotated or cropped copy?)"
        )
    return scale_intrinsics(frame.K, frame.intrinsics_size, size)


def _resized_intrinsics(K: Tensor, size: tuple[int, int], image_size: tuple[int, int]) -> Tensor:
    """K after :func:`hrope.nvs.data.transforms.resize_crop` of a ``size`` image to ``image_size``."""
    resized, top, left = resize_crop_plan(size, image_size)
    return crop_intrinsics(scale_intrinsics(K, size, resized), top, left)


def _lens(frame: Frame) -> list | None:
    """What the view cache keys a distorted frame's undistortion by; None for a pinhole frame."""
    if frame.distortion is None:
        return None
    return [
        frame.distortion.kind,
        list(frame.distortion.coefficients),
        frame.K.tolist(),
        frame.intrinsics_size and list(frame.intrinsics_size),
    ]


def load_view(
    frame: Frame, image_size: tuple[int, int] | None = None, cache: ImageCache | None = None
) -> tuple[Tensor, Tensor]:
    """``(image (3, H, W), K)`` of one frame: decoded, undistorted (K kept), and resized +
    centre-cropped to ``image_size`` when given, with K updated exactly (the camera is checked by
    :func:`frames_to_scene`).

    The image is rounded to 8-bit levels, so a view read from ``cache`` (stored there on its first
    read) equals a freshly decoded one exactly.
    """
    image_size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    key = None if cache is None else cache.key(frame.image, image_size, _lens(frame), frame.background)
    stored = None if cache is None or key is None else cache.get(key)
    if stored is None:  # a reduced JPEG scale only when K says which size it is for
        target = image_size if frame.intrinsics_size is not None else None
        image = read_image(frame.image, frame.label, target=target, background=frame.background)
        size = (image.shape[-2], image.shape[-1])
    else:
        pixels, size = stored
    K = _intrinsics(frame, size)
    if stored is None:
        if frame.distortion is not None:
            image = undistort_image(image, K, frame.distortion)
        if image_size is not None:
            image = resize_crop(image[None], K[None], image_size)[0][0]
        pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        if cache is not None and key is not None:
            cache.put(key, pixels, size)
    image = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).float() / 255.0
    return image, (K if image_size is None else _resized_intrinsics(K, size, image_size))


def frames_to_scene(
    frames: list[Frame],
    name: str,
    image_size: tuple[int, int] | None = None,
    views: list[int] | None = None,
    *,
    cache: ImageCache | None = None,
    workers: int = 0,
) -> Scene:
    """Decode ``frames`` (or only ``frames[views]``, in that order) into a :class:`Scene`.

    Images are ``(V, 3, H, W)``, cameras float32. With ``image_size (H, W)`` every view is resized
    + centre-cropped to it (:func:`hrope.nvs.data.transforms.resize_crop`); otherwise all images must
    share one size. Each view goes through :func:`load_view` (with ``cache``); ``workers > 1``
    decodes the views in that many threads (PIL and torch release the GIL while decoding).
    """
    if views is not None:
        if any(not -len(frames) <= int(i) < len(frames) for i in views):
            raise SceneError(f"{name}: view indices {list(views)} out of range for {len(frames)} frames")
        frames = [frames[int(i)] for i in views]
    if not frames:
        raise SceneError(f"{name}: no frames")
    load = partial(load_view, image_size=image_size, cache=cache)
    if workers > 1 and len(frames) > 1:
        with ThreadPoolExecutor(min(workers, len(frames))) as pool:
            images, Ks = zip(*pool.map(load, frames))
    else:
        images, Ks = zip(*map(load, frames))
    sizes = {tuple(image.shape[-2:]) for image in images}
    if len(sizes) > 1:
        raise SceneError(f"{name}: views have different image sizes {sorted(sizes)}; pass image_size=(H, W)")
    size = sizes.pop()
    world_to_cam = torch.stack([frame.world_to_cam for frame in frames])
    try:  # all views at once; on an error, the first bad view names its file and field
        cameras = Cameras(torch.stack(Ks)[None].float(), world_to_cam[None].float(), size)
    except CameraError:
        for frame, K in zip(frames, Ks):
            _check_camera(K, frame.world_to_cam, size, frame.label)
        raise
    return Scene(images=torch.stack(images), cameras=cameras, name=name)


def select_frames(
    num_frames: int,
    num_views: int | None,
    sampling: str = "even",
    *,
    max_span: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
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


def image_folders(folder: Path) -> dict[int, Path]:
    """The image folders of a scene folder by downsampling factor: ``images/`` (1), ``images_N/`` (N)."""
    found = {1: folder / "images"} if (folder / "images").is_dir() else {}
    for path in folder.glob("images_*"):
        suffix = path.name.removeprefix("images_")
        if suffix.isdecimal() and int(suffix) > 1 and path.is_dir():
            found[int(suffix)] = path
    return found


def image_folder(folder: Path, image_factor: int | None = None, *, fallback: Path | None = None) -> Path:
    """The folder to read a scene's images from: ``images_{image_factor}/`` (``images/`` for 1);
    without a factor ``images/`` when it exists, else the smallest factor present, else ``fallback``.
    A :class:`SceneError` says what was looked for and what is there."""
    present = image_folders(folder)
    names = ", ".join(f"{present[f].name}/" for f in sorted(present)) or "none"
    if image_factor is None:
        if present:
            return present[min(present)]
        if fallback is not None:
            return fallback
        raise SceneError(
            f"{folder}: no image folder; looked for images/ and images_N/ (downsampled by N: "
            f"images_2/, images_4/, images_8/, ...)"
        )
    image_factor = positive_number(image_factor, str(folder), "image_factor", whole=True)
    if image_factor not in present:
        wanted = "images" if image_factor == 1 else f"images_{image_factor}"
        raise SceneError(
            f"{folder}: image_factor {image_factor} reads {wanted}/, which does not exist; image "
            f"folders present: {names}"
        )
    return present[image_factor]


def image_file_exists(path: Path) -> bool:
    """Whether ``path`` is a file; False too for a name the file system cannot hold (too long, a
    NUL byte), which no listed image can be."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _same_camera(a: Frame, b: Frame) -> bool:
    return (
        a.intrinsics_size == b.intrinsics_size
        and torch.allclose(a.K, b.K, rtol=1e-6, atol=1e-9)
        and torch.allclose(a.world_to_cam, b.world_to_cam, rtol=1e-6, atol=1e-9)
    )


def drop_repeated_frames(frames: list[Frame], where: str) -> list[Frame]:
    """``frames`` without those that list an earlier frame's image file again with the same camera
    (one warning counts them: a repeated view would be both a context and a target); the same
    image with another camera is a :class:`SceneError` naming both frames."""
    first: dict[str, Frame] = {}
    kept, repeats = [], []
    for frame in frames:
        if not isinstance(frame.image, Path):
            kept.append(frame)
            continue
        name = os.path.normpath(frame.image)
        if name not in first:
            first[name] = frame
            kept.append(frame)
        elif _same_camera(first[name], frame):
            repeats.append(frame)
        else:
            raise SceneError(
                f"{frame.label}: lists image {frame.image} again (first in {first[name].label}) with "
                "another camera; one image has one camera"
            )
    if repeats:
        logger.warning(
            "%s: %d frame(s) repeat an earlier frame's image and camera and are left out (first: %s)",
            where,
            len(repeats),
            repeats[0].label,
        )
    return kept


def report_missing(where: str, missing: list[Path], listed: int) -> None:
    """One warning counting the ``missing`` image files of ``listed`` frames (the reader skips them,
    as instant-ngp's loader does); a :class:`SceneError` when every listed file is missing."""
    if not missing:
        return
    if len(missing) == listed:
        raise SceneError(f"{where}: none of the {listed} listed image files exists (the first: {missing[0]})")
    logger.warning(
        "%s: %d of %d listed frames have no image file and are skipped (first: %s)",
        where,
        len(missing),
        listed,
        missing[0],
    )
