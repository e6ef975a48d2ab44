"""``python -m hrope.nvs.demo`` (``make demo``): the whole pipeline on CPU in minutes.

Trains eight ``tiny`` LVSM models on synthetic room scenes for the same steps and batches, the
rows the 3-seed evidence in docs/results.md compares: ``none`` (LVSM baseline), ``prope``,
``prope`` with world-frame rays in the tokens, and ``urope`` (the recommended encoding without
depth); ``hrope-lift`` with the same rays and planes from the context views only, carried into the
target camera, learned or fitted to the context views' depth (what a model with a depth estimator
has at test time); and the two rows docs/results.md recommends given that depth, ``hrope-lift-uv``
and ``urope`` anchored at each token's depth (``worldrope`` without its footprint term), configured
as experiments/plane_evidence.py's planned rows. No row sees the target view's geometry. Each is evaluated on
held-out scenes; ``runs/demo`` gets ``results.md`` / ``results.json`` (PSNR, SSIM, ST-LPIPS (alex)
when ``stlpips-pytorch`` is installed, LPIPS-Alex unavailable without local weights, the learned planes'
accuracy against the neutral planes, and a one-sentence reading), ``comparison.png`` (per scene:
context views | ground truth | each model's prediction, a label over every column),
``results_bar.png`` (the table as bars) and ``normals.png`` (the learned plane normals next to the
ground truth). Re-running resumes or reuses finished runs.

The scenes are rendered once, then the rows train in ``--jobs`` worker processes (default: one per
available CPU core, at most one per row), each with one torch thread, the costliest rows first; a
row's result does not depend on the number of jobs (``--jobs 1`` trains them one after another in
this process).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .running.atomic import write_json, write_text
from .build_data import build_dataset, collate
from .config import RunConfig, resolve
from .viz.demo_figures import save_comparison, save_results_bar
from .evaluation.evaluate import available_st_lpips, evaluate_model, markdown_table, planes_table
from .evaluation.plane_accuracy import PlaneAccuracy, measures_planes
from .running.provenance import code_provenance
from .running.train import train
from .viz.figures import plane_normal_rows, save_image_grid

__all__ = ["DemoModel", "DEMO_MODELS", "demo_config", "reading", "main"]


@dataclass(frozen=True)
class DemoModel:
    """One demo row: its label, encoding, parameter source, ``predictor_options``, ``model.rays`` and
    ``encoding_options``."""

    name: str
    encoding: str
    predictor: str = "learned"
    options: dict = field(default_factory=dict)
    rays: str = "auto"
    encoding_options: dict = field(default_factory=dict)


# the context views' depth (the renderer's, a stand-in for a depth estimator), splatted into the target camera:
# the ``external`` source as experiments/plane_evidence.py's planned rows configure it
CONTEXT_DEPTH = {"use_normals": False, "targets": "transfer"}
DEMO_MODELS = (
    DemoModel("none", "none"),
    DemoModel("prope", "prope"),
    DemoModel("prope (world rays)", "prope", rays="world"),
    DemoModel("urope", "urope"),
    DemoModel(
        "hrope-lift (learned planes, transferred, world rays)",
        "hrope-lift",
        options={"targets": "transfer"},
        rays="world",
    ),
    DemoModel("hrope-lift (context depth, transferred, world rays)", "hrope-lift", "external", CONTEXT_DEPTH, "world"),
    DemoModel("hrope-lift-uv (context depth, transferred)", "hrope-lift-uv", "external", CONTEXT_DEPTH),
    # urope anchored at each token's depth: worldrope without its footprint term, on the same depth
    DemoModel(
        "urope (token depth from context depth, transferred)",
        "worldrope",
        "external",
        CONTEXT_DEPTH,
        encoding_options={"footprint": False},
    ),
)
REFERENCE = "prope"
SAME_RAYS = "prope (world rays)"  # what the world-rays rows' planes add to
DEPTH_ROWS = frozenset(m.name for m in DEMO_MODELS if m.predictor == "external")  # the rows given context depth
# rows closer than this to the best are named as not separated by one run: "a few tenths of a dB" (the seed
# spread of single rows in docs/results.md reaches 0.25 dB on 64 held-out scenes; the demo scores 32)
TIE_DB = 0.3
ROWS_TEXT = (
    "The rows given context depth (`external` source, `targets: transfer`) read the renderer's depth of the "
    "context views only (a stand-in for a depth estimator), fit a plane per patch (capped at |m| <= 2) and carry "
    "the planes into the target camera: `hrope-lift` uses them in its relative plane transform; `hrope-lift-uv` "
    "also carries each key's RoPE position along its plane into the query view; the token-depth `urope` row is "
    "`worldrope` without its footprint term, urope's RoPE with each token anchored at the depth where its "
    "plane meets the patch-centre ray (`urope` itself uses fixed anchors, no depth). The learned row carries "
    "its context planes over the same way; no row sees the target view's geometry. docs/results.md (3 seeds) "
    "recommends `urope` without depth and, given context depth, `urope` at the token's depth or `hrope-lift-uv`. "
    '"world rays": the Plücker rays in the tokens are in the world frame (scene normalised to the first context '
    "camera) instead of each token's camera frame."
)
TRAIN_SCENES, EVAL_SCENES, BATCH_SIZE = 256, 32, 4
# steps per row: the eight rows take an estimated 7 minutes on an idle 2-core machine (docs/notebook.md)
STEPS = 750


def demo_config(row: DemoModel, out: Path, steps: int) -> RunConfig:
    """The config of one demo run."""
    return resolve(
        {
            "model": {
                "preset": "tiny",
                "encoding": row.encoding,
                "predictor": row.predictor,
                "predictor_options": dict(row.options),
                "rays": row.rays,
                # only where set: the other rows' configs stay as they were (finished runs are reused)
                **({"encoding_options": dict(row.encoding_options)} if row.encoding_options else {}),
            },
            "data": {"kind": "room", "num_scenes": TRAIN_SCENES, "num_context": 2, "num_target": 1},
            "train": {
                "out": str(out),
                "steps": steps,
                "batch_size": BATCH_SIZE,
                "lr": 1e-3,
                "warmup": 50,
                "checkpoint_every": max(1, steps // 4),
                "image_every": max(1, steps // 4),
                "threads": 1,
            },
            "eval": {"num_scenes": EVAL_SCENES, "num_grid_scenes": 4},
        }
    )


def reading(results: list[dict]) -> str:
    """The demo table in a sentence: the best row against ``prope`` (a row given context depth also
    against the best row without depth; a world-rays HRoPE row against ``prope`` with the same rays),
    the rows within :data:`TIE_DB` of it, and what one seed can say."""
    psnr = {r["name"]: r["metrics"]["psnr"] for r in results}
    best = max(psnr, key=psnr.__getitem__)
    if best == REFERENCE:
        lead = f"`{REFERENCE}` scores highest"
    else:
        lead = f"`{best}` scores highest, {psnr[best] - psnr[REFERENCE]:+.2f} dB over `{REFERENCE}`"
        without_depth = [name for name in psnr if name not in DEPTH_ROWS]
        if best in DEPTH_ROWS and without_depth:
            top = max(without_depth, key=psnr.__getitem__)
            if top != REFERENCE:
                lead += f" and {psnr[best] - psnr[top]:+.2f} dB over `{top}`"
            lead += ", the best row without depth"
        elif "world rays" in best and best != SAME_RAYS and SAME_RAYS in psnr:
            lead += f" and {psnr[best] - psnr[SAME_RAYS]:+.2f} dB over `{SAME_RAYS}` (the same rays without planes)"
    close = [
        f"`{name}` ({psnr[name] - psnr[best]:+.2f})"
        for name in psnr
        if name != best and psnr[best] - psnr[name] < TIE_DB
    ]
    if close:
        verb = "is" if len(close) == 1 else "are"
        lead += f"; {_join(close)} {verb} within {TIE_DB} dB of it, which this run cannot separate"
    return (
        f"{lead}. This is one seed at a tiny budget, where differences of a few tenths of a dB are within "
        "run-to-run spread, so see docs/results.md (3 seeds, paired confidence intervals) before reading a "
        "ranking into it."
    )


def _join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# the order rows start in with several jobs: the costliest first (CPU seconds per training step, measured:
# docs/notebook.md), so that no job is left with a long row at the end: hrope-lift-uv, hrope-lift (learned),
# urope (token depth), hrope-lift (context depth), urope, prope (world rays), prope, none
COST_ORDER = (6, 4, 7, 5, 3, 2, 1, 0)
_SCENES: tuple = ()  # a worker process's (train, eval) scenes, set once by _init_worker


def _train_and_score(index: int, out: Path, steps: int, scenes: tuple, progress: bool) -> dict:
    """Train demo row ``index`` (into ``out/<row name>``) on ``scenes = (train, eval)`` and score it on
    the held-out ones. Returns ``{"result": its entry of results.json, "rows": comparison grid rows,
    "normals": plane-normal rows (rows that measure planes) or None, "device"}``; the result records
    the row's wall and CPU seconds."""
    row, started, cpu = DEMO_MODELS[index], time.perf_counter(), time.process_time()
    train_scenes, eval_scenes = scenes
    folder = row.name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    config = demo_config(row, out / folder, steps)
    model = train(config, dataset=train_scenes, progress=progress).model.eval()
    device = next(model.parameters()).device  # train.device "auto" picks CUDA when available
    planes = PlaneAccuracy() if measures_planes(model) else None
    metrics, _, rows = evaluate_model(
        model,
        eval_scenes,
        config.data.num_context,
        device=device,
        num_grid_scenes=config.eval.num_grid_scenes,
        planes=planes,
        st_lpips=available_st_lpips(device, model.config.image_size),
    )
    result = {"name": row.name, "metrics": metrics}
    normals = None
    if planes is not None:
        result["planes"] = planes.means()
        batch = collate([eval_scenes[i] for i in range(2)], config.data.num_context, device)
        normals = plane_normal_rows(model, batch)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["cpu_seconds"] = round(time.process_time() - cpu, 1)
    return {"result": result, "rows": rows, "normals": normals, "device": str(device)}


