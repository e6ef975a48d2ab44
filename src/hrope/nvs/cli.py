"""The ``hrope`` command.

    hrope train CONFIG [--encoding NAME] [--steps N] [--out DIR] [--section.key VALUE ...]
    hrope eval CHECKPOINT [--out DIR] [--num-scenes N] [--device auto|cpu|cuda] [--lpips-weights FILE]
               [--data.key VALUE ...]
    hrope eval CHECKPOINT [CHECKPOINT ...] --protocol standard|views|zoom|extrapolate|baseline
               [--factors F ...] [--zoom-all] [--out DIR] [same options as above]
    hrope viz planes CHECKPOINT [--out DIR] [--num-scenes N] [--layer L] [--head H] [--device auto|cpu|cuda]
    hrope viz plane-accuracy RUN [--out DIR]
    hrope viz 3d RUN_OR_CAPTURE [--port P] [--export FILE.html] [--colour normal|error] [--scene N] [--layer L]
               [--views I,J,...] [--image-size S] [--patch-size P] [--depth none|points|maps] [--device D]
    hrope viz attention RUN [RUN ...] --query X,Y [--out DIR] [--scene N] [--head H] [--device auto|cpu|cuda]
    hrope config [CONFIG] [--section.key VALUE ...]
    hrope export CHECKPOINT FOLDER [--overwrite]
    hrope info [CAPTURE] [--json]
    hrope --version

CHECKPOINT is a ``checkpoint.safetensors`` file or the run folder holding it; ``eval`` and ``viz planes``
also take a saved model folder (``export`` writes one, :mod:`hrope.nvs.pretrained`). ``--data.key VALUE``
overrides the run's data config (e.g. ``--data.kind re10k --data.root DIR --data.eval_index FILE``).
Overrides go after the CONFIG/CHECKPOINT argument (``--key VALUE`` before it is an error). Without
``--protocol``, ``eval`` scores the run's own held-out split; with it, all checkpoints go into one
table/plot (``--out`` is required for several). ``config`` prints the resolved config (the defaults
without CONFIG) with each key's doc.

Errors: every user error (a :class:`hrope.InputError`: a bad option, config value, file contents, a
write the file system refused; or a missing / unreadable user-given path) ends with one line
``hrope <command>: error: ...`` on stderr and exit status 2, before any work where it can be
checked up front (config values, the device, an ``--out`` that is an existing file). Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path

from ..about import environment, report, version_line
from ..errors import InputError
from .running.atomic import StorageError
from .running.checkpoints import run_folder
from .config import (
    SHORTCUTS,
    ConfigError,
    Field,
    apply_overrides,
    check_device,
    load_config,
    one_line,
    parse_overrides,
    parse_value,
    resolve,
)
from .config_docs import describe_config
from .data.real.summary import capture_summary, summary_report
from .evaluation.evaluate import evaluate
from .model import count_parameters
from .pretrained import export_run
from .evaluation.protocol_report import write_results
from .evaluation.protocols import run_protocol
from .running.train import train
from .viz.figures import plot_plane_accuracy, visualize_planes

__all__ = ["main", "run", "USER_ERRORS"]

# what the command reports as one line with exit status 2: bad input, and user-given paths
USER_ERRORS = (InputError, FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError)


CHECKPOINT_HELP = "checkpoint.safetensors file, the run folder holding it, or a saved model folder (hrope export)"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one-line :class:`ConfigError` s (printed by :func:`run`)."""

    def error(self, message: str):
        raise ConfigError(f"{message} (see {self.prog} --help)")


def _option(field: Field):
    """An argparse ``type``: the text parsed like an override value and checked by ``field``."""

    def convert(text: str):
        value = parse_value(text)
        if not field.accepts(value):
            raise argparse.ArgumentTypeError(f"must be {field.describe()}, got {text!r}")
        return value

    return convert


