"""Speed with and without ``torch.compile(fullgraph=True)``: multiview attention and an LVSM training step.

Rows: ``hrope.multiview_attention`` forward + backward (prepare included, as a model calls it per
batch) for each ``--encodings`` at ``--views`` views of a ``--grid`` patch grid, ``--heads`` heads of
``--head-dim`` channels, batch 1; and one training step of the ``tiny`` LVSM
(:func:`hrope.nvs.running.train_step.train_step`, batch 2 scenes x (2 context + 1 target) views at 64x64)
for each ``--models`` encoding, the model compiled in place (``nn.Module.compile``). Eager and
compiled calls alternate in ``--rounds`` rounds of ``--reps`` calls after the warm-up, which
holds the compilation (its time is reported); the ratio is eager time / compiled time (> 1:
compiled is faster). Writes ``compile_speed.{json,md}`` to ``--out``.

    python benchmarks/compile_speed.py [--threads 1] [--rounds 5] [--reps 5] [--backend inductor]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import hrope
from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.config import resolve
from hrope.nvs.data.batch import collate_scenes
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.model import build_model
from hrope.nvs.running.train_step import make_optimizer, train_step
from hrope.testing import encoding_inputs, random_cameras, random_qkv
from hrope.nvs.running.provenance import describe, provenance

VARIANTS = ("eager", "compiled")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encodings", nargs="*", default=["prope", "hrope-lift", "rayrope"])
    parser.add_argument("--models", nargs="*", default=["hrope-lift"], help="LVSM training-step rows")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--grid", type=int, nargs=2, default=[16, 16])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="timed calls per variant per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor: the default)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return parser.parse_args(argv)


def attention_step(name: str, args: argparse.Namespace):
    """Forward + backward of multiview_attention with ``name`` on fixed random inputs."""
    grid = tuple(args.grid)
    cameras = random_cameras(B=1, V=args.views, seed=0, dtype=torch.float32)
    extra = encoding_inputs(name, cameras, grid, seed=1, dtype=torch.float32)
    tokens = args.views * grid[0] * grid[1]
    q, k, v = (x.requires_grad_() for x in random_qkv(1, args.heads, tokens, args.head_dim, dtype=torch.float32))

    def attend(q, k, v):
        return hrope.multiview_attention(q, k, v, encoding=name, cameras=cameras, grid=grid, **extra)

    def step(function):
        return lambda: function(q, k, v).sum().backward()

    return step(attend), step(torch.compile(attend, fullgraph=True, backend=args.backend))


def model_step(name: str, args: argparse.Namespace):
    """One training step of the tiny LVSM with ``name``: an eager model and a compiled copy."""
    scenes = [make_scene(0, i, "room", num_views=3, image_size=(64, 64)) for i in range(2)]
    batch = collate_scenes(scenes, 2)
    config = resolve({"model": {"preset": "tiny", "encoding": name}})

    def step(compiled: bool):
        torch.manual_seed(0)
        model = build_model(config)
        if compiled:
            model.compile(fullgraph=True, backend=args.backend)
        optimizer, counter = make_optimizer(model, config.train), itertools.count()
        return lambda: train_step(model, optimizer, batch, next(counter), config.train, None)

    return step(False), step(True)


def timed(function, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        function()
    return (time.perf_counter() - start) / reps


def measure(rows: list[tuple[str, str, object]], args: argparse.Namespace) -> list[dict]:
    """Per row: warm-up times (eager; compiled, i.e. the compilation) and the median over
    interleaved rounds of the mean time per call of each variant."""
    results = []
    for kind, name, (eager, compiled) in rows:
        warm = [timed(f, 1) for f in (eager, compiled)]
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for i, function in enumerate((eager, compiled)):
                times[i].append(timed(function, args.reps))
        eager_ms, compiled_ms = (1e3 * statistics.median(t) for t in times)
        results.append(
            {
                "row": kind,
                "encoding": name,
                "eager_ms": eager_ms,
                "compiled_ms": compiled_ms,
                "speedup": eager_ms / compiled_ms,
                "first_call_s": {"eager": warm[0], "compiled": warm[1]},
                "spread": {
                    "eager": [1e3 * min(times[0]), 1e3 * max(times[0])],
                    "compiled": [1e3 * min(times[1]), 1e3 * max(times[1])],
                },
            }
        )
        print(f"{kind} {name}: eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms", flush=True)
    return results


def write_outputs(meta: dict, rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "compile_speed.json", {"meta": meta, "results": rows})
    lines = [
        f"Speed with and without `torch.compile(fullgraph=True, backend={meta['backend']!r})`, CPU, "
        f"{meta['threads']} thread(s), median over {meta['rounds']} interleaved rounds of {meta['reps']} calls "
        f"(min-max over rounds in brackets). Attention: {meta['attention_shape']}, forward + backward, "
        f"prepare included. Model: {meta['model_step']}.",
        f"Command: `{meta['command']}` (torch {meta['torch']}, {meta['machine']}).  ",
        f"Commit: `{describe(meta['provenance'])}`.",
        "",
        "| row | encoding | eager ms | compiled ms | speedup (eager / compiled) | compile (first call) s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        eager, compiled = (f"{r[f'{v}_ms']:.2f} [{r['spread'][v][0]:.2f}-{r['spread'][v][1]:.2f}]" for v in VARIANTS)
        lines.append(
            f"| {r['row']} | {r['encoding']} | {eager} | {compiled} | {r['speedup']:.2f} | "
            f"{r['first_call_s']['compiled']:.1f} |"
        )
    write_text(out / "compile_speed.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [("attention", name, attention_step(name, args)) for name in args.encodings]
    rows += [("LVSM train step", name, model_step(name, args)) for name in args.models]
    results = measure(rows, args)
    grid = "x".join(map(str, args.grid))
    meta = {
        "command": "python " + " ".join(["benchmarks/compile_speed.py", *(sys.argv[1:] if argv is None else argv)]),
        "torch": torch.__version__,
        "backend": args.backend,
        "threads": args.threads,
        "rounds": args.rounds,
        "reps": args.reps,
        "attention_shape": f"batch 1, {args.views} views of {grid} patches, {args.heads} heads x {args.head_dim}",
        "model_step": "tiny preset, batch 2 x (2 context + 1 target) at 64x64, fp32, AdamW",
        "machine": platform.processor() or platform.machine(),
        "provenance": provenance(),
    }
    write_outputs(meta, results, Path(args.out))


if __name__ == "__main__":
    main()
