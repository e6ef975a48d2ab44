"""Folded attention modules (hrope.nn) against RoPE and plain SDPA, and what they do to training.

    python benchmarks/folded_attention.py [--reps 9] [--rounds 5] [--threads 2] [--train-threads 1]
    python benchmarks/folded_attention.py --device cuda --dtype bfloat16 --sdpa-backend flash --parts modules

``--malloc-cache`` reruns the process with glibc keeping freed memory (attention_overhead.py's
``--malloc-cache``: no page faults on fresh outputs; results ``..._malloc_cache``). ``--device
cuda`` synchronises the GPU around every timed call; ``--dtype`` is the modules' and
tokens' dtype (training stays float32); ``--sdpa-backend`` restricts SDPA (attention_overhead.py's).

Four parts, each measured in one run with interleaved repetitions (ratios are medians over
repetitions of the ratio measured within a repetition):

* ``modules``: one attention layer ``(B=1, L=V*grid^2, dim=heads*head_dim) -> same``, default
  2 views x 32x32 patches, 8 heads of 64: a plain module (Linear, SDPA, Linear), and
  :class:`hrope.nn.MultiviewAttention` with ``rope2d`` (``fold=True``: its RoPE rotated in place
  in float32 and float64) and with ``prope``, ``gta`` and ``hrope-lift`` (planes as
  attention_overhead.py draws them) both ``folded`` (``fold=True``) and ``unfolded``
  (``fold=False``, the modules' default: the per-call transforms inside the module), all with the
  same weights; each call computes the module's factors (one layer of a model). Forward (no grad)
  and forward+backward (gradients to x and the weights).
* ``passes``: forward (no grad) milliseconds of each pass of the ``rope2d`` and ``prope`` modules
  beside the plain module's (same weights and shape as ``modules``): the factors, the q, k, v
  projection (prope's with its per-view factor folded in), the in-place RoPE of q, k and v, SDPA,
  and the output side (RoPE of the output, then the output projection, prope's folded): which
  pass costs what, without the noise of timing whole layers.
* ``per_call``: benchmarks/attention_overhead.py's rows (imported) for ``prope``, ``hrope-lift``
  and the official PRoPE algorithm (``prope-einsum``), per call and prepared once, vs SDPA.
* ``training``: steps/s of the ``tiny`` preset (benchmarks/train_throughput.py's step, imported)
  for ``none``, ``rope2d``, ``prope``, ``hrope-lift`` (learned planes) with ``model.folded_attention``
  off and on, ratios to ``none`` (off).

Writes ``folded_attention[_<device>][_<dtype>][_<tag>].{json,md}`` in ``--out`` (default
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import attention_overhead
import hrope
from hrope.encodings import PRECISIONS
import hrope.nn
from hrope.nn.rotary import rotate_
from hrope.nvs.running.atomic import write_json, write_text
from hrope.nvs.data.batch import collate_scenes
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.running.provenance import describe, provenance
from train_throughput import BATCH_SIZE, step_function

RESULTS = Path(__file__).resolve().parent / "results"
MODULE_ENCODINGS = ("rope2d", "prope", "gta", "hrope-lift")
PER_CALL = ["prope", "hrope-lift", attention_overhead.PEER]
TRAINING = [("none", False), ("none", True), ("rope2d", False), ("rope2d", True), ("prope", False), ("prope", True)]
TRAINING += [("hrope-lift", False), ("hrope-lift", True)]


class PlainAttention(nn.Module):
    """Linear -> SDPA -> Linear (the baseline module); ``qkv`` and ``out`` as MultiviewAttention's."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out(out.transpose(1, 2).reshape(B, L, D))


def module_rows(args: argparse.Namespace) -> tuple[dict[str, Callable], torch.Tensor]:
    """Every module row as a function of x, and x ``(1, L, dim)``; same weights everywhere."""
    gen = torch.Generator().manual_seed(0)
    grid = (args.grid, args.grid)
    cameras = attention_overhead.make_cameras(1, args.views, (8 * args.grid, 8 * args.grid), gen)
    cameras = cameras.to(device=args.device)
    dim = args.heads * args.head_dim
    x = torch.randn(1, args.views * args.grid**2, dim, generator=gen).to(args.device, getattr(torch, args.dtype))
    torch.manual_seed(0)
    plain = PlainAttention(dim, args.heads).to(args.device, x.dtype)
    rows: dict[str, Callable] = {"plain": plain}
    for name in MODULE_ENCODINGS:
        geometry = attention_overhead.example_inputs(name, cameras, grid, gen)
        folds = hrope.get_encoding(name).per_view is not None
        variants = {f"{name} folded": True, f"{name} unfolded": False} if folds else {name: True}
        for row, fold in variants.items():
            encoding = hrope.get_encoding(name).use_precision(args.precision)
            module = hrope.nn.MultiviewAttention(dim, args.heads, encoding, fold=fold).to(args.device, x.dtype)
            module.load_state_dict(plain.state_dict())
            rows[row] = lambda x, m=module, g=geometry: m(x, cameras, grid, **g)
    return rows, x


