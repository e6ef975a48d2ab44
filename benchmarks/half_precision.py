"""Half-precision attention at any scene scale: error against the float64 reference, and the cost
of each precision (docs/encodings.md, "Numerics in half precision").

    python benchmarks/half_precision.py            # about three minutes on 2 CPU cores
    python benchmarks/half_precision.py --device cuda --views 8 --grid 32   # the same on a GPU

Errors. For every registered encoding, bfloat16 and float16, and five scenes: random valid
geometry (``hrope.testing``) 1e-3, 1 and 1e3 scene units across (camera translations and every
length of the token inputs scaled together), and the scene of scale 1 with its token inputs at
the clamp policy's bounds (``cap``: ``hrope.testing.inputs_at_clamps``, planes 0.01 units from
their camera, depths at 100; ``cap2``: the same with planes at |m| = 2, the cap of the NVS
pipeline's geometry sources). B = 1, 2 heads, 2 views of 2x3 patches, head_dim 64, standard
normal q, k, v, eight seeds. An error is max |out - ref| / max |ref|, ref the float64 reference
(``hrope.reference.multiview_attention``) on the float64 inputs, out ``hrope.multiview_attention``
on q, k, v rounded to the dtype (cameras, planes and params in float32, on ``--device``); each is
divided by plain SDPA's error on the same q, k, v in the same dtype on the same device. Per case:

* ``auto``, ``float32``, ``input`` and ``attention32``: the error ratio under
  ``Encoding.use_precision("auto")`` (the default: transforms in float32, and SDPA too where they
  have geometric blocks), ``"float32"`` (transforms in float32, SDPA in the dtype), ``"input"``
  (all in the tensors' own dtype), and with the whole attention in float32 for every encoding
  (q, k, v upcast by the caller, the output rounded to the dtype).
* ``floor``: the reference evaluated on the rounded q, k, v, against ref: what rounding the
  inputs alone changes, however the attention is computed afterwards.
* ``matched``: the same errors with q and k scaled by one factor so that the encoded logits have
  the RMS of plain SDPA's on the unscaled q, k (what a trained model's attention sees): the
  numerics of the implementation, apart from how sharp the logits of a large scene are.
* ``finite``: every output of a path is finite; ``in_range``: the float64 output fits the dtype
  (where it does not, no finite answer exists).
* ``excess``: ``auto`` / max(1, floor): what the default adds beyond rounding the inputs.

Speed. ``hrope.multiview_attention`` in each half dtype under each of :data:`PRECISIONS`,
forward and forward+backward, at ``--views`` x ``--grid``^2 tokens (default N = 512, 4 heads,
head_dim 64) on ``--device`` (the CPU with ``--threads`` threads, default 1); ``--reps``
interleaved repetitions (the order rotates); ``ratio`` = the fastest ``auto`` call over the
fastest ``float32`` call, ``input_ratio`` = fastest ``float32`` over fastest ``input`` (best of the
repetitions, which other load on the machine cannot make faster; the JSON also has the median over
repetitions of the ratio within one). ``none`` runs the same code every way: its ratio is the
measurement's own noise. ``--parts speed`` times only (the GPU suite's step).
Writes benchmarks/results/half_precision{,_DEVICE}.{json,md} (DEVICE unless the CPU).
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


def in_float32(cameras: hrope.Cameras, inputs: dict, grid, device: str = "cpu") -> tuple[hrope.Cameras, dict]:
    """The cameras, planes (as m) and params in float32 on ``device``, as a half-precision model holds them."""
    planes = inputs["planes"]
    if planes is not None:
        planes = hrope.Planes.from_m(planes.m(cameras, grid).to(device, torch.float32))
    params = {key: value.to(device, torch.float32) for key, value in inputs["params"].items()}
    return cameras.to(device, torch.float32), {"planes": planes, "params": params}


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


# How a half-precision call is computed: each of PRECISIONS, or the whole attention in float32 (q,
# k, v upcast by the caller, the output rounded).
PATHS = (*PRECISIONS, "attention32")


def attend(path: str, name: str, xs: list[torch.Tensor], cameras: hrope.Cameras, inputs: dict) -> torch.Tensor:
    """``hrope.multiview_attention`` of half-precision ``xs`` along ``path`` (:data:`PATHS`), in xs' dtype."""
    encoding = hrope.get_encoding(name).use_precision("float32" if path == "attention32" else path)
    args = [x.float() for x in xs] if path == "attention32" else xs
    return hrope.multiview_attention(*args, encoding=encoding, cameras=cameras, grid=GRID, **inputs).to(xs[0].dtype)