def _check_out(path, key: str) -> None:
    """A :class:`ConfigError` naming ``key`` when the output folder ``path`` (or a folder above it)
    is an existing file; called before any work starts."""
    if path is None:
        return
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            if not folder.is_dir():
                raise ConfigError(f"{key} {str(path)!r}: {str(folder)!r} is an existing file, not a folder")
            return


def _add_train(commands) -> None:
    """``hrope train CONFIG [overrides]``."""
    train = commands.add_parser(
        "train",
        help="train a model (overrides: --section.key value)",
        epilog="overrides: --section.key VALUE or --section.key=VALUE (sections model, data, train, eval; "
        "see configs/tiny.yaml), after CONFIG; shortcuts: " + ", ".join("--" + s for s in SHORTCUTS),
    )
    train.add_argument("config", help="YAML config file (e.g. configs/tiny.yaml)")


def _add_eval(commands) -> None:
    """``hrope eval CHECKPOINT [CHECKPOINT ...] [options] [--data.key VALUE ...]``."""
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a checkpoint on held-out scenes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="without --protocol: scores the run's own held-out split (the data and eval sections\n"
        "of its config.yaml) and writes <run>/eval.\n"
        "overrides of the run's data section: --data.KEY VALUE or --data.KEY=VALUE, placed\n"
        "after the CHECKPOINT arguments, e.g.\n"
        "  hrope eval runs/x --data.kind folder --data.root DIR --data.eval_root null",
    )
    evaluate.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=CHECKPOINT_HELP)
    evaluate.add_argument(
        "--protocol",
        default=None,
        help="standard | views | zoom | extrapolate | baseline (default: none, the run's own held-out split)",
    )
    evaluate.add_argument(
        "--factors",
        type=_option(Field("float")),
        nargs="+",
        default=None,
        help="the protocol's axis values (default per protocol: views 2 4 8; zoom 1 2 3 4 5; "
        "extrapolate 0.25 0.5 1; baseline 1 1.5 2 3)",
    )
    evaluate.add_argument(
        "--zoom-all", action="store_true", help="zoom protocol: zoom the context views too (default: targets only)"
    )
    evaluate.add_argument(
        "--out",
        default=None,
        help="output folder (default: <run>/eval, or <run>/eval/<protocol>; required for several checkpoints)",
    )
    evaluate.add_argument(
        "--num-scenes",
        type=_option(Field("int", low=1)),
        default=None,
        help="held-out scenes to score (default: the run's eval.num_scenes)",
    )
    evaluate.add_argument(
        "--split",
        choices=("eval", "val"),
        default=None,
        help="without --protocol: the test scenes (eval) or the validation scenes (val: synthetic kinds and "
        "captures; written to <run>/eval/val) (default: the run's eval.split)",
    )
    evaluate.add_argument("--device", default="cpu", help="auto | cpu | cuda (default: cpu)")
    evaluate.add_argument(
        "--lpips-weights",
        default=None,
        help="local LPIPS weights file of the run's eval.lpips_net backbone (default: the run's eval.lpips_weights; "
        "none = LPIPS unavailable)",
    )


def _add_viz(commands) -> None:
    """``hrope viz planes CHECKPOINT`` and ``hrope viz plane-accuracy RUN``."""
    viz = commands.add_parser("viz", help="figures")
    viz_commands = viz.add_subparsers(dest="figure", required=True)
    planes = viz_commands.add_parser(
        "planes", help="predicted plane normals, vs ground truth when the data has it (plane encodings)"
    )
    planes.add_argument("checkpoint", help=CHECKPOINT_HELP)
    planes.add_argument("--out", default=None, help="output folder for planes.png (default: <run>/viz)")
    planes.add_argument(
        "--num-scenes",
        type=_option(Field("int", low=1)),
        default=4,
        help="held-out scenes, one row per context view (default: 4)",
    )
    planes.add_argument("--layer", type=int, default=-1, help="layer whose planes are shown (default: -1, the last)")
    planes.add_argument(
        "--head",
        type=int,
        default=0,
        help="attention head whose planes are shown, for predictor_options.per_head (default: 0)",
    )
    planes.add_argument("--device", default="cpu", help="auto | cpu | cuda (default: cpu)")
    accuracy = viz_commands.add_parser(
        "plane-accuracy", help="accuracy of predicted planes over training steps (plane_accuracy.jsonl)"
    )
    accuracy.add_argument("run", help="run folder (or its checkpoint.safetensors)")
    accuracy.add_argument("--out", default=None, help="output folder for plane_accuracy.png (default: <run>/viz)")
    _add_viz_3d(viz_commands)
    _add_viz_attention(viz_commands)


