"""IDR / NeuS / VolSDF / MonoSDF scenes: projection matrices ``world_mat_i`` and ``scale_mat_i`` in an ``.npz``.

Layouts (one scene per folder; camera file ``cameras.npz``, else NeuS's ``cameras_sphere.npz``):

- MonoSDF: ``000000_rgb.png, 000001_rgb.png, ...`` beside the camera file, with monocular priors
  ``000000_depth.npy`` and ``000000_normal.npy`` per view (``Frame.depth_prior`` / ``normal_prior``,
  read with ``priors=True``: :mod:`hrope.nvs.data.real.view_maps`).
- IDR, VolSDF, NeuS: the images in ``image/`` (``.png``, ``.jpg``), object masks in ``mask/``
  (one per image, matched in sorted order as IDR matches them; read with ``masks=True``).

Image ``i`` in sorted name order has camera ``i``. ``world_mat_i`` is the projection
``P = K [R | t]`` of homogeneous world points to the image's pixels (3x4, or 4x4 whose last row is
ignored, as IDR does); ``scale_mat_i`` is the normalisation ``X_world = scale_mat @ X_normalised``
(IDR's preprocessing puts the object in the unit sphere): a similarity ``[[s Q, c], [0, 0, 0, 1]]``
(``s > 0``, ``Q`` a rotation), the same for every view; when no view has one, the identity.

**Frame.** The loaded cameras are in the **normalised** frame, as IDR, NeuS and MonoSDF train:
a normalised point ``X`` projects through ``P @ scale_mat``, which :func:`decompose_projection`
splits into ``K`` and world-to-camera ``[R | t]`` (a point of the original world is
``inv(scale_mat) @ X_world`` in this frame).

**Decomposition.** ``M = (P @ scale_mat)[:, :3]`` is factored ``M = K R`` (RQ) with a positive
diagonal of ``K`` and a proper rotation ``R``: ``P`` and ``-P`` project alike, and the sign for
which ``det M > 0`` is the one whose points in front have positive depth (Hartley & Zisserman
6.2.3). ``K`` is scaled to ``K[2, 2] = 1`` and ``t = K^-1 P[:, 3]`` (before that scaling). A skew
``K[0, 1]`` that moves no pixel by more than 0.01 px (``|K[0, 1] cy / fy|``) is float noise and
dropped; a larger one, a non-finite or singular ``M`` is an error naming the file and the field.

**Pixels.** These files put pixel centres at integer coordinates (IDR casts the ray of pixel
``(row i, column j)`` through ``(j, i)``), the project at ``(j + 0.5, i + 0.5)``
(:mod:`hrope.nvs.data.transforms`): ``cx`` and ``cy`` are shifted by +0.5. No other convention
changes: ``P`` maps to OpenCV pixels (x right, y down, the camera looking along +z).
"""

from __future__ import annotations

import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ....geometry import make_se3
from ...config.fields import one_line
from ..scene import SceneError
from .frames import Frame, image_file_exists

__all__ = [
    "CAMERA_FILES",
    "MAX_SKEW_SHIFT",
    "find_camera_file",
    "decompose_projection",
    "read_idr_cameras",
    "read_idr_frames",
]

CAMERA_FILES = ("cameras.npz", "cameras_sphere.npz")
MAX_SKEW_SHIFT = 0.01  # pixels: a skew moving no pixel further is float noise (float32 matrices: ~1e-5 px)
_SIMILARITY_TOLERANCE = 1e-5  # |A^T A / s^2 - I| of a stored (float32) s Q
_SINGULAR = 1e12  # condition number of M beyond which the projection has no camera centre
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


def find_camera_file(folder: Path) -> Path | None:
    """The camera file of an IDR / NeuS / MonoSDF folder (:data:`CAMERA_FILES`, in order), or None."""
    return next((folder / name for name in CAMERA_FILES if (folder / name).is_file()), None)


