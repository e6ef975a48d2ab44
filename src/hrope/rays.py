"""Per-pixel Plücker ray maps, the LVSM model's camera input (DESIGN.md §5).

Pixel centres (+0.5) are unprojected with K^-1 (OpenCV axes), normalised to unit direction d,
and paired with the ray origin o as the 6 channels ``[o x d, d]`` (LVSM's order).
``frame="world"`` rotates d into the world frame and uses the camera centre as o (absolute pose,
LVSM's baseline); ``frame="camera"`` keeps d in each camera's own frame with o = 0, so the moment
channels are zero and the tokens carry no global pose (RayRoPE's ``camray``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cameras import Cameras
from .geometry import pixel_rays

__all__ = ["plucker_rays", "RAY_FRAMES"]

RAY_FRAMES = ("world", "camera")


def plucker_rays(cameras: Cameras, frame: str = "world") -> Tensor:
    """Plücker ray map ``(B, V, 6, H, W)`` with channels ``[o x d, d]`` for ``cameras.image_size``."""
    if frame not in RAY_FRAMES:
        raise ValueError(f"ray frame must be one of {RAY_FRAMES}, got {frame!r}")
    with torch.autocast(cameras.device.type, enabled=False):  # geometry in float32
        return _plucker_rays(cameras, frame)


def _plucker_rays(cameras: Cameras, frame: str) -> Tensor:
    K = cameras.K.float()
    dirs = pixel_rays(K, cameras.image_size).contiguous()  # einsum leaves it strided: norm() is ~20x slower
    if frame == "world":
        R = cameras.R.to(K.dtype)
        dirs = torch.einsum("bvji,bvhwj->bvhwi", R, dirs)  # R^T d
        origin = cameras.centers().to(K.dtype)[:, :, None, None, :].expand_as(dirs)
    else:
        origin = torch.zeros_like(dirs)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    moment = torch.cross(origin, dirs, dim=-1)
    return torch.cat([moment, dirs], dim=-1).permute(0, 1, 4, 2, 3)