def _add_viz_3d(viz_commands) -> None:
    """``hrope viz 3d RUN_OR_CAPTURE``: the viser viewer (the viz3d extra)."""
    view = viz_commands.add_parser(
        "3d", help="3D viewer (viser, on 127.0.0.1): cameras with their images, per-patch planes as quads"
    )
    view.add_argument("source", metavar="RUN_OR_CAPTURE", help="run folder / checkpoint, or a scene folder (capture)")
    view.add_argument(
        "--port", type=_option(Field("int", low=1)), default=8080, help="port on 127.0.0.1 (default: 8080)"
    )
    view.add_argument(
        "--export", default=None, help="write a self-contained HTML snapshot to this *.html file and exit"
    )
    view.add_argument(
        "--colour", default="normal", help="normal | error (angle to the ground-truth normal; default: normal)"
    )
    view.add_argument("--scene", type=_option(Field("int", low=0)), default=0, help="run: held-out scene (default: 0)")
    view.add_argument("--layer", type=int, default=-1, help="run: layer whose planes are shown (default: -1, the last)")
    view.add_argument("--views", default=None, help="capture: views I,J,... the last is the target (default: 0,1,2)")
    view.add_argument("--image-size", type=_option(Field("int", low=1)), default=128, help="capture (default: 128)")
    view.add_argument("--patch-size", type=_option(Field("int", low=1)), default=8, help="capture (default: 8)")
    view.add_argument(
        "--depth", default="none", help="capture: none | points (COLMAP) | maps (transforms.json; default: none)"
    )
    view.add_argument("--device", default="cpu", help="auto | cpu | cuda (default: cpu)")


def _add_viz_attention(viz_commands) -> None:
    """``hrope viz attention RUN [RUN ...] --query X,Y``."""
    probe = viz_commands.add_parser(
        "attention", help="one target patch's attention over the context views, per layer, runs side by side"
    )
    probe.add_argument("runs", nargs="+", metavar="RUN", help="run folders or checkpoints (same image and patch size)")
    probe.add_argument("--query", required=True, help="the target patch X,Y (column, row on the patch grid)")
    probe.add_argument("--out", default=None, help="output folder for attention.png (default: <first run>/viz)")
    probe.add_argument("--scene", type=_option(Field("int", low=0)), default=0, help="held-out scene (default: 0)")
    probe.add_argument("--head", type=int, default=None, help="one attention head (default: the mean over heads)")
    probe.add_argument("--device", default="cpu", help="auto | cpu | cuda (default: cpu)")


def run_viz_3d(args) -> None:
    """Serve the viewer, or write its snapshot with ``--export``."""
    from .viz.viewer3d import export_html, load_scene3d, show

    device = str(check_device(args.device, "--device"))
    views = None if args.views is None else _integers(args.views, "--views")
    scene = load_scene3d(
        args.source,
        scene=args.scene,
        layer=args.layer,
        colour=args.colour,
        device=device,
        views=views,
        image_size=args.image_size,
        patch_size=args.patch_size,
        depth=args.depth,
    )
    if args.export is not None:
        print(f"wrote {export_html(scene, args.export)}")
    else:
        show(scene, args.port)


def _integers(text: str, key: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.lstrip("-").isdigit() for p in parts):
        raise ConfigError(f"{key} must be comma-separated integers, got {text!r}")
    return [int(p) for p in parts]


