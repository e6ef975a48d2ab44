"""The ``hrope`` command.

    hrope train CONFIG [--encoding NAME] [--steps N] [--out DIR] [--section.key VALUE ...]
    hrope eval CHECKPOINT [--out DIR] [--num-scenes N] [--device cpu|cuda] [--lpips-weights FILE]
    hrope viz planes CHECKPOINT [--out DIR] [--num-scenes N] [--layer L]

CHECKPOINT is a ``checkpoint.safetensors`` file or the run folder holding it. Configuration
errors and missing files end with a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

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
    evaluate.add_argument("checkpoint")
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


def run(argv: list[str]) -> int:
    from .evaluate import evaluate
    from .model import ModelError, count_parameters
    from .predictors import PredictorError
    from .train import CheckpointError, train
    from .viz import VizError, visualize_planes

    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command != "train" and extra:
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
            results = evaluate(args.checkpoint, args.out, num_scenes=args.num_scenes, device=args.device,
                               lpips_weights=args.lpips_weights)
            print(" ".join(f"{k}={v:.4f}" if not isinstance(v, str) else f"{k}={v}"
                           for k, v in results["metrics"].items()))
        else:
            path = visualize_planes(args.checkpoint, args.out, args.num_scenes, args.layer, args.device)
            print(f"wrote {path}")
    except (ConfigError, ModelError, PredictorError, CheckpointError, VizError, FileNotFoundError) as error:
        print(f"hrope {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