def synchronize() -> None:
    """Wait for the GPU (when CUDA is in use), so that a timed call includes its kernels."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``run()`` (the GPU synchronised before and after). The
    CPU time of a 1-thread CPU run is the steadier measure on a shared machine (it does not count
    time spent waiting for a core); on a GPU only the wall-clock time means anything."""
    synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_call(fn: Callable, x: torch.Tensor, backward: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one call (forward under no_grad, or forward + backward of the output's sum)."""

    def run() -> None:
        if backward:
            fn(x.detach().requires_grad_()).sum().backward()
        else:
            with torch.no_grad():
                fn(x)

    return timed(run)


def interleaved(rows: dict[str, Callable[[], tuple[float, float]]], reps: int, bases: tuple[str, ...]) -> dict:
    """``reps`` rounds of every row (after one warm-up each). For wall (``ms``, ``ratio_to_<base>``)
    and CPU time (``cpu_ms``, ``cpu_ratio_to_<base>``): every row's median milliseconds and, per base
    row, the median over rounds of the row's time / the base's time in the same round, with the
    quartiles of those per-round ratios (``..._quartiles_to_<base>``: how much the machine moved)."""
    for run in rows.values():
        run()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    for _ in range(reps):
        for name, run in rows.items():
            times[name].append(run())
    out: dict = {"seconds_per_repetition": times}
    for index, prefix in ((0, ""), (1, "cpu_")):
        series = {n: [t[index] for t in ts] for n, ts in times.items()}
        out[f"{prefix}ms"] = {n: 1e3 * statistics.median(t) for n, t in series.items()}
        for base in bases:
            ratios = {n: [a / b for a, b in zip(t, series[base], strict=True)] for n, t in series.items()}
            out[f"{prefix}ratio_to_{base}"] = {n: statistics.median(r) for n, r in ratios.items()}
            out[f"{prefix}ratio_quartiles_to_{base}"] = {n: quartiles(r) for n, r in ratios.items()}
    return out


def quartiles(values: list[float]) -> list[float]:
    """[first, third] quartile (both the value itself when there is one)."""
    if len(values) < 2:
        return [values[0], values[0]]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


def measure_modules(args: argparse.Namespace) -> dict:
    rows, x = module_rows(args)
    results = {}
    with attention_overhead.sdpa_backend(args.sdpa_backend):
        for mode, backward in attention_overhead.MODES:
            timed = {name: (lambda fn=fn, b=backward: time_call(fn, x, b)) for name, fn in rows.items()}
            results[mode] = interleaved(timed, args.reps, ("plain", "rope2d"))
    return results


def measure_passes(args: argparse.Namespace) -> dict:
    """Each pass of the rope2d and prope modules' forward (the rotary path) and the plain module's,
    timed alone in interleaved repetitions; ``ms`` and ``cpu_ms`` medians per pass."""
    gen = torch.Generator().manual_seed(0)
    grid = (args.grid, args.grid)
    cameras = attention_overhead.make_cameras(1, args.views, (8 * args.grid, 8 * args.grid), gen).to(args.device)
    dim, L, H, d = args.heads * args.head_dim, args.views * args.grid**2, args.heads, args.head_dim
    dtype = getattr(torch, args.dtype)
    x, out = (torch.randn(1, L, dim, generator=gen).to(args.device, dtype) for _ in range(2))
    torch.manual_seed(0)
    plain = PlainAttention(dim, H).to(args.device, dtype)
    modules, factors = {}, {}
    for name in ("rope2d", "prope"):
        modules[name] = hrope.nn.MultiviewAttention(dim, H, name, fold=True).to(args.device, dtype)
        modules[name].load_state_dict(plain.state_dict())
        factors[name] = modules[name].factorize(cameras, grid)
    qkv = F.linear(x, plain.qkv.weight)
    q, k, v = qkv.view(1, L, 3, H, d).permute(2, 0, 3, 1, 4)
    rope_dim = factors["prope"].rope_dim
    phase = factors["prope"].phase_for(dtype)
    rows: dict[str, Callable[[], object]] = {
        "factors: rope2d": lambda: modules["rope2d"].factorize(cameras, grid),
        "factors: prope": lambda: modules["prope"].factorize(cameras, grid),
        "qkv: plain": lambda: F.linear(x, plain.qkv.weight),
        "qkv: rope2d": lambda: modules["rope2d"]._rotary_qkv(x, factors["rope2d"], False, True),
        "qkv: prope (folded)": lambda: modules["prope"]._rotary_qkv(x, factors["prope"], True, True),
        "rope of q, k, v (in place)": lambda: rotate_(qkv, phase, args.views, (0, 3 * H), d, rope_dim, inverse=True),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "output: plain": lambda: F.linear(out, plain.out.weight),
        "output: rope2d": lambda: modules["rope2d"]._rotary_output(out, factors["rope2d"]),
        "output: prope (folded)": lambda: modules["prope"]._rotary_output(out, factors["prope"]),
    }

    def no_grad(run: Callable[[], object]) -> Callable[[], tuple[float, float]]:
        return lambda: timed(lambda: torch.no_grad()(run)())

    result = interleaved({name: no_grad(run) for name, run in rows.items()}, args.reps, ())
    return {key: result[key] for key in ("ms", "cpu_ms")}


def measure_per_call(args: argparse.Namespace) -> dict:
    """attention_overhead.py's rows per call and prepared once (its own timing loop)."""
    results = {}
    for prepared_once in (False, True):
        argv = ["--reps", str(args.reps), "--views", str(args.views), "--grid", str(args.grid)]
        argv += ["--heads", str(args.heads), "--head-dim", str(args.head_dim), "--encodings", *PER_CALL]
        argv += ["--device", args.device, "--dtype", args.dtype, "--sdpa-backend", args.sdpa_backend]
        argv += ["--precision", args.precision]
        ao_args = attention_overhead.parse_args(argv + (["--prepared-once"] if prepared_once else []))
        rows = attention_overhead.Rows(ao_args)
        modes = {mode: attention_overhead.time_mode(rows, b, args.reps) for mode, b in attention_overhead.MODES}
        key = "prepared_once" if prepared_once else "per_call"
        results[key] = {mode: {"sdpa_ms": r["sdpa_ms"], "ratio": r["ratio"]} for mode, r in modes.items()}
    return results


def measure_training(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.train_threads)
    scenes = [make_scene(0, i, "room", num_views=3, image_size=(64, 64)) for i in range(BATCH_SIZE)]
    batch = collate_scenes(scenes, 2).to(torch.device(args.device))
    rows = {}
    for name, folded in TRAINING:
        step, _ = step_function(name, batch, {"folded_attention": True} if folded else None)
        rows[f"{name}{' folded' if folded else ''}"] = step

    def steps(step: Callable[[], None]) -> Callable[[], tuple[float, float]]:
        return lambda: timed(lambda: [step() for _ in range(args.steps)])

    result = interleaved({name: steps(step) for name, step in rows.items()}, args.rounds, ("none",))
    for prefix in ("", "cpu_"):  # steps/s and their ratios (the inverse of the time ratios)
        result[f"{prefix}steps_per_s"] = {n: 1e3 * args.steps / ms for n, ms in result[f"{prefix}ms"].items()}
        result[f"{prefix}ratio_to_none"] = {n: 1.0 / r for n, r in result[f"{prefix}ratio_to_none"].items()}
        inverted = result[f"{prefix}ratio_quartiles_to_none"].items()
        result[f"{prefix}ratio_quartiles_to_none"] = {n: [1.0 / q3, 1.0 / q1] for n, (q1, q3) in inverted}
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=9, help="interleaved repetitions (modules, per call)")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the modules and per-call parts")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved training rounds")
    parser.add_argument("--steps", type=int, default=5, help="training steps per row per round")
    parser.add_argument("--train-threads", type=int, default=1)
    parser.add_argument("--parts", nargs="*", default=["modules", "passes", "per_call", "training"])
    parser.add_argument("--device", default="cpu", help="torch device of the modules and training, e.g. cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--sdpa-backend", choices=("auto", *attention_overhead.SDPA_BACKENDS), default="auto")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help="as attention_overhead.py's")
    parser.add_argument("--tag", default="", help="suffix of the output files (e.g. the token count)")
    parser.add_argument("--malloc-cache", action="store_true", help="rerun with glibc keeping freed memory")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def _relative(path: Path) -> Path:
    """``path`` relative to the repository root when inside it (results never record this machine's paths)."""
    root = RESULTS.parent.parent
    return path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cache = attention_overhead.MALLOC_CACHE_ENV
    if args.malloc_cache and any(os.environ.get(k) != v for k, v in cache.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **cache})
    torch.set_num_threads(args.threads)
    parts = {"modules": measure_modules, "passes": measure_passes, "per_call": measure_per_call}
    parts["training"] = measure_training
    results: dict = {name: parts[name](args) for name in args.parts}
    config = {**vars(args), "out": _relative(args.out)}
    results["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in config.items()}
    results["command"] = "python " + " ".join(["benchmarks/folded_attention.py", *(argv or sys.argv[1:])])
    results["load_average"] = [round(x, 2) for x in os.getloadavg()]
    results["provenance"] = provenance()
    args.out.mkdir(parents=True, exist_ok=True)
    suffixes = [args.device if args.device != "cpu" else "", args.dtype if args.dtype != "float32" else ""]
    suffixes += ["malloc_cache" if args.malloc_cache else "", args.tag]
    stem = "_".join(["folded_attention", *(s for s in suffixes if s)])
    write_json(args.out / f"{stem}.json", results, indent=1)
    write_text(args.out / f"{stem}.md", markdown(results))
    print(markdown(results))


_MALLOC = ", glibc keeping freed memory"


def markdown(results: dict) -> str:
    """The tables of every measured part."""
    cfg = results["config"]
    lines = [
        f"Folded attention modules, {cfg.get('device', 'cpu')} {cfg.get('dtype', 'float32')} (SDPA backend "
        f"{cfg.get('sdpa_backend', 'auto')}{_MALLOC if cfg.get('malloc_cache') else ''}). "
        f"Command: `{results['command']}` (torch {torch.__version__}); "
        f"commit `{describe(results['provenance'])}`; load average {results['load_average']} (shared machine: "
        "ratios are medians of ratios within interleaved repetitions).",
        "",
    ]
    if "modules" in results:
        lines += [
            f"Modules: 1 x {cfg['views']} views x {cfg['grid']}x{cfg['grid']} patches, {cfg['heads']} heads of "
            f"{cfg['head_dim']}, {cfg['threads']} threads, {cfg['reps']} repetitions.",
            "",
            "| mode | row | ms | / plain | / rope2d | CPU ms | CPU / plain | CPU / rope2d (quartiles) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, r in results["modules"].items():
            lines += [
                f"| {mode} | {n} | {r['ms'][n]:.1f} | {r['ratio_to_plain'][n]:.3f} | {r['ratio_to_rope2d'][n]:.3f} | "
                f"{r['cpu_ms'][n]:.1f} | {r['cpu_ratio_to_plain'][n]:.3f} | {r['cpu_ratio_to_rope2d'][n]:.3f} "
                f"{_spread(r, 'cpu_ratio_quartiles_to_rope2d', n)} |"
                for n in r["ms"]
            ]
        lines.append("")
    if "passes" in results:
        passes = results["passes"]
        lines += ["Passes of one forward (no grad), timed alone:", "", "| pass | ms | CPU ms |", "|---|---|---|"]
        lines += [f"| {n} | {passes['ms'][n]:.2f} | {passes['cpu_ms'][n]:.2f} |" for n in passes["ms"]]
        lines.append("")
    if "per_call" in results:
        lines += ["Per-call path (attention_overhead.py's rows), ratio to SDPA:", ""]
        lines += ["| path | row | forward | fwd+bwd |", "|---|---|---|---|"]
        for path, modes in results["per_call"].items():
            for n in modes["forward"]["ratio"]:
                f, b = modes["forward"]["ratio"][n], modes["forward_backward"]["ratio"][n]
                lines.append(f"| {path} | {n} | {f:.3f} | {b:.3f} |")
        lines.append("")
    if "training" in results:
        train = results["training"]
        lines += [
            f"Training, `tiny` preset, batch {BATCH_SIZE}, {cfg['train_threads']} thread(s), {cfg['rounds']} rounds "
            f"of {cfg['steps']} steps:",
            "",
            "| row | steps/s | ratio to none | CPU steps/s | CPU ratio to none (quartiles) |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {n} | {train['steps_per_s'][n]:.2f} | {train['ratio_to_none'][n]:.3f} | "
            f"{train['cpu_steps_per_s'][n]:.2f} | {train['cpu_ratio_to_none'][n]:.3f} "
            f"{_spread(train, 'cpu_ratio_quartiles_to_none', n)} |"
            for n in train["ms"]
        ]
    return "\n".join(lines) + "\n"


def _spread(result: dict, key: str, row: str) -> str:
    """``(q1–q3)`` of a row's per-repetition ratios."""
    q1, q3 = result[key][row]
    return f"({q1:.3f}–{q3:.3f})"


if __name__ == "__main__":
    main()
