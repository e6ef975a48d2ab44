"""Random valid geometry for the tests: rotations, cameras with jittered intrinsics, planes."""

from __future__ import annotations

import torch

import hrope


def random_rotation(*shape, generator=None, dtype=torch.float64) -> torch.Tensor:
    """Uniform random rotations ``(*shape, 3, 3)`` (QR of a Gaussian matrix, det fixed to +1)."""
    A = torch.randn(*shape, 3, 3, generator=generator, dtype=dtype)
    Q, R = torch.linalg.qr(A)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]
    det = torch.linalg.det(Q)
    Q[..., :, 0] = Q[..., :, 0] * det[..., None]
    return Q


def random_se3(*shape, generator=None, dtype=torch.float64, translation_scale=1.0) -> torch.Tensor:
    E = torch.zeros(*shape, 4, 4, dtype=dtype)
    E[..., :3, :3] = random_rotation(*shape, generator=generator, dtype=dtype)
    E[..., :3, 3] = translation_scale * torch.randn(*shape, 3, generator=generator, dtype=dtype)
    E[..., 3, 3] = 1.0
    return E


def random_intrinsics(B, V, image_size, generator=None, dtype=torch.float64) -> torch.Tensor:
    """Pixel K with focal 0.7–1.5 x width (fx != fy) and principal point jittered by ±10 %."""
    H, W = image_size
    u = torch.rand(B, V, 4, generator=generator, dtype=dtype)
    K = torch.zeros(B, V, 3, 3, dtype=dtype)
    K[..., 0, 0] = W * (0.7 + 0.8 * u[..., 0])
    K[..., 1, 1] = H * (0.7 + 0.8 * u[..., 1])
    K[..., 0, 2] = W * (0.5 + 0.2 * (u[..., 2] - 0.5))
    K[..., 1, 2] = H * (0.5 + 0.2 * (u[..., 3] - 0.5))
    K[..., 2, 2] = 1.0
    return K


def random_cameras(B=1, V=2, image_size=(32, 48), seed=0, dtype=torch.float64) -> hrope.Cameras:
    g = torch.Generator().manual_seed(seed)
    return hrope.Cameras(random_intrinsics(B, V, image_size, g, dtype), random_se3(B, V, generator=g, dtype=dtype),
                         image_size)


def random_planes(B, N, seed=0, dtype=torch.float64) -> hrope.Planes:
    """Planes facing the camera (normal within ~70° of -z) at depths 1–4."""
    g = torch.Generator().manual_seed(seed + 1000)
    normal = torch.randn(B, N, 3, generator=g, dtype=dtype) * 0.6
    normal[..., 2] = -1.0
    depth = 1.0 + 3.0 * torch.rand(B, N, generator=g, dtype=dtype)
    return hrope.Planes(normal, depth)


def random_qkv(B, heads, N, head_dim, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed + 2000)
    return tuple(torch.randn(B, heads, N, head_dim, generator=g, dtype=dtype) for _ in range(3))


def encoding_params(name, B, N, seed=0, dtype=torch.float64) -> dict:
    """Valid random per-token params of the ablation and query-frame encodings."""
    g = torch.Generator().manual_seed(seed + 3000)
    if name == "rayrope":
        return {"log_depth": 0.5 + 1.5 * torch.rand(B, N, generator=g, dtype=dtype),
                "log_depth_halfwidth": 0.5 * torch.rand(B, N, generator=g, dtype=dtype)}
    if name == "worldrope":
        return {"depth": 2 + 3 * torch.rand(B, N, generator=g, dtype=dtype),
                "depth_split": torch.rand(B, N, generator=g, dtype=dtype),
                "depth_sigma": 0.5 * torch.rand(B, N, 2, generator=g, dtype=dtype)}
    if name == "hrope-depth":
        return {"depth": 0.5 + 3 * torch.rand(B, N, generator=g, dtype=dtype)}
    if name == "hrope-so3":
        return {"rotation": random_rotation(B, N, generator=g, dtype=dtype)}
    if name == "hrope-se3":
        return {"transform": random_se3(B, N, generator=g, dtype=dtype)}
    if name == "hrope-full":
        G = torch.eye(4, dtype=dtype) + 0.3 * torch.randn(B, N, 4, 4, generator=g, dtype=dtype)
        return {"transform": G}
    return {}


def encoding_inputs(name, cameras, grid, seed=0, dtype=torch.float64) -> dict:
    """``planes`` and ``params`` kwargs for encoding ``name`` on random valid geometry."""
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    enc = hrope.get_encoding(name)
    return {
        "planes": random_planes(B, N, seed, dtype) if enc.needs_planes else None,
        "params": encoding_params(name, B, N, seed, dtype),
    }


def so3_exp(w: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from axis-angle vectors ``(..., 3)`` (Rodrigues)."""
    theta = w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    k = w / theta
    Kx = torch.zeros(*w.shape[:-1], 3, 3, dtype=w.dtype)
    Kx[..., 0, 1], Kx[..., 0, 2] = -k[..., 2], k[..., 1]
    Kx[..., 1, 0], Kx[..., 1, 2] = k[..., 2], -k[..., 0]
    Kx[..., 2, 0], Kx[..., 2, 1] = -k[..., 1], k[..., 0]
    s, c = torch.sin(theta)[..., None], torch.cos(theta)[..., None]
    return torch.eye(3, dtype=w.dtype) + s * Kx + (1 - c) * Kx @ Kx


RELATIVE = ["none", "rope2d", "prope", "gta", "cape", "hrope", "hrope-lift",
            "hrope-depth", "hrope-so3", "hrope-se3", "hrope-pf", "hrope-full"]
