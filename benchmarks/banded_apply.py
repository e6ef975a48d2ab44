"""The block-diagonal transform alone (y = D x, applied to q, k, v and o around SDPA), per backend.

    python benchmarks/banded_apply.py --device cuda          # bfloat16, N = 8192 tokens
    python benchmarks/banded_apply.py --quick --device cpu   # tiny shapes, a check of the script

Backends, on the same x and tables: ``copy`` (``x.clone()``, the memory-bandwidth ceiling of a
pass that reads x and writes y), ``banded`` (hrope.encodings.banded's passes with the operator
built once, the default ``torch`` backend), ``compiled`` (``torch.compile`` of those passes;
skipped with ``--quick``) and ``fused`` (the Triton kernel of hrope.encodings.fused_triton;
on a CPU only when ``TRITON_INTERPRET=1`` is set, and then it times the interpreter, not a
kernel). Layouts: the transform of each relative encoding family, per-view 4x4 blocks with RoPE
(``prope``, ``gta``), per-view blocks without RoPE (``cape``), RoPE only (``rope2d``), per-token
4x4 (``hrope-lift``) and 3x3 (``hrope``) blocks with RoPE. Forward, and forward+backward with the
block gradient. Times are the median of ``--reps`` synchronised calls; ratios are to ``banded`` in
the same layout and mode. ``max error``: each backend's forward output against the banded passes in
float64 on the same inputs (x, blocks and tables upcast), as max |y - y64| / max |y64|.
Writes ``banded_apply[_<device>].{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from hrope.nvs.running.atomic import write_json, write_text
from hrope.encodings import fused_triton
from hrope.encodings.banded import banded_operator, banded_product
from hrope.encodings.layout import HeadLayout, rope_tables
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"
# layout name -> (block size, per token, RoPE)
LAYOUTS = {
    "prope": (4, False, True),
    "cape": (4, False, False),
    "rope2d": (0, False, True),
    "hrope-lift": (4, True, True),
    "hrope": (3, True, True),
}


def operands(layout_name: str, B: int, V: int, grid, head_dim: int, dtype, device, generator):
    """HeadLayout, blocks ``(B, V, 1 or P, b, b)`` near the identity (or None) and RoPE tables."""
    block, per_token, rope = LAYOUTS[layout_name]
    layout = HeadLayout(head_dim, block=block, rope=rope)
    P = grid[0] * grid[1]
    blocks = None
    if block:
        noise = torch.randn(B, V, P if per_token else 1, block, block, generator=generator)
        blocks = (torch.eye(block) + 0.1 * noise).to(device, dtype)
    tables = None
    if rope:
        tables = tuple(
            t.to(device, dtype) for t in rope_tables(tuple(grid), layout.num_freqs, 100.0, torch.device(device))
        )
    return layout, blocks, tables


def functions(layout, blocks, tables, quick: bool) -> dict:
    """``{backend: f(x, blocks) -> y}`` of the backends that run here."""
    with torch.no_grad():
        operator = banded_operator(blocks, layout.num_blocks, tables, layout.head_dim)
    listed = {
        "copy": lambda x, m: x.clone(),
        "banded": lambda x, m: banded_product(x, m, layout.num_blocks, tables, operator),
    }
    if not quick:
        listed["compiled"] = torch.compile(lambda x, m: banded_product(x, m, layout.num_blocks, tables))
    if fused_triton.is_available():
        listed["fused"] = lambda x, m: fused_triton.fused_banded_product(x, m, layout.num_blocks, tables)
    return listed


def max_errors(listed: dict, x, blocks, layout, tables) -> dict[str, float]:
    """``{backend: max |f(x) - y64| / max |y64|}`` with y64 = D x by the banded passes in float64
    on the same (upcast) inputs; not for ``copy``."""
    up = None if blocks is None else blocks.double()
    with torch.no_grad():
        y64 = banded_product(
            x.double(), up, layout.num_blocks, None if tables is None else [t.double() for t in tables]
        )
        return {
            backend: ((fn(x, blocks).double() - y64).abs().max() / y64.abs().max()).item()
            for backend, fn in listed.items()
            if backend != "copy"
        }


def timed(fn, x, blocks, backward: bool, device) -> float:
    """Seconds of one synchronised call (forward, or forward + backward with a unit gradient)."""
    xx = x.detach().requires_grad_(backward)
    mm = None if blocks is None else blocks.detach().requires_grad_(backward)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if backward:
        y = fn(xx, mm)
        y.backward(torch.ones_like(y))
    else:
        with torch.no_grad():
            fn(xx, mm)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--views", type=int, default=8)
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 repetitions, no torch.compile")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.views, args.grid, args.heads, args.head_dim, args.reps = 2, 2, 2, 16, 3
    return args


def measure(args: argparse.Namespace, device: torch.device, dtype) -> list[dict]:
    """One row per (layout, mode, backend): the median milliseconds and the ratio to ``banded``."""
    grid = (args.grid, args.grid)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for name in LAYOUTS:
        layout, blocks, tables = operands(name, 1, args.views, grid, args.head_dim, dtype, device, generator)
        x = torch.randn(1, args.heads, args.views, grid[0] * grid[1], args.head_dim, generator=generator).to(
            device, dtype
        )
        listed = functions(layout, blocks, tables, args.quick)
        errors = max_errors(listed, x, blocks, layout, tables)
        for mode, backward in (("forward", False), ("forward_backward", True)):
            for fn in listed.values():  # warm-up (and compilation)
                timed(fn, x, blocks, backward, device)
            seconds = {
                b: statistics.median(timed(fn, x, blocks, backward, device) for _ in range(args.reps))
                for b, fn in listed.items()
            }
            for backend, value in seconds.items():
                rows.append(
                    {
                        "layout": name,
                        "mode": mode,
                        "backend": backend,
                        "ms": 1e3 * value,
                        "ratio_to_banded": value / seconds["banded"],
                        "max_error": errors.get(backend),
                    }
                )
    return rows


def write_outputs(meta: dict, rows: list[dict], out: Path, stem: str) -> None:
    """``<stem>.json`` and ``<stem>.md`` (one line per layout and mode, one column per backend) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", {"meta": meta, "rows": rows})
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    lines = [
        f"y = D x alone, {meta['shape']}, {meta['dtype']} on {meta['device']}, median of {meta['reps']} "
        f"synchronised calls; time / banded in the same layout and mode. Commit `{describe(meta['provenance'])}`.",
        "",
        "| layout | mode | " + " | ".join(f"{b} ms (/ banded)" for b in backends) + " |",
        "|---|---|" + "---|" * len(backends),
    ]
    for name in LAYOUTS:
        for mode in ("forward", "forward_backward"):
            cells = {
                r["backend"]: f"{r['ms']:.3f} ({r['ratio_to_banded']:.2f})"
                + ("" if r.get("max_error") is None or mode != "forward" else f", max error {r['max_error']:.1e}")
                for r in rows
                if r["layout"] == name and r["mode"] == mode
            }
            lines.append(f"| {name} | {mode} | " + " | ".join(cells.get(b, "n/a") for b in backends) + " |")
    write_text(out / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = measure(args, device, dtype)
    meta = {
        "command": "python benchmarks/banded_apply.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype,
        "shape": f"B=1, {args.heads} heads, {args.views} views x {args.grid}x{args.grid} patches, "
        f"head_dim {args.head_dim}",
        "reps": args.reps,
        "torch": torch.__version__,
        "provenance": provenance(),
    }
    write_outputs(meta, rows, args.out, "banded_apply" + ("" if device.type == "cpu" else f"_{device.type}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
