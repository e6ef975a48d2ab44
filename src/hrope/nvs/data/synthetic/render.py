"""Exact CPU rendering of textured parallelograms ("quads") with depth, normals and planes.

A quad is ``{c + u a_u + v a_v : |u|, |v| <= 1}`` in world coordinates; its front side is the
side ``a_u x a_v`` points to. For every (view, quad) the plane-induced homography
``H = K [R a_u, R a_v, R c + t]`` maps quad coordinates ``(u, v, 1)`` to pixels; its inverse applied
to the pixel centre ``(x + 0.5, y + 0.5, 1)`` gives ``(u, v, 1) / z`` with ``z`` the exact z-depth
of the ray–plane intersection. A z-buffer on ``1 / z`` picks the nearest quad per pixel; textures
are looked up with mip-mapping (:class:`MipTextures`), so there is no texture aliasing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ....cameras import Cameras
from .textures import MipTextures

__all__ = ["Quads", "Rendering", "render"]

NEAR = 1e-3  # a quad is not drawn in a view whose camera is closer than this to its plane


@dataclass
class Quads:
    """P textured quads (float64 geometry).

    Attributes:
        centre, axis_u, axis_v: ``(P, 3)`` world coordinates (axes are half-extent vectors).
        two_sided: ``(P,)`` bool; one-sided quads are invisible from behind (closed solids).
        texture: ``(P,)`` long index into the texture stack.
        texture_scale, texture_offset: ``(P, 2)``: tile coordinates are ``u * scale + offset``.
        brightness: ``(P,)`` shading factor (view-independent, so multi-view consistent).
    """

    centre: Tensor
    axis_u: Tensor
    axis_v: Tensor
    two_sided: Tensor
    texture: Tensor
    texture_scale: Tensor
    texture_offset: Tensor
    brightness: Tensor

    @property
    def count(self) -> int:
        return self.centre.shape[0]

    def normals(self) -> Tensor:
        """Unit front normals ``(P, 3)``."""
        n = torch.linalg.cross(self.axis_u, self.axis_v)
        return n / n.norm(dim=-1, keepdim=True)

    def corners(self) -> Tensor:
        """Corners ``(P, 4, 3)``."""
        signs = torch.tensor([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=self.centre.dtype)
        u, v = signs[None, :, :1], signs[None, :, 1:]
        return self.centre[:, None] + u * self.axis_u[:, None] + v * self.axis_v[:, None]


@dataclass
class Rendering:
    """Per-view outputs; pixels that see no quad have depth inf, zero normal and m, id -1.

    images ``(V, 3, H, W)`` in [0, 1]; depth ``(V, H, W)`` z-depth; normals ``(V, 3, H, W)`` unit,
    camera frame, facing the camera; plane_m ``(V, 3, H, W)`` plane vector n / d (camera frame);
    plane_id ``(V, H, W)`` long index of the quad seen.
    """

    images: Tensor
    depth: Tensor
    normals: Tensor
    plane_m: Tensor
    plane_id: Tensor


def _camera_frame_quads(quads: Quads, cameras: Cameras) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per (view, quad): inverse homographies ``(V, P, 3, 3)``, visibility ``(V, P)``, plane
    vectors m ``(V, P, 3)`` and the pixel box ``(V, P, 4)`` (x0, y0, x1, y1; exclusive ends) that
    can contain the quad."""
    R = cameras.R[0].double()  # (V, 3, 3)
    t = cameras.t[0].double()
    K = cameras.K[0].double()
    rotate = lambda x: torch.einsum("vij,pj->vpi", R, x)  # noqa: E731
    centre = rotate(quads.centre) + t[:, None]
    M = torch.stack([rotate(quads.axis_u), rotate(quads.axis_v), centre], -1)
    det = torch.linalg.det(M)  # = (R a_u x R a_v) . c_cam: < 0 when the camera sees the front
    normal = torch.einsum("vij,pj->vpi", R, quads.normals())
    offset = (normal * centre).sum(-1)  # plane n . X = d in camera coordinates
    visible = (offset.abs() > NEAR) & (quads.two_sided[None] | (det < 0))

    H, W = cameras.image_size
    corners = torch.einsum("vij,pkj->vpki", R, quads.corners()) + t[:, None, None]
    in_front = corners[..., 2] > NEAR
    pixels = torch.einsum("vij,vpkj->vpki", K, corners)
    px = pixels[..., :2] / pixels[..., 2:].clamp_min(NEAR)
    low, high = (px.amin(-2) - 1).floor(), (px.amax(-2) + 1).ceil()
    full = torch.tensor([0.0, 0.0, W, H], dtype=px.dtype)
    box = torch.where(in_front.all(-1, keepdim=True), torch.cat([low, high], -1), full)
    box = torch.minimum(torch.maximum(box, full[:2].repeat(2)), full[2:].repeat(2)).long()
    visible &= in_front.any(-1) & (box[..., 2] > box[..., 0]) & (box[..., 3] > box[..., 1])

    safe_M = torch.where(visible[..., None, None], M, torch.eye(3, dtype=M.dtype))
    H_inv = torch.linalg.inv(K[:, None] @ safe_M)
    m = normal / torch.where(visible, offset, torch.ones_like(offset))[..., None]
    return H_inv, visible, m, box


