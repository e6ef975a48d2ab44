"""The ``hrope`` command.

    hrope train CONFIG [--encoding NAME] [--steps N] [--out DIR] [--section.key VALUE ...]
    hrope eval CHECKPOINT [--out DIR] [--num-scenes N] [--device cpu|cuda] [--lpips-weights FILE]
               [--data.key VALUE ...]
    hrope eval CHECKPOINT [CHECKPOINT ...] --protocol standard|views|zoom|extrapolate|baseline
               [--factors F ...] [--zoom-all] [--out DIR] [same options as above]
    hrope viz planes CHECKPOINT [--out DIR] [--num-scenes N] [--layer L]

CHECKPOINT is a ``checkpoint.safetensors`` file or the run folder holding it. ``--data.key VALUE``
overrides the run's data config (e.g. ``--data.kind re10k --data.root DIR --data.eval_index FILE``).
With ``--protocol`` all checkpoints go into one table/plot (``--out`` is required for several).
Configuration errors and missing files end with a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .config import SHORTCUTS, ConfigError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hrope", description="HRoPE / LVSM novel view synthesis")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train", help="train a model (overrides: --section.key value)",
        epilog="overrides: --section.key VALUE or --section.key=VALUE (sections model, data, train, eval; "
               "see configs/tiny.yaml); shortcuts: " + ", ".join("--" + s for s in SHORTCUTS),
    )
    train.add_argument("config", help="YAML config file (e.g. configs/tiny.yaml)")
    evaluate = commands.add_parser("eval", help="evaluate a checkpoint on held-out scenes")
    evaluate.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT")
    evaluate.add_argument("--protocol", default=None, help="standard | views | zoom | extrapolate | baseline")
    evaluate.add_argument("--factors", type=float, nargs="+", default=None,
                          help="the protocol's axis values (views: 2 4 8; zoom: 1 2 3 4 5; ...)")
    evaluate.add_argument("--zoom-all", action="store_true", help="zoom protocol: zoom the context views too")
    evaluate.add_argument("--out", default=None)
    evaluate.add_argument("--num-scenes", type=int, default=None)
    evaluate.add_argument("--device", default="cpu")
    evaluate.add_argument("--lpips-weights", default=None, help="local LPIPS (AlexNet) safetensors file")
    viz = commands.add_parser("viz", help="figures")
    viz_commands = viz.add_subparsers(dest="figure", required=True)
    planes = viz_commands.add_parser("planes", help="predicted plane normals vs ground truth")
    planes.add_argument("checkpoint")
    planes.add_argument("--out", default=None)
    planes.add_argument("--num-scenes", type=int, default=4)
    planes.add_argument("--layer", type=int, default=-1)
    planes.add_argument("--device", default="cpu")
    return parser


def _data_overrides(extra: list[str]) -> dict:
    """``--data.key VALUE`` options as ``{key: value}`` (anything else is an error)."""
    from .config import parse_overrides

    updates = parse_overrides(extra)
    if set(updates) - {"data"}:
        raise ConfigError(f"hrope eval accepts --data.key overrides only, got {' '.join(extra)}")
    return updates.get("data", {})


def _metrics_line(metrics: dict) -> str:
    return " ".join(f"{k}={v:.4f}" if not isinstance(v, str) else f"{k}={v}" for k, v in metrics.items())


def run_eval(args, extra: list[str]) -> None:
    from .evaluate import evaluate
    from .protocols import run_protocol, write_results
    from .train import run_folder

    data = _data_overrides(extra)
    if args.protocol is None:
        if len(args.checkpoints) > 1 or args.factors or args.zoom_all:
            raise ConfigError("several checkpoints, --factors and --zoom-all need --protocol")
        results = evaluate(args.checkpoints[0], args.out, num_scenes=args.num_scenes, device=args.device,
                           lpips_weights=args.lpips_weights, data=data)
        print(_metrics_line(results["metrics"]))
        return
    if args.out is None and len(args.checkpoints) > 1:
        raise ConfigError("--out DIR is required when evaluating several checkpoints")
    options = {"factors": args.factors} if args.factors else {}
    if args.zoom_all:
        options["zoom_all"] = True
    results = [run_protocol(path, args.protocol, data, num_scenes=args.num_scenes, device=args.device,
                            lpips_weights=args.lpips_weights, **options) for path in args.checkpoints]
    out = Path(args.out) if args.out else run_folder(args.checkpoints[0]) / "eval" / args.protocol
    write_results(results, out)
    for r in results:
        for point in r["points"]:
            print(f"{r['name']} {args.protocol}={point['value']:g}: {_metrics_line(point['metrics'])}")
    print(f"wrote {out}")


def run(argv: list[str]) -> int:
    from .data.scene import SceneError
    from .metrics import MetricError
    from .model import ModelError, count_parameters
    from .predictors import PredictorError
    from .train import CheckpointError, train
    from .viz import VizError, visualize_planes

    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "viz" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "train":
            from .config import apply_overrides, load_config

            config = apply_overrides(load_config(args.config), extra)
            result = train(config)
            counts = count_parameters(result.model)
            if os.environ.get("RANK", "0") == "0":  # torchrun: report once
                print(f"trained {result.step} steps ({result.skipped_steps} skipped), last loss "
                      f"{result.last_loss:.5f}, {counts['total']:,} parameters; outputs in {result.out}")
        elif args.command == "eval":
            run_eval(args, extra)
        else:
            path = visualize_planes(args.checkpoint, args.out, args.num_scenes, args.layer, args.device)
            print(f"wrote {path}")
    except (ConfigError, ModelError, PredictorError, CheckpointError, VizError, SceneError, MetricError,
            FileNotFoundError) as error:
        print(f"hrope {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
