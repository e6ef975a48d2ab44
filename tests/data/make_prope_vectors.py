"""How ``prope_official_vectors.json`` is made, and a check that it still says what it claims.

The stored file holds, for six cases, float64 inputs (q, k, v, pixel K, world-to-camera poses,
image size, patch grid) and the output of the official PRoPE attention (liruilong940607/prope,
``main`` branch, torch implementation) on them: ``prope`` with the intrinsics, ``gta`` with
``Ks=None``. ``tests/test_encodings.py`` compares hrope's ``prope`` and ``gta`` with those stored
outputs. Where the file came from, and what could and could not be established, is in
``tests/data/README.md``: in short, the script that drew the stored inputs and ran the official
module was not kept, so this file cannot regenerate the stored inputs bit for bit.

What this script does instead:

``python tests/data/make_prope_vectors.py`` (``--check``, the default)
    recomputes every stored output from the stored inputs with :func:`official_prope_attention`
    below, an independent float64 implementation of the official module's algorithm written from
    the description in the project's reference notes (``shared/reference/prope_gta.md`` §1; no
    code of the official repository is copied, and nothing of hrope is used), and prints the
    largest difference per case. Exit status 1 if any case differs by more than float64
    round-off (1e-12 of the case's largest |output|).

``python tests/data/make_prope_vectors.py --write OUT.json [--seed S]``
    draws new inputs of the same six shapes (:data:`CASES`) from ``torch.Generator`` seeds
    ``S + case index`` with :func:`draw_inputs`, computes their outputs with the same function
    and writes them in the stored file's format. The camera draw imitates the stored inputs'
    statistics (focal 0.9-1.2 x width, fy = 1.05 fx, principal point within 6 % of the centre,
    uniform rotations, unit Gaussian translations, unit Gaussian q/k/v) but is NOT the original
    generator; it refuses to overwrite the stored file, which the tests keep comparing against.
    Use it to make fresh vectors for the official module itself (run the official module on the
    written inputs and compare) or to extend the cases.

The official algorithm, per head (all heads share the transform), head_dim d with d % 8 == 0:

* P_c = lift(K̂_c) E_c with K̂ = [[fx/W, 0, cx/W - 0.5], [0, fy/H, cy/H - 0.5], [0, 0, 1]]
  (skew ignored), lift(A) = [[A, 0], [0, 1]], E_c the 4x4 world-to-camera pose; with ``Ks=None``
  (GTA mode) P_c = E_c. P_c^-1 in closed form: E^-1 lift(K̂^-1).
* channels [0, d/2): d/8 chunks of 4; q chunks <- P_i^T q, k and v chunks <- P_j^-1 k, the
  attention output's chunks <- P_i o.
* channels [d/2, 3d/4): 1-D RoPE on the patch x index, [3d/4, d): on the patch y index; d/8
  frequencies w_f = 100^(-f / (d/8)) per axis; split pairing (channel f of a quarter with channel
  f + d/8); q, k and v rotated by -angle, the output by +angle, R(a) (x, y) = (x cos a - y sin a,
  x sin a + y cos a).
* tokens view-major, then row-major with x fastest: token t of a view has x = t % grid_w,
  y = t // grid_w (integer patch indices).
* SDPA with the default scale 1/sqrt(d) between the transformed q, k, v.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from torch import Tensor

STORED = Path(__file__).resolve().parent / "prope_official_vectors.json"
ABOUT = (
    "Inputs and outputs of the official PRoPE attention (liruilong940607/prope, main branch, torch "
    "implementation) computed in float64. For 'gta' the official module was called with Ks=None. Shapes: "
    "q/k/v/out (B, heads, N, head_dim), N = V*grid_h*grid_w, tokens view-major then row-major (x fastest); "
    "K in pixels (B, V, 3, 3); world_to_cam (B, V, 4, 4), OpenCV; image_size (H, W); grid (grid_h, grid_w)."
)

# The six stored cases: (B, V, heads, head_dim, grid (h, w), image_size (H, W)), each for prope and gta.
CASES = [(1, 2, 2, 16, (2, 3), (32, 48)), (1, 3, 2, 48, (3, 3), (48, 48)), (2, 2, 1, 32, (2, 4), (20, 40))]
CHECK_TOLERANCE = 1e-12  # of the case's largest |output|; the stored outputs are float64


# ---------------------------------------------------------------------------------- the algorithm
def _lift(A: Tensor) -> Tensor:
    """[[A, 0], [0, 1]] for 3x3 ``A (..., 3, 3)``."""
    out = torch.zeros(*A.shape[:-2], 4, 4, dtype=A.dtype)
    out[..., :3, :3] = A
    out[..., 3, 3] = 1.0
    return out


def projective_matrices(world_to_cam: Tensor, K: Tensor | None, image_size) -> tuple[Tensor, Tensor]:
    """P = lift(K̂) E and its closed-form inverse E^-1 lift(K̂^-1), each ``(B, V, 4, 4)``; K None: P = E."""
    E = world_to_cam
    R, t = E[..., :3, :3], E[..., :3, 3]
    E_inv = torch.zeros_like(E)
    E_inv[..., :3, :3] = R.transpose(-1, -2)
    E_inv[..., :3, 3] = -(R.transpose(-1, -2) @ t[..., None])[..., 0]
    E_inv[..., 3, 3] = 1.0
    if K is None:
        return E, E_inv
    H, W = image_size
    fx, fy = K[..., 0, 0] / W, K[..., 1, 1] / H
    cx, cy = K[..., 0, 2] / W - 0.5, K[..., 1, 2] / H - 0.5
    K_hat = torch.zeros_like(K)
    K_hat[..., 0, 0], K_hat[..., 0, 2], K_hat[..., 1, 1], K_hat[..., 1, 2], K_hat[..., 2, 2] = fx, cx, fy, cy, 1.0
    K_hat_inv = torch.zeros_like(K)
    K_hat_inv[..., 0, 0], K_hat_inv[..., 0, 2] = 1 / fx, -cx / fx
    K_hat_inv[..., 1, 1], K_hat_inv[..., 1, 2] = 1 / fy, -cy / fy
    K_hat_inv[..., 2, 2] = 1.0
    return _lift(K_hat) @ E, E_inv @ _lift(K_hat_inv)


def _rope_angles(grid, num_views: int, num_freqs: int) -> tuple[Tensor, Tensor]:
    """Per-token angles ``(N, F)`` of the x and the y axis (integer patch indices, base 100)."""
    grid_h, grid_w = grid
    token = torch.arange(grid_h * grid_w, dtype=torch.float64)
    x, y = token % grid_w, torch.div(token, grid_w, rounding_mode="floor")
    freqs = 100.0 ** (-torch.arange(num_freqs, dtype=torch.float64) / num_freqs)
    return (x[:, None] * freqs).repeat(num_views, 1), (y[:, None] * freqs).repeat(num_views, 1)


def _rotate(x: Tensor, angles: Tensor) -> Tensor:
    """R(angle) on the split pairs (f, f + F) of one RoPE quarter ``(..., N, 2F)``; angles ``(N, F)``."""
    F_ = angles.shape[-1]
    a, b = x[..., :F_], x[..., F_:]
    c, s = angles.cos(), angles.sin()
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def _transform(x: Tensor, M: Tensor, angles_x: Tensor, angles_y: Tensor, sign: float) -> Tensor:
    """[M on each 4-chunk of the first half | R(sign angle_x) | R(sign angle_y)] of x ``(B, h, N, d)``,
    M ``(B, V, 4, 4)`` (one per view)."""
    B, heads, N, d = x.shape
    V = M.shape[1]
    chunks = x[..., : d // 2].reshape(B, heads, V, N // V, d // 8, 4)
    projective = (M[:, None, :, None, None] @ chunks[..., None])[..., 0].reshape(B, heads, N, d // 2)
    rope_x = _rotate(x[..., d // 2 : 3 * d // 4], sign * angles_x)
    rope_y = _rotate(x[..., 3 * d // 4 :], sign * angles_y)
    return torch.cat([projective, rope_x, rope_y], dim=-1)


def official_prope_attention(
    q: Tensor, k: Tensor, v: Tensor, world_to_cam: Tensor, K: Tensor | None, image_size, grid
) -> Tensor:
    """The official module's output, float64: q, k, v ``(B, heads, N, d)``, ``world_to_cam (B, V, 4, 4)``,
    pixel ``K (B, V, 3, 3)`` or None (GTA mode), ``image_size (H, W)``, ``grid (grid_h, grid_w)``."""
    q, k, v, world_to_cam = (x.double() for x in (q, k, v, world_to_cam))
    d, V = q.shape[-1], world_to_cam.shape[1]
    assert d % 8 == 0 and q.shape[-2] == V * grid[0] * grid[1]
    P, P_inv = projective_matrices(world_to_cam, None if K is None else K.double(), image_size)
    ax, ay = _rope_angles(grid, V, d // 8)
    q_t = _transform(q, P.transpose(-1, -2), ax, ay, -1.0)
    k_t = _transform(k, P_inv, ax, ay, -1.0)
    v_t = _transform(v, P_inv, ax, ay, -1.0)
    weights = torch.softmax(q_t @ k_t.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return _transform(weights @ v_t, P, ax, ay, 1.0)


def case_output(case: dict) -> Tensor:
    """:func:`official_prope_attention` on one stored case (its ``encoding`` picks K or None)."""
    T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    K = T(case["K"]) if case["encoding"] == "prope" else None
    return official_prope_attention(
        T(case["q"]),
        T(case["k"]),
        T(case["v"]),
        T(case["world_to_cam"]),
        K,
        tuple(case["image_size"]),
        tuple(case["grid"]),
    )


# ---------------------------------------------------------------------------------- new inputs
def _rotation(g: torch.Generator, *shape: int) -> Tensor:
    """Uniform rotations ``(*shape, 3, 3)``: QR of a Gaussian matrix, signs fixed, det +1."""
    Q, R = torch.linalg.qr(torch.randn(*shape, 3, 3, generator=g, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]
    Q[..., :, 0] = Q[..., :, 0] * torch.linalg.det(Q)[..., None]
    return Q


def draw_inputs(B: int, V: int, heads: int, head_dim: int, grid, image_size, seed: int) -> dict:
    """One case's inputs (see the module docstring; not the stored file's original generator)."""
    g = torch.Generator().manual_seed(seed)
    H, W = image_size
    u = torch.rand(B, V, 3, generator=g, dtype=torch.float64)
    K = torch.zeros(B, V, 3, 3, dtype=torch.float64)
    K[..., 0, 0] = W * (0.9 + 0.3 * u[..., 0])
    K[..., 1, 1] = 1.05 * K[..., 0, 0]
    K[..., 0, 2] = W * (0.44 + 0.12 * u[..., 1])
    K[..., 1, 2] = H * (0.44 + 0.12 * u[..., 2])
    K[..., 2, 2] = 1.0
    E = torch.zeros(B, V, 4, 4, dtype=torch.float64)
    E[..., :3, :3] = _rotation(g, B, V)
    E[..., :3, 3] = torch.randn(B, V, 3, generator=g, dtype=torch.float64)
    E[..., 3, 3] = 1.0
    N = V * grid[0] * grid[1]
    q, k, v = (torch.randn(B, heads, N, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    return {
        "grid": list(grid),
        "image_size": list(image_size),
        "K": K.tolist(),
        "world_to_cam": E.tolist(),
        "q": q.tolist(),
        "k": k.tolist(),
        "v": v.tolist(),
    }


def make_cases(seed: int) -> list[dict]:
    """The six cases of :data:`CASES` (prope, then gta on the same inputs) with their outputs."""
    cases = []
    for index, (B, V, heads, head_dim, grid, image_size) in enumerate(CASES):
        inputs = draw_inputs(B, V, heads, head_dim, grid, image_size, seed + index)
        for encoding in ("prope", "gta"):
            case = {"encoding": encoding, **inputs}
            case["out"] = case_output(case).tolist()
            cases.append(case)
    return cases


# ---------------------------------------------------------------------------------- command line
def check(path: Path = STORED) -> list[dict]:
    """Each stored case recomputed from its stored inputs: ``[{encoding, grid, max_abs, relative}]``."""
    rows = []
    for case in json.loads(path.read_text())["cases"]:
        expected = torch.tensor(case["out"], dtype=torch.float64)
        error = (case_output(case) - expected).abs().max().item()
        rows.append(
            {
                "encoding": case["encoding"],
                "grid": case["grid"],
                "max_abs": error,
                "relative": error / expected.abs().max().item(),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, help="write new vectors here (never the stored file)")
    parser.add_argument("--seed", type=int, default=0, help="first torch.Generator seed of --write")
    args = parser.parse_args(argv)
    if args.write is not None:
        if args.write.resolve() == STORED:
            parser.error(f"refusing to overwrite {STORED.name}: the tests compare against the stored vectors")
        data = {
            "about": ABOUT + " Written by tests/data/make_prope_vectors.py --seed "
            f"{args.seed} (outputs from its own implementation of the official algorithm).",
            "cases": make_cases(args.seed),
        }
        args.write.write_text(json.dumps(data))
        print(f"wrote {len(data['cases'])} cases to {args.write}")
        return 0
    rows = check()
    for row in rows:
        print(
            f"{row['encoding']:<6} grid {tuple(row['grid'])}: max |recomputed - stored| {row['max_abs']:.1e} "
            f"({row['relative']:.1e} of max |stored|)"
        )
    bad = [r for r in rows if r["relative"] > CHECK_TOLERANCE]
    print(f"{len(rows) - len(bad)} of {len(rows)} stored cases reproduced to {CHECK_TOLERANCE:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
