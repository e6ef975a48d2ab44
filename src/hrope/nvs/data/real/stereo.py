"""Rectified stereo pairs (Middlebury 2014 format) cut into small posed scenes for novel-view synthesis.

A :class:`StereoPair` holds the two rectified images, the left image's disparity and the
calibration; :func:`read_middlebury` reads a Middlebury 2014 scene folder (``calib.txt``, ``im0.png``,
``im1.png``, ``disp0.pfm``). The two cameras share their orientation and focal length ``f``; the
right camera sits ``baseline`` to the right of the left one, and its principal point is ``doffs =
cx1 - cx0`` pixels right of the left one's. A left pixel at column ``x`` with disparity ``d`` is seen
in the right image at column ``x - d``, at z-depth ``Z = baseline * f / (d + doffs)``. Pixel
coordinates are continuous (pixel ``i`` covers ``[i, i + 1)``), so a downscale by ``k`` divides
``f``, ``cx`` and ``cy`` by ``k``.

:func:`window_scene` cuts one scene from a :class:`StereoWindow`: two context views, left-image
crops at columns ``x`` and ``x + shift``, and the target, the right-image crop at column ``x``.
A crop is a camera with a shifted principal point, so every view has exact intrinsics and the true
relative pose. The scene is expressed like :func:`hrope.nvs.data.normalize_scene` leaves one: the
first context camera is the world frame; the unit of length is the stereo baseline (the two
context crops share one camera centre, so the context baseline cannot be the unit). The context
views carry the ground-truth depth (``inf`` where the disparity is missing); the target view's
depth is ``inf`` everywhere: a model is never given it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ....cameras import Cameras
from ..scene import Scene, SceneError
from .images import read_image

__all__ = [
    "StereoPair",
    "StereoWindow",
    "read_middlebury",
    "read_pfm",
    "window_scene",
    "stereo_windows",
    "StereoScenes",
    "MOTORCYCLE_CALIBRATION",
    "motorcycle_from_skimage",
]


@dataclass(frozen=True)
class StereoPair:
    """A rectified stereo pair with the left image's disparity.

    Attributes:
        left, right: ``(3, H, W)`` float RGB in [0, 1].
        disparity: ``(H, W)`` of the left image, in pixels (``x_right = x_left - d``); NaN or inf
            where there is none.
        focal: focal length in pixels (both cameras); cx0, cx1: principal point columns of the
            left and right cameras; cy: their principal point row.
        baseline: distance between the camera centres (any unit; depth comes out in it).
    """

    left: Tensor
    right: Tensor
    disparity: Tensor
    focal: float
    cx0: float
    cx1: float
    cy: float
    baseline: float
    name: str = "stereo"

    def __post_init__(self) -> None:
        if self.left.ndim != 3 or self.left.shape[0] != 3 or self.right.shape != self.left.shape:
            raise SceneError(
                f"{self.name}: left and right must both be (3, H, W), got {tuple(self.left.shape)} "
                f"and {tuple(self.right.shape)}"
            )
        if tuple(self.disparity.shape) != tuple(self.left.shape[1:]):
            raise SceneError(
                f"{self.name}: disparity must be {tuple(self.left.shape[1:])}, got {tuple(self.disparity.shape)}"
            )
        if not (self.focal > 0 and self.baseline > 0):
            raise SceneError(f"{self.name}: focal and baseline must be positive, got {self.focal}, {self.baseline}")

    @property
    def image_size(self) -> tuple[int, int]:
        return self.left.shape[1], self.left.shape[2]

    @property
    def doffs(self) -> float:
        """``cx1 - cx0``: the disparity of a point at infinity is ``-doffs``."""
        return self.cx1 - self.cx0

    def depth(self) -> Tensor:
        """``(H, W)`` z-depth of the left image, ``baseline * f / (d + doffs)``; inf where the
        disparity is missing or ``d + doffs <= 0``."""
        shifted = self.disparity.double() + self.doffs
        ok = torch.isfinite(shifted) & (shifted > 0)
        depth = self.baseline * self.focal / torch.where(ok, shifted, torch.ones_like(shifted))
        return torch.where(ok, depth, torch.full_like(depth, float("inf"))).float()

    def downscale(self, factor: int) -> StereoPair:
        """The pair at ``1 / factor`` resolution: images averaged over ``factor x factor`` blocks
        (trailing rows/columns dropped), disparity averaged and divided by ``factor`` (missing
        where any pixel of the block is), intrinsics divided by ``factor``."""
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        pool = lambda x: F.avg_pool2d(x[None].float(), factor)[0]  # noqa: E731
        finite = torch.isfinite(self.disparity)
        disparity = pool(torch.where(finite, self.disparity, torch.zeros_like(self.disparity))[None])[0] / factor
        complete = pool(finite.float()[None])[0] == 1
        return StereoPair(
            pool(self.left),
            pool(self.right),
            torch.where(complete, disparity, torch.full_like(disparity, float("nan"))),
            self.focal / factor,
            self.cx0 / factor,
            self.cx1 / factor,
            self.cy / factor,
            self.baseline,
            self.name,
        )


@dataclass(frozen=True)
class StereoWindow:
    """One scene's crops: ``size x size`` pixels at row ``top``; the target (right image) and the
    first context view (left image) at column ``left``, the second context view at ``left + shift``."""

    top: int
    left: int
    shift: int


def _crop_camera(pair: StereoPair, window: StereoWindow, column: int, cx: float, center_x: float) -> tuple:
    K = torch.tensor(
        [[pair.focal, 0.0, cx - column], [0.0, pair.focal, pair.cy - window.top], [0.0, 0.0, 1.0]], dtype=torch.float64
    )
    world_to_cam = torch.eye(4, dtype=torch.float64)
    world_to_cam[0, 3] = -center_x
    return K, world_to_cam


def window_scene(pair: StereoPair, window: StereoWindow, size: int) -> Scene:
    """The 3-view scene of ``window`` (module doc): context left crops at ``left`` and ``left +
    shift``, target right crop at ``left``; lengths in baselines, world = the left camera."""
    H, W = pair.image_size
    top, x = window.top, window.left
    if not (0 <= top and top + size <= H and 0 <= x and x + window.shift + size <= W and x + size <= W):
        raise SceneError(f"{pair.name}: window {window} of size {size} does not fit in the {(H, W)} images")
    columns = (x, x + window.shift, x)
    rows = slice(top, top + size)
    images = torch.stack([img[:, rows, c : c + size] for img, c in zip((pair.left, pair.left, pair.right), columns)])
    depth = pair.depth() / pair.baseline
    missing = torch.full((size, size), float("inf"))
    depths = torch.stack([depth[rows, x : x + size], depth[rows, x + window.shift : x + window.shift + size], missing])
    cams = [
        _crop_camera(pair, window, columns[0], pair.cx0, 0.0),
        _crop_camera(pair, window, columns[1], pair.cx0, 0.0),
        _crop_camera(pair, window, columns[2], pair.cx1, 1.0),  # the right camera, one baseline along +x
    ]
    cameras = Cameras(
        torch.stack([K for K, _ in cams])[None].float(), torch.stack([E for _, E in cams])[None].float(), (size, size)
    )
    return Scene(images, cameras, depth=depths, name=f"{pair.name}@{top},{x}+{window.shift}")


def stereo_windows(pair: StereoPair, size: int, shift: int, stride: int, rows: tuple[int, int]) -> list[StereoWindow]:
    """Every window whose rows lie in ``[rows[0], rows[1])``, on a ``stride`` grid from the band's top
    and column 0, that fits with its shifted context crop."""
    H, W = pair.image_size
    low, high = max(0, rows[0]), min(H, rows[1])
    return [
        StereoWindow(top, x, shift)
        for top in range(low, high - size + 1, stride)
        for x in range(0, W - size - max(shift, 0) + 1, stride)
        if x + shift >= 0
    ]


class StereoScenes:
    """The scenes of ``windows`` (a sequence of :class:`Scene`, cut once and kept in memory)."""

    def __init__(self, pair: StereoPair, windows: Sequence[StereoWindow], size: int) -> None:
        self.windows = list(windows)
        self.scenes = [window_scene(pair, w, size) for w in self.windows]

    def __len__(self) -> int:
        return len(self.scenes)

    def __getitem__(self, index: int) -> Scene:
        return self.scenes[index]


# ----------------------------------------------------------------------------- Middlebury files
def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise SceneError(f"{path}: cannot read: {error}") from error


def _number(text: str | bytes, path: Path, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SceneError(f"{path}: field {field} must be a number, got {text!r}") from None


def read_pfm(path: Path) -> Tensor:
    """``(H, W)`` float32 of a one-channel PFM file (``Pf``), top row first; inf stays inf."""
    data = _read(Path(path))
    match = re.match(rb"Pf\s+(\d+)\s+(\d+)\s+(-?[\d.eE+-]+)\s", data)
    if match is None:
        raise SceneError(f"{path}: not a one-channel PFM file (expected a 'Pf' header)")
    width, height, scale = int(match[1]), int(match[2]), _number(match[3], path, "scale")
    dtype = np.dtype("<f4" if scale < 0 else ">f4")
    count = width * height
    body = data[match.end() : match.end() + 4 * count]
    if len(body) != 4 * count:
        raise SceneError(f"{path}: PFM data is truncated ({len(body)} of {4 * count} bytes)")
    array = np.frombuffer(body, dtype=dtype).reshape(height, width)[::-1]  # PFM rows run bottom to top
    return torch.from_numpy(array.astype(np.float32))


def _calibration(path: Path) -> dict[str, str]:
    try:
        text = _read(path).decode()
    except UnicodeDecodeError as error:
        raise SceneError(f"{path}: not a text file: {error}") from error
    values = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    missing = sorted({"cam0", "cam1", "baseline"} - set(values))
    if missing:
        raise SceneError(f"{path}: missing calibration keys {missing}")
    return values


def _camera_matrix(path: Path, text: str, field: str) -> list[float]:
    numbers = [_number(v, path, field) for v in re.findall(r"-?[\d.]+(?:[eE][-+]?\d+)?", text)]
    if len(numbers) != 9:
        raise SceneError(f"{path}: field {field} needs 9 numbers, got {text!r}")
    return numbers


def read_middlebury(folder: str | Path) -> StereoPair:
    """A Middlebury 2014 scene folder: ``calib.txt`` (``cam0``, ``cam1`` = ``[f 0 cx; 0 f cy; 0 0 1]``,
    ``baseline`` in mm), ``im0.png`` (left), ``im1.png`` (right), ``disp0.pfm`` (left disparity, inf
    where unknown). Depth comes out in millimetres."""
    folder = Path(folder)
    calib = _calibration(folder / "calib.txt")
    cam0, cam1 = (_camera_matrix(folder / "calib.txt", calib[k], k) for k in ("cam0", "cam1"))
    if cam0[0] != cam1[0] or cam0[5] != cam1[5]:
        raise SceneError(f"{folder / 'calib.txt'}: cam0 and cam1 differ in focal length or cy (not rectified)")
    left, right = (read_image(folder / name, str(folder)) for name in ("im0.png", "im1.png"))
    disparity = read_pfm(folder / "disp0.pfm")
    if tuple(disparity.shape) != tuple(left.shape[1:]):
        raise SceneError(
            f"{folder / 'disp0.pfm'}: the disparity is {tuple(disparity.shape)}, the images {tuple(left.shape[1:])}"
        )
    return StereoPair(
        left,
        right,
        disparity,
        cam0[0],
        cam0[2],
        cam1[2],
        cam0[5],
        _number(calib["baseline"], folder / "calib.txt", "baseline"),
        folder.name,
    )


# The Middlebury 2014 "Motorcycle" calibration at full resolution (its calib.txt; docs/real_data.md).
MOTORCYCLE_CALIBRATION = {"focal": 3979.911, "cx0": 1244.772, "cx1": 1369.115, "cy": 1019.507, "baseline": 193.001}
MOTORCYCLE_SKIMAGE_FACTOR = 4  # scikit-image bundles the pair downscaled 4x (its stereo_motorcycle docstring)


def motorcycle_from_skimage() -> StereoPair:
    """The Middlebury 2014 Motorcycle pair bundled with scikit-image (an optional dependency; read
    from the installed package, nothing is downloaded), with its calibration scaled to the bundled
    resolution; depth in millimetres."""
    try:
        from skimage.data import stereo_motorcycle
    except ImportError:
        raise SceneError("the Motorcycle stereo pair needs scikit-image: pip install scikit-image") from None
    left, right, disparity = stereo_motorcycle()
    to_tensor = lambda x: torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float() / 255  # noqa: E731
    k = MOTORCYCLE_SKIMAGE_FACTOR
    c = MOTORCYCLE_CALIBRATION
    return StereoPair(
        to_tensor(left),
        to_tensor(right),
        torch.from_numpy(np.asarray(disparity, dtype=np.float32)),
        c["focal"] / k,
        c["cx0"] / k,
        c["cx1"] / k,
        c["cy"] / k,
        c["baseline"],
        "motorcycle",
    )
