"""Synthetic-data speed: rendering, whole scenes, and training batches.

    python benchmarks/render_speed.py [--reps 5]

Measures (median over repetitions, CPU, torch's default threads unless ``--threads``):
1. ``render``: 64 views of 128x128 with images, z-depth, normals and plane vectors, for a room
   and an object scene (layout, cameras and textures prepared beforehand).
2. ``make_scene``: the same including layout, trajectory and texture generation.
3. a training batch: ``SyntheticDataset`` (room, 64x64, 2 context + 2 target views), 4 scenes,
   ``collate_scenes``; compare with the training step time of the model.
Writes benchmarks/results/render_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.data import SyntheticDataset, collate_scenes, make_scene
from hrope.nvs.data.synthetic import scene_setup
from hrope.nvs.data.synthetic.render import render
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_S = 0.5


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    return parser.parse_args()


def scene_rows(kind: str, reps: int) -> list[dict]:
    """The ``render`` and ``make_scene`` rows of one scene ``kind``."""
    layout, cameras, textures = scene_setup(0, 1, kind, 64, (128, 128), frames=list(range(0, 192, 3)))
    render_s = median_time(lambda: render(layout.quads, textures, cameras), reps)
    scene_s = median_time(lambda: make_scene(0, 1, kind, 64, (128, 128), frames=list(range(0, 192, 3))), reps)
    return [
        {
            "what": f"{kind}: render 64 views 128x128 (+depth, normals, planes)",
            "seconds": render_s,
            "quads": layout.quads.count,
        },
        {
            "what": f"{kind}: make_scene 64 views 128x128 (incl. textures)",
            "seconds": scene_s,
            "quads": layout.quads.count,
        },
    ]


def batch_row(reps: int) -> dict:
    """The training-batch row: 4 fresh room scenes per repetition, normalised and collated."""
    dataset = SyntheticDataset("room", 1000, seed=0, image_size=(64, 64), num_context=2, num_target=2)
    counter = iter(range(0, 1000, 4))

    def batch():
        start = next(counter)
        return collate_scenes([dataset[start + i] for i in range(4)], num_context=2)

    return {
        "what": "training batch: 4 room scenes x (2 context + 2 target) 64x64, normalised + collated",
        "seconds": median_time(batch, reps),
        "quads": None,
    }


def write_outputs(info: dict) -> None:
    """``render_speed.json`` and ``render_speed.md`` in RESULTS; the table is also printed."""
    RESULTS.mkdir(exist_ok=True)
    write_json(RESULTS / "render_speed.json", info, newline=True)
    lines = [
        "# Synthetic data speed",
        "",
        f"Command: `{info['command']}`  ",
        f"Commit: `{describe(info['provenance'])}`",
        "",
        f"CPU, torch {info['torch']}, {info['threads']} threads, load average at start "
        f"{info['load_average_at_start']}, median of {info['reps']} runs. Target: rendering 64 views of 128x128 "
        f"with depth and normals in at most {TARGET_S} s.",
        "",
        "| what | quads | seconds |",
        "|---|---|---|",
    ]
    rows = info["rows"]
    lines += [f"| {r['what']} | {r['quads'] if r['quads'] is not None else '-'} | {r['seconds']:.3f} |" for r in rows]
    write_text(RESULTS / "render_speed.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    make_scene(0, 0, "room", 2, (32, 32))  # warm-up: loads the photographs
    rows = [row for kind in ("room", "object") for row in scene_rows(kind, args.reps)]
    rows.append(batch_row(args.reps))
    info = {
        "command": "python benchmarks/render_speed.py"
        + (f" --reps {args.reps}" if args.reps != 5 else "")
        + (f" --threads {args.threads}" if args.threads else ""),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "reps": args.reps,
        "target_render_s": TARGET_S,
        "provenance": provenance(),
        "rows": rows,
    }
    write_outputs(info)


if __name__ == "__main__":
    main()