def measure(name: str, which: str, seed: int, device: str = "cpu") -> list[dict]:
    """One row per half dtype: the errors of encoding ``name`` on scene ``which`` (module docstring)."""
    cameras, inputs = scene(name, which, seed)
    q, k, v = random_qkv(1, HEADS, VIEWS * GRID[0] * GRID[1], HEAD_DIM, seed=seed)
    kwargs = {"encoding": name, "cameras": cameras, "grid": GRID, **inputs}
    ref = hrope.reference.multiview_attention(q, k, v, **kwargs)
    prepared = hrope.get_encoding(name).prepare(cameras, GRID, HEAD_DIM, planes=inputs["planes"], **inputs["params"])
    factor = math.sqrt(logit_rms(None, q, k) / logit_rms(prepared, q, k))
    ref_matched = hrope.reference.multiview_attention(factor * q, factor * k, v, **kwargs)
    cameras32, inputs32 = in_float32(cameras, inputs, GRID, device)
    rows = []
    for dtype in DTYPES:
        rounded = [x.to(dtype) for x in (q, k, v)]
        on_device = [x.to(device) for x in rounded]
        sdpa = relative_error(F.scaled_dot_product_attention(*on_device).cpu(), F.scaled_dot_product_attention(q, k, v))
        floor = relative_error(hrope.reference.multiview_attention(*(x.double() for x in rounded), **kwargs), ref)
        row = {"encoding": name, "scene": which, "dtype": str(dtype).removeprefix("torch."), "seed": seed}
        largest = max(ref.abs().max().item(), ref_matched.abs().max().item())
        row.update(sdpa_error=sdpa, floor=floor / sdpa, logit_factor=factor, largest_output=largest)
        row["in_range"] = largest < torch.finfo(dtype).max  # else no finite output in dtype exists
        cases = (
            ("", on_device, ref),
            ("matched_", [x.to(device, dtype) for x in (factor * q, factor * k, v)], ref_matched),
        )
        for path in PATHS:
            outputs = []
            for key, xs, reference in cases:
                outputs.append(attend(path, name, xs, cameras32, inputs32).cpu())
                row[f"{key}{path}"] = relative_error(outputs[-1], reference) / sdpa
            row[f"finite_{path}"] = all(bool(torch.isfinite(out).all()) for out in outputs)
        row["excess"] = row["auto"] / max(1.0, row["floor"])  # beyond what rounding the inputs explains
        rows.append(row)
    return rows