def decompose_projection(P: Tensor, where: str) -> tuple[Tensor, Tensor]:
    """``(K (3, 3), world_to_cam (4, 4))`` float64 with ``P ~ K [R | t]`` for a projection ``P (3, 4)``
    (module doc; the pixel shift is the caller's). ``where`` names the file and field in errors."""
    P = P.double()
    if not torch.isfinite(P).all():
        raise SceneError(f"{where} is not finite: {P.tolist()}")
    M = P[:, :3]
    singular = torch.linalg.svdvals(M)
    if singular[-1] == 0 or singular[0] / singular[-1] > _SINGULAR:
        values = ", ".join(f"{value:.4g}" for value in singular.tolist())
        raise SceneError(f"{where} is singular (its 3x3 part has singular values [{values}]): no camera")
    if torch.linalg.det(M) < 0:
        P, M = -P, -M
    reverse = torch.eye(3, dtype=torch.float64).flip(0)
    Q, U = torch.linalg.qr((reverse @ M).T)  # (reverse M)^T = Q U  =>  M = (reverse U^T reverse)(reverse Q^T)
    K, R = reverse @ U.T @ reverse, reverse @ Q.T
    signs = torch.diag(torch.sign(torch.diagonal(K)))
    K, R = K @ signs, signs @ R
    t = torch.linalg.solve(K, P[:, 3])
    K = K / K[2, 2]
    shift = abs(float(K[0, 1] * K[1, 2] / K[1, 1]))
    if shift > MAX_SKEW_SHIFT:
        raise SceneError(
            f"{where} has skewed pixels (K[0, 1] = {float(K[0, 1]):.4g}, moving pixels by up to {shift:.3g} px); "
            "only zero-skew cameras are supported"
        )
    K[0, 1] = 0.0
    return K, make_se3(R, t)


def _array(archive, path: Path, key: str, shapes: tuple[tuple[int, ...], ...]) -> Tensor:
    """``archive[key]`` as float64, a one-line error naming ``path`` and ``key`` unless numeric of ``shapes``."""
    try:
        array = archive[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError) as error:
        raise SceneError(f"{path}: cannot read field {key}: {one_line(error)}") from error
    if array.dtype.kind not in "iuf" or array.shape not in shapes:
        wanted = " or ".join("x".join(map(str, shape)) for shape in shapes)
        raise SceneError(f"{path}: field {key} must be a numeric {wanted} matrix, got {array.dtype} {array.shape}")
    return torch.from_numpy(array.astype(np.float64))


def _check_scale(scale: Tensor, first: Tensor, path: Path, key: str) -> None:
    """A one-line error unless ``scale`` is a finite similarity equal to the first view's ``first``."""
    A = scale[:3, :3]
    det = float(torch.linalg.det(A)) if torch.isfinite(scale).all() else float("nan")
    s2 = abs(det) ** (2 / 3)
    similar = det > 0 and bool((A.T @ A / s2 - torch.eye(3, dtype=A.dtype)).abs().max() <= _SIMILARITY_TOLERANCE)
    if not similar or scale[3].tolist() != [0.0, 0.0, 0.0, 1.0]:
        raise SceneError(
            f"{path}: field {key} must be a similarity [[s R, c], [0, 0, 0, 1]] (s > 0, R a rotation), "
            f"got {scale.tolist()}"
        )
    if not torch.allclose(scale, first, rtol=1e-6, atol=0):
        raise SceneError(f"{path}: field {key} differs from scale_mat_0; one scene has one normalisation")


def _indices(keys: list[str], path: Path) -> int:
    """The number of views: ``world_mat_0 .. world_mat_{N-1}`` must all be there."""
    found = {int(m[1]) for key in keys if (m := re.fullmatch(r"world_mat_(\d+)", key))}
    if not found:
        raise SceneError(f"{path}: no field world_mat_0 (IDR / NeuS / MonoSDF cameras); it holds {sorted(keys)[:10]}")
    missing = sorted(set(range(len(found))) - found)
    if missing:
        raise SceneError(f"{path}: field world_mat_{missing[0]} is missing (it has world_mat_0 to {max(found)})")
    return len(found)