def _init_worker(scenes: tuple) -> None:
    global _SCENES
    _SCENES = scenes


def _score_in_worker(index: int, out: Path, steps: int) -> dict:
    return _train_and_score(index, out, steps, _SCENES, progress=False)


def _run_rows(out: Path, steps: int, scenes: tuple, jobs: int, start: float) -> list[dict]:
    """Every demo row's :func:`_train_and_score` output, in ``DEMO_MODELS`` order: in this process
    (``jobs`` 1) or in ``jobs`` spawned worker processes that receive the scenes once."""
    count = len(DEMO_MODELS)

    def done(index: int, output: dict) -> None:
        metrics = output["result"]["metrics"]
        print(
            f"[{index + 1}/{count}] {DEMO_MODELS[index].name}: PSNR {metrics['psnr']:.2f}  SSIM {metrics['ssim']:.3f} "
            f"(elapsed {time.perf_counter() - start:.0f} s)",
            flush=True,
        )

    outputs: dict[int, dict] = {}
    if jobs == 1:
        for index in range(count):
            print(f"[{index + 1}/{count}] {DEMO_MODELS[index].name}: training {steps} steps", flush=True)
            outputs[index] = _train_and_score(index, out, steps, scenes, progress=True)
            done(index, outputs[index])
        return [outputs[i] for i in range(count)]
    print(f"training {count} rows, {jobs} at a time (one process each, one torch thread each)", flush=True)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker, initargs=(scenes,)) as pool:
        futures = {pool.submit(_score_in_worker, index, out, steps): index for index in COST_ORDER}
        try:
            for future in as_completed(futures):
                outputs[futures[future]] = future.result()
                done(futures[future], outputs[futures[future]])
        except BaseException:  # a failed row (or Ctrl-C): start no further rows
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [outputs[i] for i in range(count)]


