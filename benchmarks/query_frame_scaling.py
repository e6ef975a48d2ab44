"""Query-frame encodings (rayrope, urope, worldrope): cost vs plain SDPA and prope as views grow.

Shape: B=1, 8 heads, head_dim 64, 32x32 patches per view, fp32 CPU, V views (N = V * 1024).
Repetitions are interleaved over the methods; each repetition gives the ratios
time(method) / time(sdpa) and time(method) / time(prope), and the tables report their medians.
"forward" runs under ``no_grad``; "fwd+bwd" backpropagates a sum through q, k, v and the per-token
params. Every timing includes ``prepare`` (the coefficient build), as in a model whose per-token
params change every layer. "saved" is the size of the tensors autograd keeps for backward.

    python benchmarks/query_frame_scaling.py                  # views 2 4 8 (about 3 min, 2 cores)
    python benchmarks/query_frame_scaling.py --views 2 --reps 9 --variants   # + fold, recompute
    python benchmarks/query_frame_scaling.py --threads 1   # CPU-time ratios robust to a busy machine

Writes benchmarks/results/query_frame_scaling.{json,md}.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hrope.nvs.running.atomic import write_json, write_text
import hrope
from hrope.nvs.running.provenance import describe, provenance

GRID = (32, 32)
HEADS, HEAD_DIM = 8, 64
ENCODINGS = ("prope", "rayrope", "urope", "worldrope")
RESULTS = Path(__file__).parent / "results"


def make_cameras(views: int, gen: torch.Generator) -> hrope.Cameras:
    """Cameras on a circle of radius 3 looking at the origin, jittered intrinsics (256x256 images)."""
    angle = torch.arange(views, dtype=torch.float64) * 0.4
    centre = torch.stack(
        [3 * angle.sin(), 0.2 * torch.randn(views, generator=gen, dtype=torch.float64), -3 * angle.cos()], -1
    )
    forward = -centre / centre.norm(dim=-1, keepdim=True)
    right = torch.nn.functional.normalize(
        torch.cross(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64).expand(views, 3), forward, dim=-1), dim=-1
    )
    down = torch.cross(forward, right, dim=-1)
    R = torch.stack([right, down, forward], -2)
    E = torch.eye(4, dtype=torch.float64).repeat(views, 1, 1)
    E[:, :3, :3], E[:, :3, 3] = R, -(R @ centre[..., None]).squeeze(-1)
    K = torch.eye(3, dtype=torch.float64).repeat(views, 1, 1)
    K[:, 0, 0] = K[:, 1, 1] = 256 * (0.9 + 0.2 * torch.rand(views, generator=gen, dtype=torch.float64))
    K[:, 0, 2] = K[:, 1, 2] = 128.0
    return hrope.Cameras(K[None].float(), E[None].float(), (256, 256))


def make_params(name: str, N: int, gen: torch.Generator) -> dict:
    rand = lambda *shape: torch.rand(*shape, generator=gen)  # noqa: E731
    if name == "rayrope":
        return {"log_depth": 0.5 + rand(1, N), "log_depth_halfwidth": 0.5 * rand(1, N)}
    if name == "worldrope":
        return {"depth": 2 + 3 * rand(1, N), "depth_split": rand(1, N), "depth_sigma": 0.3 * rand(1, N, 2)}
    return {}


VARIANTS = {"": {}, "/fold": {"execution": "fold"}, "/recompute": {"recompute": True}}


def make_methods(views: int, variants: bool, gen: torch.Generator) -> dict:
    """name -> (function(q, k, v, params), params) for every method timed at this view count."""
    cameras = make_cameras(views, gen)
    N = views * GRID[0] * GRID[1]
    methods = {"sdpa": (lambda q, k, v, p: F.scaled_dot_product_attention(q, k, v), {})}
    for name in ENCODINGS:
        suffixes = VARIANTS if variants and name != "prope" else {"": {}}
        for suffix, options in suffixes.items():
            encoding = hrope.get_encoding(name, **options)
            label = name + suffix

            def run(q, k, v, p, encoding=encoding):
                return hrope.multiview_attention(q, k, v, encoding=encoding, cameras=cameras, grid=GRID, params=p)

            methods[label] = (run, make_params(name, N, gen))
    return methods


class Clock:
    """Wall-clock and process CPU seconds of a block (CPU time is robust to other processes sharing
    the cores when torch runs one thread; with several threads it also counts their spin-waits)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def time_forward(fn, qkv, params) -> Clock:
    with torch.no_grad(), Clock() as clock:
        fn(*qkv, params)
    return clock


