"""A cached training step on real captures against a synthetic step: the benchmark's speed target (<= 1.3x).

The same tiny model (``prope``, learned; 64x64), batch 4 x (2 context + 1 target), one torch thread,
one training step as ``hrope train`` takes it (the batch from ``hrope.nvs.running.train.StepLoader``,
collated, then :func:`hrope.nvs.running.train_step.train_step`), timed on three data sets in
interleaved rounds:

- ``synthetic``: 8 ``object`` scenes, rendered once and kept in memory (``data.cache``);
- ``captures``: the training scenes of ``--captures`` (:class:`hrope.nvs.data.real.captures.CaptureScenes`,
  protocol ``views``, photo background, no geometry), built once before timing (its disk and
  memory caches warm, as every cell after a capture's first finds them);
- ``captures, sfm``: the same with the SfM depth of the context views (geometry ``sfm``).

The ratio is each step time over the synthetic step time of the same round, median over rounds.
Writes ``OUT/real_step_cost.{json,md}`` (default ``benchmarks/results/real_captures``).

    python benchmarks/real_step_cost.py --captures ../shared/realdata/ethiopianHead ../shared/realdata/maryRose
    python benchmarks/real_step_cost.py --captures DIR [DIR ...] --rounds 3 --steps 5 --out OUT   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from real_loading import BATCH_SIZE, interleaved_step_seconds, make_step

from hrope.nvs.build_data import build_dataset
from hrope.nvs.config import resolve
from hrope.nvs.data.real.captures import CaptureScenes
from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.running.provenance import describe, provenance
from hrope.nvs.running.train import StepLoader

TARGET = 1.3  # the benchmark's bound on a cached real step relative to a synthetic one
MODEL = {"preset": "tiny", "encoding": "prope"}


def data_sets(captures: list[Path], cache: Path) -> dict:
    """The three data sets of the module doc, warmed up (every scene loaded once; decoded views and
    SfM points kept in ``cache``)."""
    config = resolve({"model": MODEL, "data": {"kind": "object", "num_scenes": 8}})
    sets = {"synthetic": build_dataset(config, "train")}
    for name, geometry in (("captures", "none"), ("captures, sfm", "sfm")):
        sets[name] = CaptureScenes(
            captures=captures,
            protocol="views",
            split="train",
            image_size=config.model.image_size,
            geometry=geometry,
            cache_dir=cache / "images",
            sfm_cache_dir=cache / "sfm",
        )
    for dataset in sets.values():
        for index in range(len(dataset)):
            dataset[index]
    return {"sets": sets, "config": config}


def measure(data: dict, rounds: int, steps_per_round: int) -> dict[str, list[float]]:
    """Seconds per step of each data set in each of ``rounds`` interleaved rounds (after a warm-up round)."""
    sets = data["sets"]
    steps = {kind: make_step(data["config"]) for kind in sets}
    loaders = {kind: StepLoader(dataset, 0, 0, BATCH_SIZE, prefetch=True) for kind, dataset in sets.items()}
    return interleaved_step_seconds(steps, loaders, rounds, steps_per_round)


def result_rows(seconds: dict[str, list[float]]) -> list[dict]:
    """Per data set: the median step time and the median ratio to the synthetic step of the same round."""
    return [
        {
            "data": kind,
            "step_seconds": statistics.median(values),
            "ratio_to_synthetic": statistics.median(v / s for v, s in zip(values, seconds["synthetic"])),
            "step_seconds_per_round": values,
        }
        for kind, values in seconds.items()
    ]


def write_outputs(meta: dict, rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "real_step_cost.json", {"meta": meta, "results": rows})
    lines = [
        f"Training step time, {meta['batch']}, fp32 CPU, {meta['threads']} torch thread, median of {meta['rounds']} "
        f"interleaved rounds of {meta['steps_per_round']} steps; load average at start "
        f"{', '.join(f'{x:.2f}' for x in meta['load_average_at_start'])} ({meta['cpus']} CPUs). "
        f"Captures: {', '.join(meta['captures'])} ({meta['capture_scenes']} training scenes). Target: a cached "
        f"real step at most {TARGET}x a synthetic one.",
        f"Command: `{meta['command']}` (torch {meta['torch']}).  ",
        f"Commit: `{describe(meta['provenance'])}`.",
        "",
        "| data | step time (ms) | step time / synthetic step |",
        "|---|---|---|",
    ]
    lines += [f"| {r['data']} | {1000 * r['step_seconds']:.1f} | {r['ratio_to_synthetic']:.2f} |" for r in rows]
    write_text(out / "real_step_cost.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--captures", nargs="+", required=True, metavar="DIR")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per data set per round")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "real_captures"))
    parser.add_argument("--work", default=None, help="cache of decoded views and SfM points (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    captures = [Path(c) for c in args.captures]
    with tempfile.TemporaryDirectory() as temporary:
        data = data_sets(captures, Path(args.work or temporary))
        load_average = os.getloadavg()
        seconds = measure(data, args.rounds, args.steps)
    meta = {
        "command": " ".join(["python", "benchmarks/real_step_cost.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "captures": [c.name for c in captures],
        "capture_scenes": len(data["sets"]["captures"]),
        "batch": f"{BATCH_SIZE} x (2 context + 1 target) at 64x64, tiny preset, encoding prope",
        "target": TARGET,
        "load_average_at_start": list(load_average),
        "cpus": os.cpu_count(),
        "provenance": provenance(),
    }
    write_outputs(meta, result_rows(seconds), Path(args.out))


if __name__ == "__main__":
    main()