def read_idr_cameras(path: str | Path) -> tuple[Tensor, Tensor]:
    """``(K (N, 3, 3), world_to_cam (N, 4, 4))`` float64 of an IDR / NeuS / MonoSDF camera file, in the
    normalised frame and the project's pixel convention (module doc)."""
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError) as error:
        raise SceneError(f"{path}: cannot read: {one_line(error)}") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise SceneError(f"{path}: expected an .npz archive of world_mat_i / scale_mat_i, got one .npy array")
    with archive:
        count = _indices(list(archive.files), path)
        scaled = [f"scale_mat_{i}" in archive.files for i in range(count)]
        if any(scaled) and not all(scaled):
            raise SceneError(f"{path}: field scale_mat_{scaled.index(False)} is missing (scale_mat_0 is there)")
        Ks, poses, first = [], [], None
        for i in range(count):
            P = _array(archive, path, f"world_mat_{i}", ((3, 4), (4, 4)))[:3]
            if all(scaled):
                scale = _array(archive, path, f"scale_mat_{i}", ((4, 4),))
                first = scale if first is None else first
                _check_scale(scale, first, path, f"scale_mat_{i}")
                P = P @ scale
            K, world_to_cam = decompose_projection(
                P, f"{path}: field world_mat_{i}" + (f" @ scale_mat_{i}" if all(scaled) else "")
            )
            K[:2, 2] += 0.5  # pixel centres at integers -> at half-integers
            Ks.append(K)
            poses.append(world_to_cam)
    return torch.stack(Ks), torch.stack(poses)


def _images(folder: Path) -> tuple[list[Path], str]:
    """The image files (sorted) and where they are: MonoSDF's ``*_rgb.png``, else IDR's ``image/``."""
    rgb = sorted(p for p in folder.glob("*_rgb.png") if p.is_file())
    if rgb:
        return rgb, "*_rgb.png"
    if (folder / "image").is_dir():
        return sorted(p for p in (folder / "image").iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES), "image/"
    raise SceneError(f"{folder}: no images; looked for *_rgb.png (MonoSDF) and image/ (IDR, NeuS)")


def _masks(folder: Path, count: int) -> list[Path | None]:
    """IDR's ``mask/`` files in sorted order (one per image); all None without the folder."""
    if not (folder / "mask").is_dir():
        return [None] * count
    masks = sorted(p for p in (folder / "mask").iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
    if len(masks) != count:
        raise SceneError(f"{folder / 'mask'}: {len(masks)} masks for {count} images (one per image, in sorted order)")
    return list(masks)


def _prior(image: Path, kind: str) -> Path | None:
    """MonoSDF's ``NNNNNN_{kind}.npy`` beside ``NNNNNN_rgb.png``, when it exists."""
    if not image.name.endswith("_rgb.png"):
        return None
    path = image.with_name(image.name.removesuffix("_rgb.png") + f"_{kind}.npy")
    return path if image_file_exists(path) else None


def read_idr_frames(folder: str | Path, image_factor: int | None = None) -> list[Frame]:
    """Frames of an IDR / NeuS / MonoSDF scene folder (module doc)."""
    folder = Path(folder)
    if image_factor is not None:
        raise SceneError(f"{folder}: image_factor picks an images_N/ folder; IDR / MonoSDF scenes have none")
    camera_file = find_camera_file(folder)
    if camera_file is None:
        raise SceneError(f"{folder}: no {' or '.join(CAMERA_FILES)}")
    K, world_to_cam = read_idr_cameras(camera_file)
    files, where = _images(folder)
    if len(files) != len(K):
        raise SceneError(f"{folder}: {len(files)} images ({where}) but {camera_file.name} has {len(K)} cameras")
    masks = _masks(folder, len(files))
    return [
        Frame(
            file,
            K[i],
            world_to_cam[i],
            label=f"{camera_file} world_mat_{i} ({file.name})",
            mask=masks[i],
            depth_prior=_prior(file, "depth"),
            normal_prior=_prior(file, "normal"),
        )
        for i, file in enumerate(files)
    ]