def _commit_line(code: dict) -> str:
    """``Commit: `<sha>`.`` of a :func:`hrope.nvs.running.provenance.code_provenance` dict (its dirty flag in words)."""
    if code["commit"] is None:
        return "Commit: unknown (not run from a git checkout)."
    return f"Commit: `{code['commit']}`" + (" + uncommitted changes." if code["dirty"] else ".")


def _report(
    steps: int, elapsed: float, device, results: list[dict], normals_of: str | None, jobs: int, code: dict
) -> str:
    """The text of ``results.md``: the setup (with the commit of ``code``, a
    :func:`hrope.nvs.running.provenance.code_provenance` dict), the table and its reading, the plane accuracy of the
    rows that predict planes and the figures' legend (``normals_of``: the row in ``normals.png``)."""
    columns = " | ".join(["context views", "ground truth", *(r["name"] for r in results)])
    accuracy = "".join(
        f"\nPlane accuracy of `{r['name']}` (held-out scenes, last layer; neutral = the planes at zero "
        f"head output):\n\n{planes_table(r['planes'])}"
        for r in results
        if r.get("planes")
    )
    return (
        "# Demo results\n\n"
        f"Command: `make demo` (`python -m hrope.nvs.demo --steps {steps}`). Tiny LVSM (64x64, patch 8, d 128, "
        f"4 layers), {steps} steps of batch {BATCH_SIZE} on {TRAIN_SCENES} synthetic room scenes (2 context + "
        f"1 target views), evaluated on {EVAL_SCENES} held-out scenes. "
        f"Total time {elapsed / 60:.1f} min on {device} ({jobs} parallel job{'s' if jobs > 1 else ''}; "
        f"{sum(r['cpu_seconds'] for r in results) / 60:.1f} CPU min of training and evaluation). "
        f"{_commit_line(code)}\n\n" + markdown_table(results) + f"\nReading: {reading(results)}\n\n"
        "LPIPS-Alex is unavailable: no local LPIPS weights are configured; ST-LPIPS (alex) is a different perceptual "
        "distance (shift-tolerant, its weights ship with the stlpips-pytorch package; docs/model.md). "
        f"{ROWS_TEXT}\n" + accuracy + f"\n`comparison.png` columns: {columns}. `results_bar.png`: the table as bars. "
        f"`normals.png`: input | overlay | `{normals_of}` normals | "
        "ground-truth normals, per context view.\n"
    )


