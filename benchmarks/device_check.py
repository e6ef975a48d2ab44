"""Every encoding on one device against the float64 reference: the first thing to run on a GPU.

    python benchmarks/device_check.py --device cuda      # about a minute
    make bench-gpu                                       # this, then the GPU benchmarks

For each registered encoding and each dtype (float32, bfloat16, float16), random valid cameras,
planes and per-token parameters on the device: forward through ``hrope.multiview_attention``
(outputs compared with ``hrope.reference.multiview_attention`` in float64), then a backward
pass with a unit-scale random output gradient (all gradients finite). The largest error
relative to the reference's largest output is checked against a tolerance per dtype. Writes
``device_check_<device>.json``; exits 1 if any check fails. ``--device cpu`` runs the same checks
here (tests/test_benchmarks.py does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hrope.nvs.running.atomic import write_json
import hrope
import hrope.reference
from hrope.testing import encoding_inputs, random_cameras, random_qkv
from hrope.nvs.running.provenance import provenance


RESULTS = Path(__file__).resolve().parent / "results"
# Relative to max |reference|. Measured on the CPU (`--device cpu`, every encoding): worst float32 9.9e-6
# (urope), bfloat16 2.2e-2 (hrope-full), float16 3.1e-3 (hrope-full). GPU kernels (SDPA backends,
# reductions) round differently, so each keeps about 3x the CPU worst (a margin, not a GPU measurement);
# bfloat16 stays at 5e-2 (2.3x) rather than being loosened to 3x.
TOLERANCE = {torch.float32: 3e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def _moved(inputs: dict, device) -> dict:
    """``encoding_inputs`` (float64, CPU) in float32 on ``device``."""
    planes = inputs["planes"]
    if planes is not None:
        planes = hrope.Planes(planes.normal.float().to(device), planes.depth.float().to(device))
    return {"planes": planes, "params": {k: v.float().to(device) for k, v in inputs["params"].items()}}


def check(name: str, dtype: torch.dtype, device: torch.device, seed: int = 0, backend: str = "torch") -> dict:
    """Relative forward error against the reference and finiteness of every gradient."""
    grid, views, head_dim = (4, 6), 3, 64
    cameras = random_cameras(B=2, V=views, image_size=(32, 48), seed=seed)
    inputs = encoding_inputs(name, cameras, grid, seed=seed)
    qkv64 = random_qkv(2, 4, views * grid[0] * grid[1], head_dim, seed=seed)
    reference = hrope.reference.multiview_attention(*qkv64, encoding=name, cameras=cameras, grid=grid, **inputs)
    qkv = [x.to(device, dtype).requires_grad_() for x in qkv64]
    encoding = hrope.get_encoding(name)
    if not encoding.query_frame:  # they have one backend
        encoding.use_backend(backend)
    out = hrope.multiview_attention(
        *qkv,
        encoding=encoding,
        cameras=cameras.to(device=device, dtype=torch.float32),
        grid=grid,
        **_moved(inputs, device),
    )
    error = ((out.double().cpu() - reference).abs().max() / reference.abs().max()).item()
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(device)
    (out.float() * weight).sum().backward()  # unit-scale output gradient (no loss scaling needed)
    finite = all(bool(torch.isfinite(x.grad).all()) for x in qkv)
    return {
        "encoding": name,
        "backend": encoding.backend,
        "dtype": str(dtype).removeprefix("torch."),
        "relative_error": error,
        "tolerance": TOLERANCE[dtype],
        "gradients_finite": finite,
        "ok": finite and out.dtype == dtype and error <= TOLERANCE[dtype],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--encodings", nargs="*", default=None)
    parser.add_argument(
        "--transform-backend",
        choices=("torch", "triton", "auto"),
        default="torch",
        help="how the relative encodings apply their transforms (query-frame ones: always torch)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = [
        check(name, dtype, device, backend=args.transform_backend)
        for name in (args.encodings or list(hrope.ENCODINGS))
        for dtype in TOLERANCE
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.transform_backend == "torch" else f"_{args.transform_backend}"
    write_json(
        args.out / f"device_check_{device.type}{suffix}.json",
        {"device": name, "torch": torch.__version__, "provenance": provenance(), "checks": rows},
    )
    for row in rows:
        print(
            f"{'ok  ' if row['ok'] else 'FAIL'} {row['encoding']:<12} {row['backend']:<6} {row['dtype']:<9} "
            f"error {row['relative_error']:.1e} (tolerance {row['tolerance']:.0e}) "
            f"gradients {'finite' if row['gradients_finite'] else 'NOT finite'}"
        )
    failed = [f"{r['encoding']}/{r['dtype']}" for r in rows if not r["ok"]]
    print(
        f"{len(rows) - len(failed)} of {len(rows)} checks passed on {name}" + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
