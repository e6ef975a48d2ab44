"""Every GPU measurement the project needs, in one command of at most ten minutes (``make bench-gpu``).

    python benchmarks/gpu_suite.py                 # on a CUDA machine: writes benchmarks/results/gpu/
    python benchmarks/gpu_suite.py --quick --device cpu --out /tmp/x   # the same steps on tiny shapes

Steps, each a subprocess with its own time limit (a step that fails or runs out of time is
recorded and the others still run; the whole run stays inside ``--budget-s``):

1. ``device_check``: every encoding x float32/bfloat16/float16 on the device against the float64
   reference, with a backward pass; again with the relative encodings' transforms applied by the
   fused Triton kernel (``device_check_fused``).
2. ``overhead_n{2048,8192,32768}``: forward and forward+backward time of the relative encodings
   and the official PRoPE algorithm (``prope-einsum``) over plain SDPA, bfloat16, SDPA restricted
   to the flash backend (the baseline and the encodings alike), B = 1, 8 heads, head_dim 64,
   V x 32x32 patches with V = 2, 8, 32; per call (preparation included) and, at N >= 8k, with
   the transform prepared once (the per-layer cost).
   The same at N >= 8k with the transforms applied by the fused Triton kernel
   (``--transform-backend triton``, tag ``_fused``).
3. ``folded_n{2048,8192,32768}``: the attention modules of :mod:`hrope.nn` (``prope``, ``gta``,
   ``hrope-lift`` each with ``fold=True`` and ``fold=False``; ``rope2d``; a plain
   Linear-SDPA-Linear module) in bfloat16 with flash SDPA, forward and forward+backward
   (benchmarks/folded_attention.py ``--parts modules``): whether folding pays on a GPU. The
   modules do not fold unless asked (``fold=False``); the summary's ``fold`` section says which
   default these numbers support (``fold_recommended``, from the measured folded / unfolded ratios).
4. ``banded_apply``: the block-diagonal transform alone (y = D x, the op around SDPA) by the
   fused Triton kernel, the unfused banded passes and ``torch.compile`` of the unfused passes,
   with each one's max error against the banded passes in float64 on the same inputs.
5. ``train_throughput``: steps/s of the tiny LVSM preset per encoding; ``folded_training``: the
   same with ``model.folded_attention`` off and on (folded_attention.py ``--parts training``).
6. ``half_precision_speed``: ``hrope.multiview_attention`` of ``rope2d``, ``prope``, ``hrope`` and
   ``hrope-lift`` in bfloat16 and float16 under each precision (half_precision.py ``--parts
   speed``, N = 8192): what the default ``"auto"`` (SDPA in float32 for the encodings with
   geometric blocks) costs against ``"float32"`` (SDPA in the half dtype).

``summary.json`` / ``summary.md`` list every step's status and time, the overhead table, and the
folded / unfolded time ratios with the default they support (:func:`fold_decision`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hrope.encodings import ENCODINGS
from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.running.provenance import describe, provenance

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu"
ROWS = ["prope", "hrope", "hrope-lift", "prope-einsum"]
SIZES = {2048: 2, 8192: 8, 32768: 32}  # tokens -> views of 32x32 patches
# folded / unfolded time at or below which folding counts as faster: beyond the few-percent spread
# of interleaved repetitions (docs/benchmarks.md, "Folded attention")
FOLD_MARGIN = 0.97


def steps(device: str, out: Path, quick: bool) -> list[tuple[str, list[str], float]]:
    """``(name, argv, time limit in s)`` of every step, in order."""
    grid, reps = ("2", "2") if quick else ("32", "20")
    backend = "auto" if quick else "flash"
    sizes = {2 * 4: 2, 8 * 4: 8} if quick else SIZES
    checked = ["--encodings", "prope", "hrope-lift"] if quick else []
    listed = [
        ("device_check", ["device_check.py", "--device", device, "--out", str(out), *checked], 120),
        (
            "device_check_fused",
            ["device_check.py", "--device", device, "--out", str(out), *checked, "--transform-backend", "triton"],
            120,
        ),
    ]
    for tokens, views in sizes.items():
        common = [
            "attention_overhead.py",
            "--device",
            device,
            "--dtype",
            "bfloat16",
            "--sdpa-backend",
            backend,
            "--views",
            str(views),
            "--grid",
            grid,
            "--reps",
            reps,
            "--encodings",
            *ROWS,
            "--out",
            str(out),
        ]
        listed.append((f"overhead_n{tokens}", [*common, "--tag", f"n{tokens}"], 60 if tokens < 32768 else 90))
        if tokens >= 8192 or quick:
            listed.append(
                (f"overhead_n{tokens}_prepared_once", [*common, "--prepared-once", "--tag", f"n{tokens}"], 60)
            )
            fused = [*common, "--transform-backend", "triton", "--tag", f"n{tokens}_fused"]
            listed.append((f"overhead_n{tokens}_fused", fused, 60))
            listed.append((f"overhead_n{tokens}_fused_prepared_once", [*fused, "--prepared-once"], 60))
    listed += folded_steps(device, out, quick)
    listed.append(
        (
            "banded_apply",
            ["banded_apply.py", "--device", device, "--out", str(out)] + (["--quick"] if quick else []),
            90,
        )
    )
    listed.append(
        (
            "train_throughput",
            ["train_throughput.py", "--device", device, "--out", str(out)]
            + (["--rounds", "1", "--steps", "1", "--encodings", "none", "prope", "hrope-lift"] if quick else []),
            120,
        )
    )
    return [*listed, training_step(device, out, quick), half_precision_step(device, out, quick)]


def folded_steps(device: str, out: Path, quick: bool) -> list[tuple[str, list[str], float]]:
    """The hrope.nn modules in bfloat16 (flash SDPA on a GPU) at each N (folded_attention.py)."""
    grid, backend = ("2", "auto") if quick else ("32", "flash")
    sizes = {2 * 4: 2, 8 * 4: 8} if quick else SIZES
    folded = ["folded_attention.py", "--device", device, "--dtype", "bfloat16", "--sdpa-backend", backend]
    folded += ["--grid", grid, "--reps", "1" if quick else "10", "--out", str(out), "--parts", "modules"]
    return [
        (f"folded_n{tokens}", [*folded, "--views", str(views), "--tag", f"n{tokens}"], 60)
        for tokens, views in sizes.items()
    ]


def half_precision_step(device: str, out: Path, quick: bool) -> tuple[str, list[str], float]:
    """The cost of each precision (half_precision.py --parts speed): bfloat16 and float16, N = 8192."""
    shape = ["--views", "2", "--grid", "2", "--reps", "1"] if quick else ["--views", "8", "--grid", "32", "--reps", "5"]
    encodings = ["--encodings", "rope2d", "prope", "hrope", "hrope-lift"]
    argv = ["half_precision.py", "--device", device, "--parts", "speed", *shape, *encodings, "--out", str(out)]
    return ("half_precision_speed", argv, 60)


def training_step(device: str, out: Path, quick: bool) -> tuple[str, list[str], float]:
    """Training steps/s with model.folded_attention off and on (folded_attention.py, float32)."""
    rounds = ["--rounds", "1", "--steps", "1"] if quick else ["--rounds", "3", "--steps", "5"]
    training = ["folded_attention.py", "--device", device, "--parts", "training", *rounds, "--tag", "training"]
    return ("folded_training", [*training, "--out", str(out)], 180 if quick else 90)


def run_steps(listed, budget_s: float, env: dict | None = None) -> list[dict]:
    """Run every step within its limit and what is left of ``budget_s`` (with ``env`` added to the
    environment); one record per step."""
    start, records = time.perf_counter(), []
    for name, argv, limit in listed:
        left = budget_s - (time.perf_counter() - start)
        if left < 10:
            records.append({"step": name, "status": "not run (budget spent)", "seconds": 0.0})
            continue
        began = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, *argv],
                cwd=HERE,
                capture_output=True,
                text=True,
                timeout=min(limit, left),
                env={**os.environ, **(env or {})},
            )
            status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
            tail = (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired as expired:
            status, tail = f"timed out after {min(limit, left):.0f} s", str(expired.stdout or "")[-2000:]
        records.append(
            {"step": name, "status": status, "seconds": round(time.perf_counter() - began, 1), "output_tail": tail}
        )
        print(f"{name}: {status} ({records[-1]['seconds']} s)", flush=True)
    return records


def overhead_table(out: Path, device: str) -> list[str]:
    """Markdown rows: per N, transform backend and encoding, forward and forward+backward / SDPA,
    per call and with the transform prepared once."""
    prefix = "attention_overhead" + ("" if device == "cpu" else f"_{device}") + "_bfloat16"
    lines = [
        "| N | transforms | encoding | fwd / SDPA | fwd+bwd / SDPA | prepared once: fwd / SDPA "
        "| prepared once: fwd+bwd / SDPA |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = []
    for path in out.glob(f"{prefix}_n*.json"):
        match = re.fullmatch(rf"{prefix}_n(\d+)(_fused)?", path.stem)
        if match:
            runs.append((int(match[1]), bool(match[2]), path))
    for tokens, fused, path in sorted(runs):
        per_call = json.loads(path.read_text())
        once_path = out / path.name.replace(f"{prefix}_", f"{prefix}_prepared_once_", 1)
        once = json.loads(once_path.read_text()) if once_path.exists() else None
        for name in per_call["forward"]["ratio"]:
            cells = [f"{per_call[m]['ratio'][name]:.3f}" for m in ("forward", "forward_backward")]
            cells += [f"{once[m]['ratio'][name]:.3f}" if once else "n/a" for m in ("forward", "forward_backward")]
            backend = "fused" if fused and name != "prope-einsum" else "banded" if name != "prope-einsum" else "einsum"
            lines.append(f"| {tokens} | {backend} | {name} | " + " | ".join(cells) + " |")
    return lines


def fold_ratios(times: dict[str, list], column: int, unfolded: str) -> dict[str, float]:
    """Per encoding, from one timed part's ``seconds_per_repetition`` (folded_attention.py): the
    median over repetitions of the time of row ``<name> folded`` / that of row
    ``unfolded.format(name)`` in the same repetition (``column`` 0: wall-clock, 1: CPU time)."""
    ratios = {}
    for row, folded in times.items():
        name = row.removesuffix(" folded")
        if name != row and unfolded.format(name) in times:
            base = times[unfolded.format(name)]
            ratios[name] = round(statistics.median(f[column] / u[column] for f, u in zip(folded, base, strict=True)), 4)
    return ratios


def fold_decision(out: Path, device: str) -> dict:
    """What the suite measured of folding against not folding (the default): ``modules``, per N
    and mode, the hrope.nn modules in bfloat16, and ``training``, model.folded_attention off and
    on: ``{N: {mode: {encoding: folded / unfolded time}}}`` (wall-clock on a GPU, CPU time on a
    CPU). ``fold_recommended``: True when folding is faster by :data:`FOLD_MARGIN` in every module
    row of an encoding with a per-view factor to fold (``Encoding.per_view``), False when not (the
    default ``fold=False`` stands), None when no such row was read;
    ``folded_attention_recommended``: the same for training."""
    device_part = "" if device == "cpu" else f"_{device}"
    column = 1 if device == "cpu" else 0
    modules = {}
    for path in out.glob(f"folded_attention{device_part}_bfloat16_n*.json"):
        match = re.fullmatch(rf"folded_attention{device_part}_bfloat16_n(\d+)", path.stem)
        if match:
            parts = json.loads(path.read_text()).get("modules", {})
            ratios = {
                mode: fold_ratios(r["seconds_per_repetition"], column, "{} unfolded") for mode, r in parts.items()
            }
            modules[int(match[1])] = ratios
    training = {}
    training_path = out / f"folded_attention{device_part}_training.json"
    if training_path.exists() and "training" in (runs := json.loads(training_path.read_text())):
        training["tiny"] = {"training": fold_ratios(runs["training"]["seconds_per_repetition"], column, "{}")}

    def verdict(measured: dict) -> bool | None:
        tables = [rows for modes in measured.values() for rows in modes.values()]
        values = [r for rows in tables for name, r in rows.items() if ENCODINGS[name].per_view is not None]
        return all(r <= FOLD_MARGIN for r in values) if values else None

    return {
        "margin": FOLD_MARGIN,
        "modules": {str(n): modules[n] for n in sorted(modules)},
        "training": training,
        "fold_recommended": verdict(modules),
        "folded_attention_recommended": verdict(training),
    }


def fold_lines(decision: dict) -> list[str]:
    """Markdown: the folded / unfolded ratios and, in words, the default they support."""
    lines = ["| part | N | mode | encoding | folded / unfolded time |", "|---|---|---|---|---|"]
    for part in ("modules", "training"):
        for n, modes in decision[part].items():
            for mode, rows in modes.items():
                lines += [f"| {part} | {n} | {mode} | {name} | {ratio:.3f} |" for name, ratio in rows.items()]
    margin = f"{1 - decision['margin']:.0%}"
    words = {
        None: "not measured (no run read): the default stays",
        True: f"folding is faster by {margin} or more in every row: these numbers support folding by default",
        False: f"folding is not faster by {margin} in every row: these numbers support not folding by default",
    }
    modules, model = decision["fold_recommended"], decision["folded_attention_recommended"]
    return [
        *lines,
        "",
        f"`fold_recommended: {json.dumps(modules)}` (hrope.nn modules, default `fold=False`): {words[modules]}.",
        f"`folded_attention_recommended: {json.dumps(model)}` (the LVSM model's `model.folded_attention`, "
        f"default false): {words[model]}.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=470.0, help="wall-clock budget of all steps")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and one repetition (a check of the script)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # on a CPU the fused kernel runs in Triton's interpreter (a check of the script, not a timing)
    env = {"TRITON_INTERPRET": "1"} if args.device == "cpu" else None
    records = run_steps(steps(args.device, args.out.resolve(), args.quick), args.budget_s, env)
    decision = fold_decision(args.out, args.device)
    summary = {"device": args.device, "quick": args.quick, "provenance": provenance(), "steps": records}
    summary["fold"] = decision
    write_json(args.out / "summary.json", summary)
    lines = [
        f"GPU suite on `{args.device}`{' (quick shapes)' if args.quick else ''}, commit "
        f"`{describe(summary['provenance'])}`.",
        "",
        "| step | status | seconds |",
        "|---|---|---|",
        *(f"| {r['step']} | {r['status']} | {r['seconds']} |" for r in records),
        "",
        *overhead_table(args.out, args.device),
        "",
        *fold_lines(decision),
    ]
    write_text(args.out / "summary.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
