"""SfM points of real captures from their training views: points, reprojection error, track length, time.

For each capture (a folder the loaders read), the training views of the held-out-views split
(view ``i`` is a test target when ``i % t == 0``, a validation target when ``i % t == t // 2``, a
training view otherwise; ``t`` is 8, or the number after the folder, ``scan24:4``) are triangulated
with :func:`hrope.nvs.data.real.sfm.triangulate` (default settings unless ``--neighbours``), cached
in ``--cache``. Writes ``--out`` (JSON: the command, the settings, pycolmap's version, and per
capture the split's ``test_every``, the training views and the stats; ``seconds`` is the time of
the triangulation, also when it was read back from the cache).

    python benchmarks/sfm_stats.py CAPTURE[:T] [CAPTURE[:T] ...] --cache DIR [--out FILE] [--neighbours K]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from dataclasses import asdict
from pathlib import Path

from hrope.nvs.data.real.loaders import scene_frames
from hrope.nvs.data.real.sfm import SfmSettings, triangulate
from hrope.nvs.data.real.view_splits import split_views
from hrope.nvs.running.atomic import write_json
from hrope.nvs.running.provenance import provenance

OUT = Path(__file__).resolve().parent / "results" / "real_captures" / "sfm_stats.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="+", help="capture folders, each optionally :T (test_every, default 8)")
    parser.add_argument("--cache", required=True, help="the SfM cache folder")
    parser.add_argument("--out", default=str(OUT), help="the JSON to write")
    parser.add_argument(
        "--neighbours", type=int, default=SfmSettings.neighbours, help="nearest views matched; 0: every pair"
    )
    args = parser.parse_args(argv)
    settings = SfmSettings(neighbours=args.neighbours)
    rows = {}
    for item in args.captures:
        folder, _, every = item.rpartition(":") if item.rpartition(":")[2].isdecimal() else (item, "", "8")
        views = split_views(len(scene_frames(folder)), int(every))["train"]
        points = triangulate(folder, views, cache_dir=args.cache, settings=settings)
        rows[Path(folder).name] = {"test_every": int(every), "training_views": views, **points.stats}
        print(Path(folder).name, points.stats, flush=True)
    command = "python benchmarks/sfm_stats.py " + " ".join(
        [os.path.basename(item) if os.path.isabs(item) else item for item in args.captures] + ["--cache", "CACHE"]
    )
    record = {
        "command": command + (f" --neighbours {args.neighbours}" if args.neighbours != SfmSettings.neighbours else ""),
        "settings": asdict(settings),
        "pycolmap": importlib.metadata.version("pycolmap"),
        "cpu_count": os.cpu_count(),
        "provenance": provenance(),
        "captures": rows,
    }
    write_json(args.out, record)


if __name__ == "__main__":
    main(sys.argv[1:])
