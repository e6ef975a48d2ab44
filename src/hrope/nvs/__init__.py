"""The novel-view-synthesis toolkit on top of the encoding library (``pip install 'hrope[nvs]'``).

Modules, each importing only the ones listed before it (and the library, :mod:`hrope`):
``atomic`` (files written whole), ``folder_lock`` (one process per run folder), ``config`` (run configs),
``metrics``, ``data`` (scenes, synthetic generator, real-data loaders),
``plane_fitting`` (per-patch planes fitted to depth), ``sources`` (per-patch parameter sources),
``model`` (LVSM), ``build_data`` (the datasets of a run config), ``checkpoints``, ``pretrained``
(saved model folders), ``distributed``,
``train_step`` (one training step), ``train`` (the loop),
``evaluate``, ``viz``, ``protocols``, ``demo``, ``cli``.

Importing this package imports none of them, so ``hrope`` (the command, :func:`main`) can say what
to install when the toolkit's dependencies are missing.
"""

from __future__ import annotations

import importlib.util
import sys

from ..about import report, version_line

__all__ = ["REQUIREMENTS", "missing_requirements", "main"]

# import name -> distribution name of every third-party package the toolkit imports
REQUIREMENTS = {
    "yaml": "pyyaml",
    "safetensors": "safetensors",
    "tqdm": "tqdm",
    "PIL": "pillow",
    "matplotlib": "matplotlib",
    "skimage": "scikit-image",
    "kornia": "kornia",
    "tensorboard": "tensorboard",
}


def missing_requirements() -> list[str]:
    """Distribution names of the toolkit's dependencies that are not installed."""
    return [dist for module, dist in REQUIREMENTS.items() if importlib.util.find_spec(module) is None]


# the commands that need the library alone: they run without the toolkit's dependencies
LIBRARY_COMMANDS = (["--version"], ["info"])


def main(argv: list[str] | None = None) -> None:
    """The ``hrope`` command: a one-line error (exit 2) when the toolkit is not installed, except
    for ``hrope --version`` and ``hrope info`` (which then also name what is missing)."""
    args = sys.argv[1:] if argv is None else list(argv)
    missing = missing_requirements()
    if missing and args in LIBRARY_COMMANDS:
        print(version_line() if args == ["--version"] else report() + f"NVS toolkit: missing {', '.join(missing)}")
        sys.exit(0)
    if missing:
        print(
            f"hrope: the NVS toolkit needs {', '.join(missing)}; install it with: pip install 'hrope[nvs]'",
            file=sys.stderr,
        )
        sys.exit(2)
    from .cli import main as cli_main

    cli_main(args)