def run_viz_attention(args) -> None:
    from .viz.attention import parse_query, visualize_attention

    _check_out(args.out, "--out")
    device = str(check_device(args.device, "--device"))
    path = visualize_attention(args.runs, parse_query(args.query), args.out, args.scene, args.head, device)
    print(f"wrote {path}")


def _add_config(commands) -> None:
    """``hrope config [CONFIG] [overrides]`` (its arguments are parsed by :func:`run_config`)."""
    commands.add_parser(
        "config",
        usage="hrope config [-h] [CONFIG] [--section.key VALUE ...]",
        help="print the resolved config with each key's doc (docs/config.md lists every setting)",
        description="CONFIG: a YAML config file (default: the defaults); overrides as for train",
    )


def _add_export(commands) -> None:
    """``hrope export CHECKPOINT FOLDER [--overwrite]``."""
    export = commands.add_parser(
        "export",
        help="write a run's model as a saved model folder (config.json, model.safetensors, README.md model card)",
    )
    export.add_argument("checkpoint", help="checkpoint.safetensors file or the run folder holding it")
    export.add_argument("folder", help="the saved model folder to write (hrope eval / viz accept it)")
    export.add_argument("--overwrite", action="store_true", help="replace a saved model already in FOLDER")


def _add_info(commands) -> None:
    """``hrope info [CAPTURE] [--json]``."""
    info = commands.add_parser(
        "info",
        help="versions, torch build, CUDA / Triton, encodings and transform backends (for bug reports); with "
        "CAPTURE, what the loaders read from that scene folder",
    )
    info.add_argument("capture", nargs="?", help="a scene folder (or transforms.json) to summarise")
    info.add_argument("--json", action="store_true", help="print the facts as JSON")


def _parser() -> argparse.ArgumentParser:
    """The ``hrope`` parser: one sub-command per ``_add_*`` builder."""
    parser = _Parser(prog="hrope", description="HRoPE / LVSM novel view synthesis")
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_eval, _add_viz, _add_config, _add_export, _add_info):
        add(commands)
    return parser


def _check_override_order(argv: list[str], args, extra: list[str]) -> None:
    """Raise a clear error when an override stands before the CONFIG/CHECKPOINT argument
    (``eval --data.kind folder RUN``: argparse would take ``folder`` as the checkpoint)."""
    name, positional = ("config", args.config) if args.command == "train" else ("checkpoint", args.checkpoints[0])
    start = argv.index(args.command) + 1
    index = argv.index(positional, start)
    option = argv[index - 1]
    if index > start and option in extra and option.startswith("--") and "=" not in option:
        raise ConfigError(
            f"{option} comes before the {name} path; put overrides after it "
            f"(hrope {args.command} {name.upper()} {option} VALUE)"
        )


def _data_overrides(extra: list[str]) -> dict:
    """``--data.key VALUE`` options as ``{key: value}`` (anything else is an error)."""
    updates = parse_overrides(extra)
    if set(updates) - {"data"}:
        raise ConfigError(f"hrope eval accepts --data.key overrides only, got {' '.join(extra)}")
    return updates.get("data", {})


def _metrics_line(metrics: dict) -> str:
    return " ".join(f"{k}={v:.4f}" if not isinstance(v, str) else f"{k}={v}" for k, v in metrics.items())


