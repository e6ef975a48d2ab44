"""`Cameras`: a validated batch of pinhole cameras in the project's conventions.

K is ``(B, V, 3, 3)`` in pixels with zero skew, ``world_to_cam`` is ``(B, V, 4, 4)``
world-to-camera with OpenCV axes (x right, y down, z forward), ``image_size`` is ``(H, W)``.
Every other convention is converted by the data loaders, never here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.types import Device

from .errors import InputError, checking_values
from .geometry import geometry_dtype, invert_se3, normalize_intrinsics
from .shapes import check_shapes

__all__ = ["Cameras", "CameraError", "MAX_TRANSLATION", "FOCAL_RANGE", "MAX_PRINCIPAL_OFFSET"]

# The range of camera values every encoding is tested finite in (float32, forward and backward;
# docs/errors.md): focal lengths from 1e-4 to 1e6 image sizes (fx / W, fy / H), principal points
# within 1e4 image sizes of the origin, translations up to 1e10 scene units.
FOCAL_RANGE = (1e-4, 1e6)
MAX_PRINCIPAL_OFFSET = 1e4
MAX_TRANSLATION = 1e10


class CameraError(InputError):
    """Invalid camera input; the message names the offending batch entry and view."""


def _first_bad(mask: Tensor) -> str:
    """'[b=.., v=..]' for the first True entry of a ``(B, V)`` mask ('[b=..]' for ``(B,)``, '' for a
    single matrix's 0-d mask)."""
    if mask.ndim == 0:
        return ""
    return "[" + ", ".join(f"{axis}={int(i)}" for axis, i in zip("bv", mask.nonzero()[0])) + "]"


def _rotation_tolerance(atol: float, dtype: torch.dtype) -> float:
    """``atol``, widened to twice the machine epsilon of low-precision dtypes (bf16 rounds a
    rotation's entries by up to 0.4 %, which makes |R^T R - I| up to about 0.9 eps)."""
    return max(atol, 2 * torch.finfo(dtype).eps)


def _check_rigid(E: Tensor, atol: float, name: str) -> None:
    """A :class:`CameraError` naming ``name`` and the first bad entry unless every ``E (..., 4, 4)`` is
    rigid: bottom row [0, 0, 0, 1] and a proper rotation, within ``atol`` (widened by
    :func:`_rotation_tolerance`), checked in float32 (float64 inputs in float64)."""
    atol = _rotation_tolerance(atol, E.dtype)
    E = E.to(geometry_dtype(E.dtype))
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=E.dtype, device=E.device)
    bad = (E[..., 3, :] - bottom).abs().amax(-1) > atol
    if bad.any():
        raise CameraError(f"{name}{_first_bad(bad)} must have bottom row [0, 0, 0, 1]")
    R = E[..., :3, :3]
    det = torch.linalg.det(R)
    bad = det < 0
    if bad.any():
        raise CameraError(
            f"{name}{_first_bad(bad)} has a reflection (det R = {float(det[bad][0]):.4g}); a proper "
            "rotation (det +1) is required: convert axis conventions where the data is loaded"
        )
    err = (R.transpose(-1, -2) @ R - torch.eye(3, dtype=E.dtype, device=E.device)).abs().flatten(-2).amax(-1)
    bad = (err > atol) | ((det - 1).abs() > atol)
    if bad.any():
        raise CameraError(
            f"{name}{_first_bad(bad)} is not a rotation: |R^T R - I| = {float(err[bad][0]):.3g}, "
            f"det R = {float(det[bad][0]):.4g} (tolerance {atol:g})"
        )