def time_forward_backward(fn, qkv, params) -> tuple[Clock, int]:
    """Timing of forward + backward, and bytes of the distinct tensors saved for backward."""
    leaves = [x.detach().requires_grad_() for x in qkv]
    p = {name: value.detach().requires_grad_() for name, value in params.items()}
    saved: dict[tuple, int] = {}

    def pack(t):
        saved[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    with Clock() as clock:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(*leaves, p)
        out.sum().backward()
    return clock, sum(saved.values())


def bench_views(views: int, reps: int, variants: bool, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    N = views * GRID[0] * GRID[1]
    qkv = [torch.randn(1, HEADS, N, HEAD_DIM, generator=gen) for _ in range(3)]
    methods = make_methods(views, variants, gen)
    times = {name: {"fwd": [], "fb": []} for name in methods}
    saved = {}
    for _ in range(reps):
        for name, (fn, params) in methods.items():
            times[name]["fwd"].append(time_forward(fn, qkv, params))
            clock, saved[name] = time_forward_backward(fn, qkv, params)
            times[name]["fb"].append(clock)
    rows = []
    for name in methods:
        row = {
            "views": views,
            "tokens": N,
            "method": name,
            "reps": reps,
            "saved_mb": saved[name] / 2**20,
            "saved_ratio_sdpa": saved[name] / saved["sdpa"],
        }
        for kind in ("fwd", "fb"):
            for clock in ("wall", "cpu"):
                mine = [getattr(c, clock) for c in times[name][kind]]
                prefix = kind if clock == "wall" else f"{kind}_cpu"
                row[f"{prefix}_ms"] = 1e3 * statistics.median(mine)
                for ref in ("sdpa", "prope"):
                    theirs = [getattr(c, clock) for c in times[ref][kind]]
                    row[f"{prefix}_ratio_{ref}"] = statistics.median(a / b for a, b in zip(mine, theirs))
        rows.append(row)
        print(
            f"V={views} {name:16s} fwd {row['fwd_ratio_sdpa']:.2f}x sdpa ({row['fwd_ms']:.0f} ms, cpu "
            f"{row['fwd_cpu_ratio_sdpa']:.2f}x)  fwd+bwd {row['fb_ratio_sdpa']:.2f}x ({row['fb_ms']:.0f} ms, cpu "
            f"{row['fb_cpu_ratio_sdpa']:.2f}x)  saved {row['saved_mb']:.0f} MB",
            flush=True,
        )
    return rows


def warm_up(variants: bool, seed: int) -> None:
    """One untimed forward and forward+backward of every method at a small size."""
    gen = torch.Generator().manual_seed(seed)
    N = 2 * GRID[0] * GRID[1]
    qkv = [torch.randn(1, HEADS, N, HEAD_DIM, generator=gen) for _ in range(3)]
    for fn, params in make_methods(2, variants, gen).values():
        time_forward(fn, qkv, params)
        time_forward_backward(fn, qkv, params)


def markdown(report: dict) -> str:
    lines = [
        "# Query-frame encodings: cost vs plain SDPA and prope",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{describe(report.get('provenance'))}`",
        "",
        f"B=1, {HEADS} heads, head_dim {HEAD_DIM}, {GRID[0]}x{GRID[1]} patches per view, fp32 CPU, "
        f"torch {report['torch']}, {report['threads']} threads, load average at start "
        f"{report['load_average_at_start']}, at end {report['load_average_at_end']}. Median over "
        "interleaved repetitions of per-repetition ratios; times include `prepare`. "
        "'saved' = tensors kept for backward.",
    ]
    for title, prefix in (("Wall clock", ""), ("Process CPU time", "_cpu")):
        lines += [
            "",
            f"## {title}",
            "",
            "| views | N | method | reps | fwd / sdpa | fwd / prope | fwd+bwd / sdpa | fwd+bwd / prope "
            "| fwd ms | fwd+bwd ms | saved MB | saved / sdpa |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["results"]:
            f, b = f"fwd{prefix}", f"fb{prefix}"
            lines.append(
                f"| {r['views']} | {r['tokens']} | {r['method']} | {r['reps']} | {r[f + '_ratio_sdpa']:.2f} | "
                f"{r[f + '_ratio_prope']:.2f} | {r[b + '_ratio_sdpa']:.2f} | {r[b + '_ratio_prope']:.2f} | "
                f"{r[f + '_ms']:.0f} | {r[b + '_ms']:.0f} | {r['saved_mb']:.0f} | {r['saved_ratio_sdpa']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument(
        "--reps", type=int, default=5, help="repetitions at 2 views; V views use max(2, ceil(reps * 2 / V))"
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also time execution='fold' and recompute=True of each query-frame encoding",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "query_frame_scaling")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {
        "command": " ".join(["python", "benchmarks/query_frame_scaling.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "provenance": provenance(),
        "threads": torch.get_num_threads(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "results": [],
    }
    warm_up(args.variants, args.seed)
    for views in args.views:
        reps = max(2, math.ceil(args.reps * 2 / views))
        report["results"] += bench_views(views, reps, args.variants, args.seed)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out.with_suffix(".json"), report, newline=True)
    write_text(args.out.with_suffix(".md"), markdown(report))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
