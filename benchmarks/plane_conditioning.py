"""How far can one token pair's plane transform stretch q and k? ``hrope-lift`` on room vs object.

For the held-out scenes of the synthetic datasets (the NVS benchmark's 64 ``eval`` scenes, scene
normalised, 2 context + 1 target views), every token gets its ground-truth plane m (all views:
this measures the transform, not a fair source), optionally capped at ``|m| <= c`` as the geometry
sources' ``max_inverse_distance`` does. For every token pair (i, j) of a scene the logit is
q_i^T (D_i D_j^-1) k_j on each 4x4 tile, so the spectral norm of the 4x4 block D_i D_j^-1 says how
much the encoding can amplify a logit over PRoPE's (m = 0, where the block is an exact relative
pose and its norm stays near that of K̂ R K̂^-1). Reported: the fraction of patches whose |m|
exceeds each cap, and the median, 99th percentile and maximum of that norm over all pairs.

    python benchmarks/plane_conditioning.py        # about a minute on 2 cores

Writes benchmarks/results/plane_conditioning.{json,md}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hrope.nvs.running.atomic import write_json, write_text
from hrope.encodings import get_encoding
from hrope.nvs.config import resolve
from hrope.nvs.build_data import build_dataset, collate
from hrope.planes import Planes, clamp_plane_vectors
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"
CAPS = (None, 5.0, 2.0)
SCENES = 64
PATCH = 8  # the tiny preset: 64x64 images, an 8x8 patch grid


def pair_norms(m: torch.Tensor, batch, grid) -> torch.Tensor:
    """Spectral norms of D_i D_j^-1 ``(B, N, N)`` for planes m ``(B, N, 3)`` (float64)."""
    cameras = batch.cameras.to(dtype=torch.float64)
    D, D_inv = get_encoding("hrope-lift").lifts(cameras, grid, Planes.from_m(m.double()))
    D, D_inv = D.flatten(1, 2), D_inv.flatten(1, 2)  # (B, N, 4, 4)
    product = D[:, :, None] @ D_inv[:, None]  # (B, N, N, 4, 4)
    return torch.linalg.matrix_norm(product, ord=2)


def measure(kind: str, grid=(8, 8)) -> dict:
    config = resolve({"model": {"preset": "tiny"}, "data": {"kind": kind}, "eval": {"num_scenes": SCENES}})
    dataset = build_dataset(config, "eval")
    batch = collate([dataset[i] for i in range(SCENES)], 2, torch.device("cpu"))
    m = batch.planes(PATCH).m(batch.cameras, grid, torch.float64)
    size = m.norm(dim=-1)
    valid = size > 0
    rows = []
    for cap in CAPS:
        capped = m if cap is None else clamp_plane_vectors(m, cap)
        norms = pair_norms(capped, batch, grid).flatten()
        rows.append(
            {
                "cap": cap,
                "patches_above_cap": None if cap is None else float((size[valid] > cap).double().mean()),
                "norm_median": float(norms.median()),
                "norm_p99": float(norms.quantile(0.99)),
                "norm_max": float(norms.max()),
            }
        )
    prope = pair_norms(torch.zeros_like(m), batch, grid).flatten()
    return {
        "dataset": kind,
        "scenes": SCENES,
        "m_median": float(size[valid].median()),
        "m_p99": float(size[valid].quantile(0.99)),
        "m_max": float(size.max()),
        "planes": rows,
        "prope": {
            "norm_median": float(prope.median()),
            "norm_p99": float(prope.quantile(0.99)),
            "norm_max": float(prope.max()),
        },
    }


def markdown(report: dict) -> str:
    lines = [
        "## Plane transforms: how far one token pair can stretch a logit (`hrope-lift`, ground-truth planes)",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report['provenance'])}`  ",
        f"{SCENES} held-out scenes per dataset, 2 context + 1 target views, every view's ground-truth planes "
        "(scene normalised: unit context baseline). Norm: the spectral norm of the 4x4 block D_i D_j^-1 over "
        "all token pairs of a scene.",
        "",
        "| dataset | planes | patches above the cap | median | 99th percentile | max |",
        "|---|---|---|---|---|---|",
    ]
    for entry in report["datasets"]:
        p = entry["prope"]
        lines.append(
            f"| {entry['dataset']} | m = 0 (prope) | — | {p['norm_median']:.2f} | {p['norm_p99']:.2f} | "
            f"{p['norm_max']:.2f} |"
        )
        for row in entry["planes"]:
            label = "true m" if row["cap"] is None else f"true m, \\|m\\| ≤ {row['cap']:g}"
            above = "—" if row["patches_above_cap"] is None else f"{100 * row['patches_above_cap']:.2f} %"
            lines.append(
                f"| {entry['dataset']} | {label} | {above} | {row['norm_median']:.2f} | {row['norm_p99']:.2f} "
                f"| {row['norm_max']:.2f} |"
            )
    lines += [
        "",
        "|m| of the true planes: "
        + "; ".join(
            f"{e['dataset']} median {e['m_median']:.2f}, 99th percentile {e['m_p99']:.2f}, max {e['m_max']:.1f}"
            for e in report["datasets"]
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report = {
        "command": "python benchmarks/plane_conditioning.py",
        "provenance": provenance(),
        "datasets": [measure(kind) for kind in ("room", "object")],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "plane_conditioning.json", report)
    write_text(args.out / "plane_conditioning.md", markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
