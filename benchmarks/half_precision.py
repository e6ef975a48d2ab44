"""Half-precision attention at any scene scale: error against the float64 reference, and the cost
of computing the transforms in float32 (docs/encodings.md, "Numerics in half precision").

    python benchmarks/half_precision.py            # about two minutes on 2 CPU cores

Errors. For every registered encoding, bfloat16 and float16, and five scenes: random valid
geometry (``hrope.testing``) 1e-3, 1 and 1e3 scene units across (camera translations and every
length of the token inputs scaled together), and the scene of scale 1 with its token inputs at
the clamp policy's bounds (``cap``: ``hrope.testing.inputs_at_clamps``, planes 0.01 units from
their camera, depths at 100; ``cap2``: the same with planes at |m| = 2, the cap of the NVS
pipeline's geometry sources). B = 1, 2 heads, 2 views of 2x3 patches, head_dim 64, standard
normal q, k, v, eight seeds. An error is max |out - ref| / max |ref|, ref the float64 reference
(``hrope.reference.multiview_attention``) on the float64 inputs, out ``hrope.multiview_attention``
on q, k, v rounded to the dtype (cameras, planes and params in float32); each is divided by plain
SDPA's error on the same q, k, v in the same dtype. Per case:

* ``float32``, ``input`` and ``attention32``: the error ratio with the transforms computed in
  float32 (the default), in the tensors' own dtype (``Encoding.use_precision("input")``), and with
  the whole attention in float32 (q, k, v upcast by the caller, the output rounded to the dtype).
* ``floor``: the reference evaluated on the rounded q, k, v, against ref: what rounding the
  inputs alone changes, however the attention is computed afterwards.
* ``matched``: the same errors with q and k scaled by one factor so that the encoded logits have
  the RMS of plain SDPA's on the unscaled q, k (what a trained model's attention sees): the
  numerics of the implementation, apart from how sharp the logits of a large scene are.
* ``finite``: every output of a path is finite; ``in_range``: the float64 output fits the dtype
  (where it does not, no finite answer exists).

Speed. ``hrope.multiview_attention`` in each half dtype with ``use_precision("float32")`` against
``use_precision("input")``, forward and forward+backward, at ``--views`` x ``--grid``^2 tokens
(default N = 512, 4 heads, head_dim 64) on the CPU with ``--threads`` threads (default 1);
``--reps`` interleaved repetitions (the order alternates); ratio = the fastest float32 call over
the fastest input call (best of the repetitions, which other load on the machine cannot make
faster; the JSON also has the median over repetitions of the ratio within one). ``none`` runs the
same code either way: its ratio is the measurement's own noise.
Writes benchmarks/results/half_precision.{json,md}.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hrope.nvs.running.atomic import write_json, write_text
import hrope
import hrope.reference
from hrope.encodings import PRECISIONS
from hrope.planes import MAX_INVERSE_DISTANCE
from hrope.testing import encoding_inputs, inputs_at_clamps, random_cameras, random_qkv
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = (torch.bfloat16, torch.float16)
# scene units across, and |m| of the planes for the scenes with the token inputs at the clamps
SCENES = {
    "1e-3": (1e-3, None),
    "1": (1.0, None),
    "1e3": (1e3, None),
    "cap": (1.0, MAX_INVERSE_DISTANCE),
    "cap2": (1.0, 2.0),
}
SEEDS = tuple(range(8))
GRID, VIEWS, HEADS, HEAD_DIM = (2, 3), 2, 2, 64
MODES = (("forward", False), ("forward_backward", True))


def scene(name: str, which: str, seed: int, grid=GRID, views: int = VIEWS) -> tuple[hrope.Cameras, dict]:
    """Float64 cameras ``(1, views)`` and the ``planes`` / ``params`` of encoding ``name`` for scene ``which``."""
    scale, bound = SCENES[which]
    cameras = random_cameras(B=1, V=views, image_size=(8 * grid[0], 8 * grid[1]), seed=seed, scale=scale)
    if bound is not None:
        return cameras, inputs_at_clamps(name, cameras, grid, seed, max_inverse_distance=bound)
    return cameras, encoding_inputs(name, cameras, grid, seed, scale=scale)


def in_float32(cameras: hrope.Cameras, inputs: dict, grid) -> tuple[hrope.Cameras, dict]:
    """The cameras, planes (as m) and params in float32, as a half-precision model holds them."""
    planes = inputs["planes"]
    if planes is not None:
        planes = hrope.Planes.from_m(planes.m(cameras, grid).float())
    params = {key: value.float() for key, value in inputs["params"].items()}
    return cameras.to(dtype=torch.float32), {"planes": planes, "params": params}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|; inf if out holds an inf or a NaN."""
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def logit_rms(prepared: hrope.Prepared | None, q: torch.Tensor, k: torch.Tensor) -> float:
    """RMS of the logits ``q_i^T D_i D_j^-1 k_j / sqrt(d)`` of a prepared transform (None: plain SDPA)."""
    if prepared is None:
        logits = q @ k.mT
    elif not prepared.query_frame:
        logits = prepared.apply_q(q) @ prepared.apply_k(k).mT
    else:  # keys re-encoded per query view
        P = prepared.num_tokens // prepared.num_views
        views = range(prepared.num_views)
        rows = [prepared.apply_q(q[:, :, c * P : (c + 1) * P], c) @ prepared.apply_kv(k, k, c)[0].mT for c in views]
        logits = torch.cat(rows, 2)
    return (logits / math.sqrt(q.shape[-1])).square().mean().sqrt().item()