def _pixel_centres(image_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Pixel-centre coordinates ``x (1, 1, W)`` and ``y (1, H, 1)``."""
    H, W = image_size
    centres = lambda n: torch.arange(n, dtype=torch.float32) + 0.5  # noqa: E731
    return centres(W).view(1, 1, W), centres(H).view(1, H, 1)


def _zbuffer(H_inv: Tensor, visible: Tensor, box: Tensor, image_size: tuple[int, int]) -> Tensor:
    """Index ``(V, H, W)`` of the nearest quad per pixel centre (-1 for none).

    Each quad is tested only in the views that may see it and within the union of its pixel boxes.
    """
    V, P = visible.shape
    x, y = _pixel_centres(image_size)
    A = H_inv.float()
    best = torch.zeros(V, *image_size)  # inverse depth (1 / z) of the nearest hit so far
    best_id = torch.full((V, *image_size), -1, dtype=torch.long)
    for p in range(P):
        views = visible[:, p].nonzero().squeeze(-1)
        if views.numel() == 0:
            continue
        x0, y0 = box[views, p, :2].amin(0).tolist()
        x1, y1 = box[views, p, 2:].amax(0).tolist()
        region = (slice(None) if views.numel() == V else views, slice(y0, y1), slice(x0, x1))
        a = A[region[0], p, :, :, None, None]  # (n, 3, 3, 1, 1)
        xs, ys = x[..., x0:x1], y[:, y0:y1]
        u, v, w = (a[:, i, 0] * xs + a[:, i, 1] * ys + a[:, i, 2] for i in range(3))
        nearest = best[region]
        hit = (torch.maximum(u.abs(), v.abs()) <= w) & (w > nearest)
        best[region] = torch.where(hit, w, nearest)
        best_id[region] = torch.where(hit, p, best_id[region])
    return best_id


def _gather(table: Tensor, index: Tensor) -> Tensor:
    """Per-pixel rows of a per-(view, quad) ``table (V, P, C)`` at ``index (V, H, W)`` -> ``(V, C, H, W)``."""
    V, H, W = index.shape
    C = table.shape[-1]
    flat = index.reshape(V, 1, H * W).expand(V, C, H * W)
    return torch.gather(table.transpose(1, 2), 2, flat).reshape(V, C, H, W)


def render(quads: Quads, textures: MipTextures, cameras: Cameras, background: float = 0.0) -> Rendering:
    """Render ``quads`` textured by ``textures`` into the V views of ``cameras`` (batch 1)."""
    if cameras.batch_size != 1:
        raise ValueError(f"render expects cameras with batch 1, got {cameras.batch_size}")
    V = cameras.num_views
    H_inv, visible, m, box = _camera_frame_quads(quads, cameras)
    plane_id = _zbuffer(H_inv, visible, box, cameras.image_size)
    hit = plane_id >= 0
    index = plane_id.clamp_min(0)

    per_quad = torch.cat(
        [quads.texture_scale, quads.texture_offset, quads.brightness[:, None], quads.texture[:, None].double()], -1
    ).expand(V, -1, -1)
    normal_table = -m / m.norm(dim=-1, keepdim=True).clamp_min(1e-30)  # faces the camera (n . X < 0)
    table = torch.cat([H_inv.flatten(2), per_quad, normal_table, m], -1).float()
    A, per_pixel, normals, plane_m = _gather(table, index).split([9, 6, 3, 3], 1)  # A: row-major 3x3
    scale_s, scale_t, offset_s, offset_t, brightness, texture = per_pixel.unbind(1)

    x, y = _pixel_centres(cameras.image_size)
    q = [A[:, 3 * i] * x + A[:, 3 * i + 1] * y + A[:, 3 * i + 2] for i in range(3)]
    z = 1.0 / q[2]
    u, v = q[0] * z, q[1] * z
    # Texture-tile coordinates and their derivatives along pixel x and y (for the mip level).
    ds_dx, ds_dy = ((A[:, j] - u * A[:, 6 + j]) * z * scale_s for j in (0, 1))
    dt_dx, dt_dy = ((A[:, 3 + j] - v * A[:, 6 + j]) * z * scale_t for j in (0, 1))
    footprint = torch.maximum(ds_dx.square() + dt_dx.square(), ds_dy.square() + dt_dy.square()).sqrt()
    colour = textures.sample(texture.long(), u * scale_s + offset_s, v * scale_t + offset_t, footprint * textures.size)
    images = torch.where(hit[:, None], (colour.transpose(0, 1) * brightness[:, None]).clamp(0, 1), float(background))
    mask = hit[:, None]
    return Rendering(
        images=images,
        depth=torch.where(hit, z, float("inf")),
        normals=torch.where(mask, normals, 0.0),
        plane_m=torch.where(mask, plane_m, 0.0),
        plane_id=plane_id,
    )