def default_jobs() -> int:
    """One job per CPU core this process may use, at most one per row."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, len(DEMO_MODELS)))


def _figures(out: Path, outputs: list[dict], results: list[dict], steps: int) -> str | None:
    """Write comparison.png, results_bar.png and normals.png; returns the row shown in normals.png."""
    reference = outputs[-1]["rows"]  # per scene: context views | a prediction | ground truth
    comparison = [[*row[:-2], row[-1], *(o["rows"][i][-2] for o in outputs)] for i, row in enumerate(reference)]
    labels = [
        *(f"context view {v + 1}" for v in range(len(reference[0]) - 2)),
        "ground truth",
        *(r["name"] for r in results),
    ]
    save_comparison(comparison, labels, out / "comparison.png")
    save_results_bar(results, out / "results_bar.png", title=f"demo: {steps} steps, {EVAL_SCENES} held-out scenes")
    shown = next((o for o in outputs if o["normals"] is not None), None)
    if shown is None:
        return None
    save_image_grid(shown["normals"], out / "normals.png")
    return shown["result"]["name"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hrope.nvs.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per model")
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"rows trained at the same time (default: one per CPU core, at most {len(DEMO_MODELS)})",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    jobs = min(args.jobs or default_jobs(), len(DEMO_MODELS))
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    start = time.perf_counter()
    # every run has the same data config: render the training and held-out scenes once, here
    first = demo_config(DEMO_MODELS[0], out, args.steps)
    scenes = tuple(
        [dataset[i] for i in range(len(dataset))]
        for dataset in (build_dataset(first, split) for split in ("train", "eval"))
    )
    print(
        f"rendered {len(scenes[0])} training and {len(scenes[1])} held-out scenes "
        f"({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    outputs = _run_rows(out, args.steps, scenes, jobs, start)
    results = [o["result"] for o in outputs]
    elapsed = time.perf_counter() - start
    normals_of = _figures(out, outputs, results, args.steps)
    code = code_provenance(Path(__file__))
    text = _report(args.steps, elapsed, outputs[0]["device"], results, normals_of, jobs, code)
    write_text(out / "results.md", text)
    summary = {"steps": args.steps, "seconds": elapsed, "jobs": jobs, "provenance": code, "results": results}
    write_json(out / "results.json", summary)
    print(text)


if __name__ == "__main__":
    main()