# How a half-precision call is computed: the transforms in float32 (the default), in the tensors'
# dtype, or the whole attention in float32 (q, k, v upcast by the caller, the output rounded).
PATHS = ("float32", "input", "attention32")


def attend(path: str, name: str, xs: list[torch.Tensor], cameras: hrope.Cameras, inputs: dict) -> torch.Tensor:
    """``hrope.multiview_attention`` of half-precision ``xs`` along ``path`` (:data:`PATHS`), in xs' dtype."""
    encoding = hrope.get_encoding(name).use_precision("input" if path == "input" else "float32")
    args = [x.float() for x in xs] if path == "attention32" else xs
    return hrope.multiview_attention(*args, encoding=encoding, cameras=cameras, grid=GRID, **inputs).to(xs[0].dtype)


def measure(name: str, which: str, seed: int) -> list[dict]:
    """One row per half dtype: the errors of encoding ``name`` on scene ``which`` (module docstring)."""
    cameras, inputs = scene(name, which, seed)
    q, k, v = random_qkv(1, HEADS, VIEWS * GRID[0] * GRID[1], HEAD_DIM, seed=seed)
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID, **inputs}
    ref = hrope.reference.multiview_attention(q, k, v, **kwargs)
    prepared = hrope.get_encoding(name).prepare(cameras, GRID, HEAD_DIM, planes=inputs["planes"], **inputs["params"])
    factor = math.sqrt(logit_rms(None, q, k) / logit_rms(prepared, q, k))
    ref_matched = hrope.reference.multiview_attention(factor * q, factor * k, v, **kwargs)
    cameras32, inputs32 = in_float32(cameras, inputs, GRID)
    rows = []
    for dtype in DTYPES:
        rounded = [x.to(dtype) for x in (q, k, v)]
        sdpa = relative_error(F.scaled_dot_product_attention(*rounded), F.scaled_dot_product_attention(q, k, v))
        floor = relative_error(hrope.reference.multiview_attention(*(x.double() for x in rounded), **kwargs), ref)
        row = {"encoding": name, "scene": which, "dtype": str(dtype).removeprefix("torch."), "seed": seed}
        largest = max(ref.abs().max().item(), ref_matched.abs().max().item())
        row.update(sdpa_error=sdpa, floor=floor / sdpa, logit_factor=factor, largest_output=largest)
        row["in_range"] = largest < torch.finfo(dtype).max  # else no finite output in dtype exists
        cases = (
            ("", rounded, ref),
            ("matched_", [(factor * q).to(dtype), (factor * k).to(dtype), v.to(dtype)], ref_matched),
        )
        for path in PATHS:
            outputs = []
            for key, xs, reference in cases:
                outputs.append(attend(path, name, xs, cameras32, inputs32))
                row[f"{key}{path}"] = relative_error(outputs[-1], reference) / sdpa
            row[f"finite_{path}"] = all(bool(torch.isfinite(out).all()) for out in outputs)
        row["excess"] = row["float32"] / max(1.0, row["floor"])  # beyond what rounding the inputs explains
        rows.append(row)
    return rows


def time_call(fn, backward: bool) -> float:
    start = time.perf_counter()
    if backward:
        fn().float().sum().backward()
    else:
        with torch.no_grad():
            fn()
    return time.perf_counter() - start