class Cameras:
    """A ``(B, V)`` batch of pinhole cameras.

    Args:
        K: ``(B, V, 3, 3)`` intrinsics in pixels (positive focal lengths, zero skew).
        world_to_cam: ``(B, V, 4, 4)`` rigid world-to-camera transforms, OpenCV axes.
        image_size: ``(H, W)`` in pixels, the image the intrinsics refer to.
        validate: check devices, finiteness, proper rotations and the value ranges below (default
            True; a data pass over these small tensors, skipped while ``torch.compile`` traces).
        rotation_atol: tolerance on ``|R^T R - I|`` and ``|det R - 1|``; at least twice the machine
            epsilon of world_to_cam's dtype, so bf16 and fp16 poses pass.

    Any floating dtype is accepted and kept (K and world_to_cam may differ); low-precision inputs
    are checked in float32 (a cast for the checks only), float64 ones in float64. Value ranges, in
    which every encoding is finite: focal lengths ``fx / W``, ``fy / H`` in :data:`FOCAL_RANGE`,
    principal points ``|cx / W|``, ``|cy / H|`` up to :data:`MAX_PRINCIPAL_OFFSET`, translations
    ``|t|`` up to :data:`MAX_TRANSLATION`.
    """

    def __init__(
        self,
        K: Tensor,
        world_to_cam: Tensor,
        image_size: tuple[int, int],
        *,
        validate: bool = True,
        rotation_atol: float = 1e-3,
    ) -> None:
        self.K = K
        self.world_to_cam = world_to_cam
        self.image_size = (int(image_size[0]), int(image_size[1]))
        if validate:
            self._validate(rotation_atol)

    # ------------------------------------------------------------------ validation
    def _validate(self, atol: float) -> None:
        K, E = self.K, self.world_to_cam
        check_shapes(
            {"K": (K, "B V 3 3"), "world_to_cam": (E, "B V 4 4")},
            error=CameraError,
            same_device=True,
            floating=True,
        )
        height, width = self.image_size
        if height <= 0 or width <= 0:
            raise CameraError(f"image_size must be positive (H, W), got {self.image_size}")
        if not checking_values():
            return
        for name, x in (("K", K), ("world_to_cam", E)):
            bad = ~torch.isfinite(x).flatten(2).all(-1)
            if bad.any():
                raise CameraError(f"{name}{_first_bad(bad)} has a non-finite entry (NaN or inf)")
        self._validate_intrinsics(K)
        self._validate_ranges(K, E)
        _check_rigid(E, atol, "world_to_cam")

    @staticmethod
    def _validate_intrinsics(K: Tensor) -> None:
        focal = torch.stack([K[..., 0, 0], K[..., 1, 1]], -1)
        bad = (focal <= 0).any(-1)
        if bad.any():
            b_v = _first_bad(bad)
            fx, fy = (float(f) for f in focal[bad][0])
            raise CameraError(f"K{b_v} needs positive focal lengths, got fx={fx:g}, fy={fy:g}")
        bad = K[..., 0, 1] != 0
        if bad.any():
            raise CameraError(f"K{_first_bad(bad)} has nonzero skew; only zero-skew K is supported")
        last_row = torch.tensor([0.0, 0.0, 1.0], dtype=K.dtype, device=K.device)
        bad = (K[..., 1, 0] != 0) | (K[..., 2, :] != last_row).any(-1)
        if bad.any():
            raise CameraError(f"K{_first_bad(bad)} must have the form [[fx,0,cx],[0,fy,cy],[0,0,1]]")

    def _validate_ranges(self, K: Tensor, E: Tensor) -> None:
        """The value ranges of the class doc, each a :class:`CameraError` naming the view."""
        height, width = self.image_size
        size = torch.tensor([width, height], dtype=geometry_dtype(K.dtype), device=K.device)
        focal = torch.stack([K[..., 0, 0], K[..., 1, 1]], -1).to(size.dtype) / size
        low, high = FOCAL_RANGE
        bad = ((focal < low) | (focal > high)).any(-1)
        if bad.any():
            fx, fy = (float(f) for f in focal[bad][0])
            raise CameraError(
                f"K{_first_bad(bad)} has focal lengths fx / W = {fx:.3g}, fy / H = {fy:.3g}, outside "
                f"[{low:g}, {high:g}] (in image sizes)"
            )
        centre = (K[..., :2, 2].to(size.dtype) / size).abs().amax(-1)
        bad = centre > MAX_PRINCIPAL_OFFSET
        if bad.any():
            raise CameraError(
                f"K{_first_bad(bad)} has its principal point {float(centre[bad][0]):.3g} image sizes off "
                f"the image, beyond {MAX_PRINCIPAL_OFFSET:g}"
            )
        distance = E[..., :3, 3].to(geometry_dtype(E.dtype)).abs().amax(-1)
        bad = distance > MAX_TRANSLATION
        if bad.any():
            raise CameraError(
                f"world_to_cam{_first_bad(bad)} has a translation of {float(distance[bad][0]):.3g}, beyond "
                f"{MAX_TRANSLATION:g}: express the scene in smaller units or nearer the origin"
            )

    # ------------------------------------------------------------------ accessors
    @property
    def batch_size(self) -> int:
        return self.K.shape[0]

    @property
    def num_views(self) -> int:
        return self.K.shape[1]

    @property
    def device(self) -> torch.device:
        return self.K.device

    @property
    def R(self) -> Tensor:
        """World-to-camera rotations ``(B, V, 3, 3)``."""
        return self.world_to_cam[..., :3, :3]

    @property
    def t(self) -> Tensor:
        """World-to-camera translations ``(B, V, 3)``."""
        return self.world_to_cam[..., :3, 3]

    def cam_to_world(self) -> Tensor:
        """Camera-to-world transforms ``(B, V, 4, 4)`` (closed-form inverse)."""
        return invert_se3(self.world_to_cam)

    def centers(self) -> Tensor:
        """Camera centres in world coordinates ``(B, V, 3)``."""
        return self.cam_to_world()[..., :3, 3]

    def normalized_K(self, dtype: torch.dtype | None = None) -> Tensor:
        """Normalised intrinsics K̂ ``(B, V, 3, 3)`` (DESIGN.md §2), optionally cast to ``dtype``."""
        K = self.K if dtype is None else self.K.to(dtype)
        return normalize_intrinsics(K, self.image_size)

    # ------------------------------------------------------------------ derived cameras
    def to(self, device: Device = None, dtype: torch.dtype | None = None) -> Cameras:
        return Cameras(
            self.K.to(device=device, dtype=dtype),
            self.world_to_cam.to(device=device, dtype=dtype),
            self.image_size,
            validate=False,
        )

    def select_views(self, index: int | slice | Sequence[int] | Tensor) -> Cameras:
        """Cameras of the views ``index`` (a slice, list or tensor over V)."""
        if isinstance(index, int):
            index = [index]
        return Cameras(self.K[:, index], self.world_to_cam[:, index], self.image_size, validate=False)

    def repeat_batch(self, count: int) -> Cameras:
        """``(B, V)`` -> ``(B * count, V)``: each batch element's cameras ``count`` times in a row
        (element ``b * count + c`` is element ``b``), e.g. one copy per attention head."""
        K, E = (x.repeat_interleave(count, dim=0) for x in (self.K, self.world_to_cam))
        return Cameras(K, E, self.image_size, validate=False)

    def transform_world(self, world_from_new: Tensor, *, validate: bool = True, rotation_atol: float = 1e-3) -> Cameras:
        """Re-express the cameras in a new world frame.

        ``world_from_new`` ``(4, 4)`` or ``(B, 4, 4)``, a rigid transform (checked like the poses
        unless ``validate=False``: finite, bottom row [0, 0, 0, 1], a proper rotation), maps
        new-frame coordinates to the old world frame, so each world-to-camera matrix becomes
        ``E @ world_from_new``.
        """
        G = world_from_new
        if (
            not isinstance(G, Tensor)
            or G.shape[-2:] != (4, 4)
            or G.ndim not in (2, 3)
            or (G.ndim == 3 and G.shape[0] != self.batch_size)
        ):
            shape = tuple(G.shape) if isinstance(G, Tensor) else type(G).__name__
            raise CameraError(f"world_from_new must have shape (4, 4) or ({self.batch_size}, 4, 4), got {shape}")
        if validate and not G.is_floating_point():
            raise CameraError(f"world_from_new must be a floating point tensor, got {G.dtype}")
        if validate and checking_values():
            bad = ~torch.isfinite(G).flatten(-2).all(-1)
            if bad.any():
                raise CameraError(f"world_from_new{_first_bad(bad)} has a non-finite entry (NaN or inf)")
            _check_rigid(G, rotation_atol, "world_from_new")
        G = G.to(self.world_to_cam)
        if G.ndim == 3:
            G = G[:, None]
        return Cameras(self.K, self.world_to_cam @ G, self.image_size, validate=False)

    # ------------------------------------------------------------------ scene scale
    def extent(self) -> Tensor:
        """The scene's length scale ``(B,)``: the largest distance of a camera centre from the mean
        centre of its batch element (0 for a single view or coincident centres)."""
        centres = self.centers()
        distances: Tensor = (centres - centres.mean(1, keepdim=True)).norm(dim=-1)
        return distances.amax(1)

    def rescaled(self, factor: float | Tensor) -> Cameras:
        """The same cameras in another length unit: every world and camera coordinate times
        ``factor`` (a positive float, or ``(B,)`` one per batch element), so translations scale by
        it and intrinsics and rotations stay. Per-token lengths must follow:
        :meth:`hrope.Planes.rescaled`, and depths times ``factor`` (docs/encodings.md, "Numerics
        in half precision"). Checked like the constructor (:class:`CameraError`)."""
        number = isinstance(factor, (int, float))  # kept in float64 until cast to world_to_cam's dtype
        value = (
            factor if isinstance(factor, Tensor) else torch.tensor(factor if number else math.nan, dtype=torch.float64)
        )
        if value.shape not in ((), (self.batch_size,)) or (
            checking_values() and not bool(((value > 0) & value.isfinite()).all())
        ):
            got = tuple(value.shape) if value.ndim else factor
            raise CameraError(f"factor must be a positive finite float or ({self.batch_size},) tensor, got {got}")
        world_to_cam = self.world_to_cam.clone()
        world_to_cam[..., :3, 3] *= value.to(world_to_cam).view(*value.shape, 1, 1)
        return Cameras(self.K, world_to_cam, self.image_size)

    def to_unit_scale(self) -> tuple[Cameras, Tensor]:
        """The cameras :meth:`rescaled` so that each batch element's :meth:`extent` is 1, and the
        factor ``(B,)`` applied (1 where the extent is 0): rescale planes and depths by it too."""
        extent = self.extent()
        factor = torch.where(extent > 0, 1.0 / extent.clamp_min(torch.finfo(extent.dtype).tiny), 1.0)
        return self.rescaled(factor), factor

    def __repr__(self) -> str:
        return f"Cameras(batch={self.batch_size}, views={self.num_views}, image_size={self.image_size})"