def time_call(fn, backward: bool, device: str) -> float:
    """Seconds of one call of ``fn`` (with a backward pass if ``backward``), the device synchronised."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    if backward:
        fn().float().sum().backward()
    else:
        with torch.no_grad():
            fn()
    sync()
    return time.perf_counter() - start


def time_precisions(name: str, dtype: torch.dtype, args: argparse.Namespace) -> list[dict]:
    """Forward and forward+backward times of one encoding in one dtype under each of :data:`PRECISIONS`."""
    grid = (args.grid, args.grid)
    cameras, inputs = scene(name, "1", seed=0, grid=grid, views=args.views)
    cameras, inputs = in_float32(cameras, inputs, grid, args.device)
    qkv = random_qkv(1, args.heads, args.views * args.grid**2, args.head_dim, seed=0)
    rows = []
    for mode, backward in MODES:
        calls = {}
        for precision in PRECISIONS:
            encoding = hrope.get_encoding(name).use_precision(precision)
            xs = [x.to(args.device, dtype).requires_grad_(backward) for x in qkv]
            calls[precision] = lambda xs=xs, encoding=encoding: hrope.multiview_attention(
                *xs, encoding=encoding, cameras=cameras, grid=grid, **inputs
            )
        for call in calls.values():  # warm-up
            time_call(call, backward, args.device)
        times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for rep in range(args.reps):
            for precision in PRECISIONS[rep % 3 :] + PRECISIONS[: rep % 3]:
                times[precision].append(time_call(calls[precision], backward, args.device))
        ratios = [a / b for a, b in zip(times["auto"], times["float32"])]
        row = {"encoding": name, "dtype": str(dtype).removeprefix("torch."), "mode": mode}
        row.update({f"{p}_ms": 1e3 * min(times[p]) for p in PRECISIONS})
        row["ratio"] = min(times["auto"]) / min(times["float32"])
        row["median_ratio"] = statistics.median(ratios)
        row["ratio_range"] = [min(ratios), max(ratios)]
        row["input_ratio"] = min(times["float32"]) / min(times["input"])
        rows.append(row)
    return rows


def worst(rows: list[dict], key: str, where=lambda row: True) -> dict:
    """The row with the largest ``key`` among ``rows`` that satisfy ``where``: {value, encoding, scene, dtype}."""
    row = max((r for r in rows if where(r)), key=lambda r: r[key])
    return {"value": row[key], "encoding": row["encoding"], "scene": row["scene"], "dtype": row["dtype"]}


RAW = (*PATHS, "floor")
MATCHED = tuple(f"matched_{path}" for path in PATHS)
KEYS = (*RAW, "excess", *MATCHED)
PATH_LABELS = {"auto": "auto (default)", "float32": "float32", "input": "input", "attention32": "attention in float32"}
LABELS = {
    **PATH_LABELS,
    "floor": "floor",
    "excess": "auto / max(1, floor)",
    **{f"matched_{path}": f"logits matched, {label}" for path, label in PATH_LABELS.items()},
}
TARGET = 2.0  # the aim: within this factor of SDPA's own error


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
        lines += ["", f"## {n}, logits matched: " + " / ".join(PATH_LABELS.values()), ""]
        lines += error_table(cases, n, MATCHED)
    return lines


def verdicts(cases: list[dict]) -> list[dict]:
    """Per encoding and dtype, the worst over scenes and seeds (those whose float64 output fits the
    dtype) of ``auto``, ``floor``, ``excess`` and ``matched_auto``, and ``verdict``: "meets" (auto
    within :data:`TARGET` of SDPA's error everywhere), "floor" (beyond it only where the floor is,
    and within TARGET of max(1, floor) there), or "misses"."""
    out = []
    for name in dict.fromkeys(r["encoding"] for r in cases):
        for dtype in (str(d).removeprefix("torch.") for d in DTYPES):
            rows = [r for r in cases if r["encoding"] == name and r["dtype"] == dtype and r["in_range"]]
            worst_of = {key: max(r[key] for r in rows) for key in ("auto", "floor", "excess", "matched_auto")}
            above = [r for r in rows if r["auto"] > TARGET]
            verdict = "meets" if not above else "floor" if all(r["excess"] <= TARGET for r in above) else "misses"
            out.append({"encoding": name, "dtype": dtype, **worst_of, "verdict": verdict})
    return out


def verdict_section(record: dict) -> list[str]:
    """Markdown: per encoding and dtype, the default's worst ratio, the floor and the verdict."""
    words = {
        "meets": f"within {TARGET:g}x of SDPA's error",
        "floor": f"above {TARGET:g}x only within {TARGET:g}x of max(1, floor)",
        "misses": "misses",
    }
    lines = [
        f"## The default (`auto`) against the target ({TARGET:g}x SDPA's error), per encoding",
        "",
        "Worst over the scenes and seeds: auto; the floor; auto / max(1, floor); auto with the logits matched.",
        "",
        "| encoding | dtype | auto | floor | auto / max(1, floor) | matched | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in record["verdicts"]:
        numbers = " | ".join(f"{v[key]:.1f}" for key in ("auto", "floor", "excess", "matched_auto"))
        lines.append(f"| `{v['encoding']}` | {v['dtype']} | {numbers} | {words[v['verdict']]} |")
    return lines


def speed_section(record: dict) -> list[str]:
    """The table of time ratios auto / float32 and float32 / input."""
    names = [str(d).removeprefix("torch.") for d in DTYPES]
    speed = {(r["encoding"], r["dtype"], r["mode"]): r for r in record["speed"]}
    shape = record["speed_shape"]
    where = f"{record['threads']} thread(s)" if record["device"] == "cpu" else "synchronised"
    lines = [
        f"## Cost of the precisions ({record['device']})",
        "",
        f"time(auto) / time(float32), and in brackets time(float32) / time(input), of "
        f"`hrope.multiview_attention`, the fastest call of {shape['reps']} interleaved repetitions each "
        f"(`none` runs the same code every way: the noise); B = 1, {shape['heads']} heads, {shape['views']} "
        f"views x {shape['grid']}x{shape['grid']} patches, head_dim {shape['head_dim']}, scene of scale 1, {where}.",
        "",
        "| encoding | " + " | ".join(f"{n} {mode.replace('_', ' + ')}" for n in names for mode, _ in MODES) + " |",
        "|---|" + "---|" * (len(names) * len(MODES)),
    ]
    for name in dict.fromkeys(r["encoding"] for r in record["speed"]):
        rows = [speed[(name, n, mode)] for n in names for mode, _ in MODES]
        lines.append(f"| `{name}` | " + " | ".join(f"{r['ratio']:.2f} ({r['input_ratio']:.2f})" for r in rows) + " |")
    return lines


def markdown(record: dict) -> str:
    lines = [
        "# Half-precision attention at any scene scale",
        "",
        f"`python benchmarks/half_precision.py{record['arguments']}` at commit {describe(record['provenance'])}, "
        f"torch {record['provenance']['torch']}, on `{record['device']}`. What each number is: the docstring of "
        '`benchmarks/half_precision.py` and docs/encodings.md, "Numerics in half precision".',
    ]
    if record["cases"]:
        lines += ["", *verdict_section(record), "", *error_sections(record)]
    if record["speed"]:
        lines += ["", *speed_section(record)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encodings", nargs="*", default=None)
    parser.add_argument("--parts", nargs="*", choices=("errors", "speed"), default=["errors", "speed"])
    parser.add_argument("--device", default="cpu")
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
    cases = []
    if "errors" in args.parts:
        cases = [
            r for name in names for which in SCENES for seed in SEEDS for r in measure(name, which, seed, args.device)
        ]
    speed = []
    if "speed" in args.parts:
        speed = [row for name in names for dtype in DTYPES for row in time_precisions(name, dtype, args)]
    shape = {key: getattr(args, key) for key in ("views", "grid", "heads", "head_dim", "reps")}
    record = {
        "provenance": provenance(),
        "arguments": "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv)),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "shape": {"views": VIEWS, "grid": list(GRID), "heads": HEADS, "head_dim": HEAD_DIM, "seeds": list(SEEDS)},
        "speed_shape": shape,
        "summary": summary(cases) if cases else {},
        "verdicts": verdicts(cases),
        "cases": cases,
        "speed": speed,
    }
    stem = "half_precision" + ("" if args.device == "cpu" else f"_{args.device.replace(':', '')}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{stem}.json", record)
    write_text(args.out / f"{stem}.md", markdown(record))
    print(markdown(record))
    return 1 if cases and record["summary"]["not_finite_auto"] else 0


if __name__ == "__main__":
    sys.exit(main())