def time_precisions(name: str, dtype: torch.dtype, args: argparse.Namespace) -> list[dict]:
    """Forward and forward+backward time ratios float32 / input of one encoding in one dtype."""
    grid = (args.grid, args.grid)
    cameras, inputs = scene(name, "1", seed=0, grid=grid, views=args.views)
    cameras, inputs = in_float32(cameras, inputs, grid)
    qkv = random_qkv(1, args.heads, args.views * args.grid**2, args.head_dim, seed=0)
    rows = []
    for mode, backward in MODES:
        calls = {}
        for precision in PRECISIONS:
            encoding = hrope.get_encoding(name).use_precision(precision)
            xs = [x.to(dtype).requires_grad_(backward) for x in qkv]
            calls[precision] = lambda xs=xs, encoding=encoding: hrope.multiview_attention(
                *xs, encoding=encoding, cameras=cameras, grid=grid, **inputs
            )
        for call in calls.values():  # warm-up
            time_call(call, backward)
        times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for rep in range(args.reps):
            for precision in PRECISIONS[:: 1 if rep % 2 == 0 else -1]:
                times[precision].append(time_call(calls[precision], backward))
        ratios = [a / b for a, b in zip(times["float32"], times["input"])]
        rows.append(
            {
                "encoding": name,
                "dtype": str(dtype).removeprefix("torch."),
                "mode": mode,
                "input_ms": 1e3 * min(times["input"]),
                "float32_ms": 1e3 * min(times["float32"]),
                "ratio": min(times["float32"]) / min(times["input"]),
                "median_ratio": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
        )
    return rows


def worst(rows: list[dict], key: str, where=lambda row: True) -> dict:
    """The row with the largest ``key`` among ``rows`` that satisfy ``where``: {value, encoding, scene, dtype}."""
    row = max((r for r in rows if where(r)), key=lambda r: r[key])
    return {"value": row[key], "encoding": row["encoding"], "scene": row["scene"], "dtype": row["dtype"]}


RAW = ("float32", "input", "attention32", "floor")
MATCHED = ("matched_float32", "matched_input", "matched_attention32")
KEYS = (*RAW, "excess", *MATCHED)
LABELS = {
    "float32": "float32 path (default)",
    "input": "input path",
    "attention32": "attention in float32",
    "floor": "floor",
    "excess": "float32 path / max(1, floor)",
    **{
        f"matched_{path}": f"logits matched, {label}"
        for path, label in (
            ("float32", "float32 path"),
            ("input", "input path"),
            ("attention32", "attention in float32"),
        )
    },
}


def summary(cases: list[dict]) -> dict:
    """Worst factors over every encoding, scene and seed, per dtype; per path, the cases with an
    output that was not finite where the float64 output fits the dtype; and the cases where it does not."""

    def listed(rows) -> list[str]:
        return sorted({f"{r['encoding']}/{r['dtype']}/{r['scene']}" for r in rows})

    out: dict = {
        f"not_finite_{path}": listed(r for r in cases if r["in_range"] and not r[f"finite_{path}"]) for path in PATHS
    }
    out["out_of_range"] = listed(r for r in cases if not r["in_range"])
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        rows = [r for r in cases if r["dtype"] == name and r["in_range"]]
        out[name] = {"sdpa_error": max(r["sdpa_error"] for r in rows), **{key: worst(rows, key) for key in KEYS}}
    return out


def worst_over_seeds(cases: list[dict], dtype: str, key: str) -> dict[tuple[str, str], float]:
    """``{(encoding, scene): the largest key over the seeds}`` for one dtype (the seeds whose float64
    output fits the dtype)."""
    cells: dict[tuple[str, str], float] = {}
    for r in cases:
        if r["dtype"] == dtype and r["in_range"]:
            cell = (r["encoding"], r["scene"])
            cells[cell] = max(cells.get(cell, 0.0), r[key])
    return cells


def error_table(cases: list[dict], dtype: str, keys: tuple[str, ...]) -> list[str]:
    """Markdown rows: encoding x scene, each cell the worst of ``keys`` joined by " / "."""
    cells = {key: worst_over_seeds(cases, dtype, key) for key in keys}
    lines = ["| encoding | " + " | ".join(SCENES) + " |", "|---|" + "---|" * len(SCENES)]
    for name in dict.fromkeys(r["encoding"] for r in cases):
        values = [
            " / ".join(f"{cells[key][(name, which)]:.1f}" for key in keys) if (name, which) in cells[keys[0]] else "—"
            for which in SCENES
        ]
        lines.append(f"| `{name}` | " + " | ".join(values) + " |")
    return lines


def error_sections(record: dict) -> list[str]:
    """The summary and the per-dtype tables of the error measurement."""
    cases, result = record["cases"], record["summary"]
    names = [str(d).removeprefix("torch.") for d in DTYPES]
    lines = [
        "Every number is an error (max |out − ref| / max |ref| against the float64 reference) divided by plain "
        f"SDPA's error on the same q, k, v in the same dtype, the worst of seeds {', '.join(map(str, SEEDS))} "
        "(of those whose float64 output fits the dtype; — where none does). "
        "SDPA's own error: " + ", ".join(f"{n} {result[n]['sdpa_error']:.1e}" for n in names) + ".",
        "",
        "Not finite (inf or NaN) where the float64 output fits the dtype: "
        + "; ".join(f"{LABELS[path]}: {', '.join(result[f'not_finite_{path}']) or 'none'}" for path in PATHS)
        + ". The float64 output itself exceeds the dtype's largest number (no finite answer exists): "
        + (", ".join(result["out_of_range"]) or "none")
        + ".",
        "",
        "| dtype | " + " | ".join(LABELS[key] for key in KEYS) + " |",
        "|---|" + "---|" * len(KEYS),
    ]
    for n in names:
        cells = [f"{w['value']:.1f} (`{w['encoding']}`, {w['scene']})" for w in (result[n][k] for k in KEYS)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    for n in names:
        lines += ["", f"## {n}: " + " / ".join(LABELS[key] for key in RAW), "", *error_table(cases, n, RAW)]
        lines += ["", f"## {n}, logits matched: float32 path / input path / attention in float32", ""]
        lines += error_table(cases, n, MATCHED)
    return lines


def speed_section(record: dict) -> list[str]:
    """The table of time ratios float32 path / input path."""
    names = [str(d).removeprefix("torch.") for d in DTYPES]
    speed = {(r["encoding"], r["dtype"], r["mode"]): r["ratio"] for r in record["speed"]}
    shape = record["speed_shape"]
    lines = [
        "## Cost of the float32 path (CPU)",
        "",
        f"time(float32 path) / time(input path) of `hrope.multiview_attention`, the fastest call of "
        f"{shape['reps']} interleaved repetitions each (`none` runs the same code either way: the noise); "
        f"B = 1, {shape['heads']} heads, {shape['views']} views x {shape['grid']}x{shape['grid']} patches, "
        f"head_dim {shape['head_dim']}, scene of scale 1, {record['threads']} thread(s).",
        "",
        "| encoding | " + " | ".join(f"{n} {mode.replace('_', ' + ')}" for n in names for mode, _ in MODES) + " |",
        "|---|" + "---|" * (len(names) * len(MODES)),
    ]
    for name in dict.fromkeys(r["encoding"] for r in record["speed"]):
        values = [f"{speed[(name, n, mode)]:.2f}" for n in names for mode, _ in MODES]
        lines.append(f"| `{name}` | " + " | ".join(values) + " |")
    return lines


def markdown(record: dict) -> str:
    lines = [
        "# Half-precision attention at any scene scale",
        "",
        f"`python benchmarks/half_precision.py` at commit {describe(record['provenance'])}, torch "
        f"{record['provenance']['torch']}, on the CPU. What each number is: the docstring of "
        '`benchmarks/half_precision.py` and docs/encodings.md, "Numerics in half precision".',
        "",
        *error_sections(record),
        "",
        *speed_section(record),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encodings", nargs="*", default=None)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--grid", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.encodings or list(hrope.ENCODINGS)
    cases = [row for name in names for which in SCENES for seed in SEEDS for row in measure(name, which, seed)]
    speed = [row for name in names for dtype in DTYPES for row in time_precisions(name, dtype, args)]
    shape = {key: getattr(args, key) for key in ("views", "grid", "heads", "head_dim", "reps")}
    record = {
        "provenance": provenance(),
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "shape": {"views": VIEWS, "grid": list(GRID), "heads": HEADS, "head_dim": HEAD_DIM, "seeds": list(SEEDS)},
        "speed_shape": shape,
        "summary": summary(cases),
        "cases": cases,
        "speed": speed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "half_precision.json", record)
    write_text(args.out / "half_precision.md", markdown(record))
    print(markdown(record))
    return 1 if record["summary"]["not_finite_float32"] else 0


if __name__ == "__main__":
    sys.exit(main())