def run_eval(args, extra: list[str]) -> None:
    data = _data_overrides(extra)
    _check_out(args.out, "--out")
    device = str(check_device(args.device, "--device"))
    if args.protocol is None:
        if len(args.checkpoints) > 1 or args.factors or args.zoom_all:
            raise ConfigError("several checkpoints, --factors and --zoom-all need --protocol")
        out = args.out
        if out is None and args.split == "val":
            out = run_folder(args.checkpoints[0]) / "eval" / "val"
        evaluation = evaluate(
            args.checkpoints[0],
            out,
            num_scenes=args.num_scenes,
            device=device,
            lpips_weights=args.lpips_weights,
            data=data,
            split=args.split,
        )
        print(_metrics_line(evaluation["metrics"]))
        return
    if args.split is not None:
        raise ConfigError("--split chooses the run's own held-out scenes; a --protocol makes its own")
    if args.out is None and len(args.checkpoints) > 1:
        raise ConfigError("--out DIR is required when evaluating several checkpoints")
    options = {"factors": args.factors} if args.factors else {}
    if args.zoom_all:
        options["zoom_all"] = True
    results = [
        run_protocol(
            path,
            args.protocol,
            data,
            num_scenes=args.num_scenes,
            device=device,
            lpips_weights=args.lpips_weights,
            **options,
        )
        for path in args.checkpoints
    ]
    out = Path(args.out) if args.out else run_folder(args.checkpoints[0]) / "eval" / args.protocol
    write_results(results, out)
    for r in results:
        for point in r["points"]:
            print(f"{r['name']} {args.protocol}={point['value']:g}: {_metrics_line(point['metrics'])}")
    print(f"wrote {out}")


def run_config(extra: list[str]) -> None:
    """Print the config of ``[CONFIG] [overrides]`` (checked, the model section too) with its docs."""
    path, overrides = (extra[0], extra[1:]) if extra and not extra[0].startswith("--") else (None, extra)
    config = apply_overrides(load_config(path) if path else resolve(), overrides)
    print(describe_config(config), end="")


def run(argv: list[str]) -> int:
    """Run the ``hrope`` command line ``argv``; returns the exit status (module doc: errors)."""
    command = "hrope"
    try:
        args, extra = _parser().parse_known_args(argv)
        command = f"hrope {args.command}"
        if args.command in ("viz", "export", "info") and extra:
            where = f"viz {args.figure}" if args.command == "viz" else args.command
            raise ConfigError(f"unrecognized arguments: {' '.join(extra)} (see hrope {where} --help)")
        if args.command in ("train", "eval"):
            _check_override_order(argv, args, extra)
        if args.command == "train":
            config = apply_overrides(load_config(args.config), extra)
            check_device(config.train.device, "train.device")
            _check_out(config.train.out, "train.out")
            result = train(config)
            counts = count_parameters(result.model)
            if os.environ.get("RANK", "0") == "0":  # torchrun: report once
                print(
                    f"trained {result.step} steps ({result.skipped_steps} skipped), last loss "
                    f"{result.last_loss:.5f}, {counts['total']:,} parameters; outputs in {result.out}"
                )
        elif args.command == "eval":
            run_eval(args, extra)
        elif args.command == "config":
            run_config(extra)
        elif args.command == "export":
            print(f"wrote {export_run(args.checkpoint, args.folder, overwrite=args.overwrite)}")
        elif args.command == "info" and args.capture:
            facts = capture_summary(args.capture)
            print(json.dumps(facts, indent=2) if args.json else summary_report(facts).rstrip("\n"))
        elif args.command == "info":
            print(json.dumps(environment(), indent=2) if args.json else report().rstrip("\n"))
        elif args.figure == "3d":
            run_viz_3d(args)
        elif args.figure == "attention":
            run_viz_attention(args)
        elif args.figure == "plane-accuracy":
            _check_out(args.out, "--out")
            print(f"wrote {plot_plane_accuracy(args.run, args.out)}")
        else:
            _check_out(args.out, "--out")
            device = str(check_device(args.device, "--device"))
            path = visualize_planes(args.checkpoint, args.out, args.num_scenes, args.layer, device, args.head)
            print(f"wrote {path}")
    except USER_ERRORS as error:
        if isinstance(error, StorageError) and error.then is None:  # what to run once the disk has room
            error = error.keeping(error.kept, f"run `{shlex.join(['hrope', *argv])}` again")
        # one write, newline included: torchrun ranks share stderr, and a rank stopped by torchrun
        # between print's two writes would glue its line to the next rank's
        sys.stderr.write(f"{command}: error: {one_line(error)}\n")
        sys.stderr.flush()
        return 2
    return 0


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
