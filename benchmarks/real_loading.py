"""Training steps/s on a real capture against synthetic scenes, tiny preset, batch 4.

Builds a COLMAP-like fixture of large JPEGs (``--images`` photos of ``--size``, default 10 of
2832x2128, a real capture's size: smooth random colours plus noise, quality 90, a SIMPLE_RADIAL
camera with k = -0.05, so every view is undistorted), then times training steps as ``hrope train``
takes them: the batch from ``hrope.nvs.running.train.StepLoader`` (which loads the next step's scenes in
one background thread) collated, then :func:`hrope.nvs.running.train_step.train_step` (schedule, forward,
loss, backward, gradient clipping, the non-finite check, AdamW), at 64x64, batch 4 x (2 context +
1 target). Three data sets, timed in interleaved rounds:

- ``synthetic``: 8 room scenes, rendered once and kept in memory (``data.cache``): no loading cost;
- ``real, cached``: the fixture through ``build_dataset`` with its image cache warm (``data.cache``);
- ``real, uncached``: ``data.cache: false``, every view decoded at every step (JPEG DCT scaling,
  undistortion, resize).

Each round runs ``--steps`` steps of each; the last step of a round does not prefetch, so no
loading spills into the next data set's timing (each round's first step loads without overlap).
The ratio is the step time relative to the synthetic step of the same round, median over rounds.
Writes ``benchmarks/results/real_loading.{json,md}``.

    python benchmarks/real_loading.py [--rounds 5] [--steps 10] [--threads 1] [--workers 0]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hrope.nvs.running.atomic import save_image, write_json, write_text
from hrope.nvs.config import RunConfig, resolve
from hrope.nvs.build_data import build_dataset, collate
from hrope.nvs.model import build_model
from hrope.nvs.running.train import StepLoader
from hrope.nvs.running.train_step import make_optimizer, perceptual_loss, train_step
from hrope.nvs.running.provenance import describe, provenance

BATCH_SIZE = 4
KINDS = ("synthetic", "real, cached", "real, uncached")


def make_fixture(folder: Path, count: int, size: tuple[int, int], seed: int = 0) -> None:
    """A COLMAP text model (``sparse/0``) of ``count`` JPEG photos of ``size (H, W)`` in ``images/``:
    cameras 10 cm apart on a line, turning by 2 degrees each, one SIMPLE_RADIAL camera."""
    height, width = size
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (height // 64 + 2, width // 64 + 2, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((width, height), Image.BICUBIC), dtype=np.float32)
        noisy = np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8)
        save_image(Image.fromarray(noisy), folder / "images" / f"img_{i:03d}.jpg", quality=90)
        angle = math.radians(2 * (i - count / 2))  # a yaw about y: quaternion (cos a/2, 0, sin a/2, 0)
        lines.append(f"{i + 1} {math.cos(angle / 2)} 0 {math.sin(angle / 2)} 0 {0.1 * i} 0 0 1 img_{i:03d}.jpg\n")
    write_text(
        folder / "sparse" / "0" / "cameras.txt",
        f"1 SIMPLE_RADIAL {width} {height} {0.8 * width} {width / 2} {height / 2} -0.05\n",
    )
    write_text(folder / "sparse" / "0" / "images.txt", "\n".join(lines) + "\n")


def make_step(config: RunConfig):
    """One training step of ``config``'s model on a batch (CPU): :func:`hrope.nvs.running.train_step.train_step`,
    each call the next step of the schedule."""
    torch.manual_seed(0)
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
    perceptual = perceptual_loss(config, torch.device("cpu"))
    counter = itertools.count()

    def step(batch) -> None:
        train_step(model, optimizer, batch, next(counter), config.train, perceptual)

    return step


def datasets(fixture: Path, cache: Path, workers: int) -> dict:
    """The three data sets of the module doc, warmed up."""
    model = {"preset": "tiny", "encoding": "none"}
    real = {"kind": "colmap", "root": str(fixture), "num_scenes": None, "cache_dir": str(cache), "workers": workers}
    configs = {
        "synthetic": resolve({"model": model, "data": {"kind": "room", "num_scenes": 8}}),
        "real, cached": resolve({"model": model, "data": real}),
        "real, uncached": resolve({"model": model, "data": {**real, "cache": False}}),
    }
    sets = {kind: build_dataset(config, "train") for kind, config in configs.items()}
    for index in range(8):
        sets["synthetic"][index]  # rendered once, then kept in memory
    source = sets["real, cached"].source
    source.load_views(0, list(range(source.num_frames(0))))  # every view decoded once into the cache
    return {kind: (sets[kind], configs[kind]) for kind in KINDS}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per data set per round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--workers", type=int, default=0, help="data.workers (threads decoding one example)")
    parser.add_argument("--images", type=int, default=10, help="photos in the fixture")
    parser.add_argument("--size", type=int, nargs=2, default=(2128, 2832), metavar=("H", "W"))
    parser.add_argument("--work", default=None, help="folder for the fixture and the cache (default: a temporary one)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return parser.parse_args()


def step_runners(sets: dict) -> tuple[dict, dict]:
    """Per data set its training step (:func:`make_step`) and its prefetching ``StepLoader``."""
    steps, loaders = {}, {}
    for kind, (dataset, config) in sets.items():
        steps[kind] = make_step(config)
        loaders[kind] = StepLoader(dataset, 0, 0, BATCH_SIZE, prefetch=True)
    return steps, loaders


def interleaved_step_seconds(steps: dict, loaders: dict, rounds: int, steps_per_round: int) -> dict[str, list[float]]:
    """Seconds per training step of each data set (the keys of ``steps``, each with its ``StepLoader``
    in ``loaders``) in each of ``rounds`` interleaved rounds, after a warm-up round; closes the loaders."""
    seconds: dict[str, list[float]] = {kind: [] for kind in steps}
    try:
        for round_ in range(rounds + 1):  # round 0 warms up
            for kind in steps:
                start = time.perf_counter()
                for s in range(steps_per_round):
                    step = round_ * steps_per_round + s
                    scenes = loaders[kind].scenes(step, prefetch_next=s + 1 < steps_per_round)
                    steps[kind](collate(scenes, 2, torch.device("cpu")))
                if round_:
                    seconds[kind].append((time.perf_counter() - start) / steps_per_round)
    finally:
        for loader in loaders.values():
            loader.close()
    return seconds


def measure(steps: dict, loaders: dict, rounds: int, steps_per_round: int) -> dict[str, list[float]]:
    """Steps/s of each data set in each of ``rounds`` interleaved rounds (after a warm-up round);
    closes the loaders."""
    seconds = interleaved_step_seconds(steps, loaders, rounds, steps_per_round)
    return {kind: [1.0 / value for value in seconds[kind]] for kind in KINDS}


def result_rows(rates: dict[str, list[float]]) -> list[dict]:
    """Per data set: median steps/s and the median step-time ratio to the synthetic step of the same round."""
    ratios = {kind: statistics.median(s / r for s, r in zip(rates["synthetic"], rates[kind])) for kind in KINDS}
    return [
        {
            "data": kind,
            "steps_per_s": statistics.median(rates[kind]),
            "step_time_ratio_to_synthetic": ratios[kind],
            "steps_per_s_per_round": rates[kind],
        }
        for kind in KINDS
    ]


def write_outputs(meta: dict, rows: list[dict], out: Path) -> None:
    """``real_loading.{json,md}`` in ``out``; the table is also printed."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "real_loading.json", {"meta": meta, "results": rows})
    load_average = meta["load_average_at_start"]
    lines = [
        f"Training steps/s, {meta['batch']}, fp32 CPU, {meta['threads']} torch thread(s), data.workers "
        f"{meta['workers']}, median of {meta['rounds']} interleaved rounds of {meta['steps_per_round']} steps; "
        f"load average at start {', '.join(f'{x:.2f}' for x in load_average)} ({meta['cpus']} CPUs). "
        f"Real data: {meta['fixture']}.",
        f"Command: `{meta['command']}` (torch {meta['torch']}).  ",
        f"Commit: `{describe(meta['provenance'])}`.",
        "",
        "| data | steps/s | step time / synthetic step |",
        "|---|---|---|",
    ]
    lines += [f"| {r['data']} | {r['steps_per_s']:.2f} | {r['step_time_ratio_to_synthetic']:.2f} |" for r in rows]
    write_text(out / "real_loading.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work or temporary)
        make_fixture(work / "capture", args.images, tuple(args.size))
        photo_bytes = statistics.mean(p.stat().st_size for p in (work / "capture" / "images").iterdir())
        sets = datasets(work / "capture", work / "cache", args.workers)
        steps, loaders = step_runners(sets)
        load_average = os.getloadavg()
        rates = measure(steps, loaders, args.rounds, args.steps)
    fixture = (
        f"{args.images} JPEGs of {args.size[1]}x{args.size[0]} (mean {photo_bytes / 1e6:.1f} MB, quality 90), "
        f"COLMAP SIMPLE_RADIAL camera"
    )
    meta = {
        "command": "python " + " ".join(["benchmarks/real_loading.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "workers": args.workers,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "fixture": fixture,
        "batch": f"{BATCH_SIZE} x (2 context + 1 target) at 64x64, tiny preset, encoding none",
        "load_average_at_start": list(load_average),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "provenance": provenance(),
    }
    write_outputs(meta, result_rows(rates), Path(args.out))


if __name__ == "__main__":
    main()
