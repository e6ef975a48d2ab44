"""Training throughput of the `tiny` LVSM preset per encoding (DESIGN.md §8).

One training step = :func:`hrope.nvs.running.train_step.train_step`, the step ``hrope train`` takes
(learning-rate schedule, forward, loss, backward, gradient clipping, the non-finite check, AdamW;
fp32 and MSE only, as the default ``train.bf16`` and ``train.perceptual_weight``) on a fixed
synthetic batch (data loading excluded), batch 4 scenes x (2 context + 1 target) views at 64x64.
Encodings are measured in interleaved
rounds; steps/s is the median over rounds, and the ratio is to `none` (the LVSM baseline).
Writes benchmarks/results/train_throughput.{json,md}.

    python benchmarks/train_throughput.py [--rounds 5] [--steps 5] [--threads 1] [--device cuda]

``--device cuda`` synchronises the GPU after each round and writes train_throughput_cuda.*.
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

from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.data.batch import collate_scenes
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.config import resolve
from hrope.nvs.model import count_parameters, encoding_names
from hrope.nvs.model import build_model
from hrope.nvs.running.train_step import make_optimizer, perceptual_loss, train_step
from hrope.nvs.running.provenance import describe, provenance

BATCH_SIZE = 4


def step_function(encoding: str, batch, model_options: dict | None = None):
    """One training step of the ``tiny`` preset with ``encoding`` (and ``model_options``, other
    keys of the model section) on ``batch`` (on its device): :func:`hrope.nvs.running.train_step.train_step`
    with the default config's optimiser, schedule and loss, each call the next step of the schedule."""
    torch.manual_seed(0)
    config = resolve({"model": {"preset": "tiny", "encoding": encoding, **(model_options or {})}})
    model = build_model(config).to(batch.images.device)
    optimizer = make_optimizer(model, config.train)
    perceptual = perceptual_loss(config, batch.images.device)
    counter = itertools.count()

    def step():
        train_step(model, optimizer, batch, next(counter), config.train, perceptual)

    return step, count_parameters(model)["total"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per encoding per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--encodings", nargs="*", default=None)
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return parser.parse_args()


def measure(encodings: list[str], batch, device: torch.device, rounds: int, steps: int) -> list[dict]:
    """One row per encoding: steps/s (median over interleaved rounds of ``steps`` steps, after one
    warm-up step each), samples/s, the ratio to ``none`` and the parameter count."""

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step_of, params = {}, {}
    for name in encodings:
        step_of[name], params[name] = step_function(name, batch)
        step_of[name]()  # warm-up
    rates = {name: [] for name in encodings}
    for _ in range(rounds):
        for name in encodings:
            synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                step_of[name]()
            synchronize()
            rates[name].append(steps / (time.perf_counter() - start))
    base = statistics.median(rates["none"])
    rows = []
    for name in encodings:
        rate = statistics.median(rates[name])
        rows.append(
            {
                "encoding": name,
                "steps_per_s": rate,
                "samples_per_s": rate * BATCH_SIZE,
                "ratio_to_none": rate / base,
                "parameters": params[name],
            }
        )
    return rows


def write_outputs(meta: dict, rows: list[dict], out: Path) -> None:
    """``train_throughput[_<device type>].{json,md}`` in ``out``; the table is also printed."""
    device = torch.device(meta["device"])
    out.mkdir(parents=True, exist_ok=True)
    stem = "train_throughput" + ("" if device.type == "cpu" else f"_{device.type}")
    write_json(out / f"{stem}.json", {"meta": meta, "results": rows})
    lines = [
        f"Training throughput, `tiny` preset (64x64, patch 8, d 128, 4 layers), batch {meta['batch']}, "
        f"fp32 {meta['device']}, {meta['threads']} thread(s), median of {meta['rounds']} interleaved rounds of "
        f"{meta['steps_per_round']} steps.",
        f"Command: `{meta['command']}` (torch {meta['torch']}).  ",
        f"Commit: `{describe(meta['provenance'])}`.",
        "",
        "| encoding | steps/s | samples/s | ratio to none | parameters |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['encoding']} | {r['steps_per_s']:.2f} | {r['samples_per_s']:.1f} | "
            f"{r['ratio_to_none']:.2f} | {r['parameters']:,} |"
        )
    write_text(out / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    encodings = args.encodings or [e for e in encoding_names() if not e.endswith("-ape")] + ["hrope-ape"]
    if "none" not in encodings:
        encodings.insert(0, "none")
    scenes = [make_scene(0, i, "room", num_views=3, image_size=(64, 64)) for i in range(BATCH_SIZE)]
    batch = collate_scenes(scenes, 2).to(device)
    rows = measure(encodings, batch, device, args.rounds, args.steps)
    meta = {
        "command": "python " + " ".join(["benchmarks/train_throughput.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "batch": f"{BATCH_SIZE} x (2 context + 1 target) at 64x64",
        "machine": platform.processor() or platform.machine(),
        "device": str(device),
        "provenance": provenance(),
    }
    write_outputs(meta, rows, Path(args.out))


if __name__ == "__main__":
    main()
