"""Encoding overhead over plain SDPA: time and memory ratios (DESIGN.md §8).

    python benchmarks/attention_overhead.py [--reps 15] [--encodings prope hrope ...]

Shape: B=1, 8 heads, 2 views x 32x32 patches (N=2048), head_dim 64, fp32 on the CPU by default
(``--device cuda`` synchronises the GPU around every timed call; ``--dtype bfloat16`` for the
half-precision SDPA kernels).
Each repetition times plain SDPA and every encoding back to back (interleaved), and the
reported ratio is the median over repetitions of time(encoded) / time(SDPA) measured in that
same repetition. Memory: bytes saved for backward by autograd, relative to plain SDPA. Page
faults: the median number of minor page faults (fresh memory touched) per forward call.
The row ``prope-einsum`` is PRoPE applied with the official PRoPE module's algorithm
(benchmarks/prope_einsum.py), the peer our ``prope`` is measured against in the same run.
Writes benchmarks/results/attention_overhead.{json,md} (``--compile``: attention_overhead_compiled.*).
By default every call prepares its transform, as ``hrope.multiview_attention`` does;
``--prepared-once`` prepares each encoding before timing and times only ``prepared.attention``:
the cost of one more layer in a model that reuses the prepared transform in all its layers
(results in attention_overhead_prepared_once.*); ``prope-einsum`` then precomputes its tables
too, as the official module's cached closures do.

``--malloc-cache`` reruns the process with glibc told to keep freed memory
(MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=4 GiB; results in
attention_overhead_malloc_cache.*). By default every new output tensor of a few MB is fresh
memory from the OS and its first write page-faults (~2 ms per 4 MB here), which every
out-of-place transform pays; with the cache the ratios measure the transforms' own work, as on a
GPU with PyTorch's caching allocator or a CPU run under jemalloc/tcmalloc. glibc also keeps freed
blocks once the process has freed one block of more than three q-sized tensors (its dynamic
threshold); ``--warm-allocator 16`` frees one 16 MB block before timing, as the MLP activations
of a d=512 transformer layer at this N do in a model (results in attention_overhead_warm.*).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hrope.nvs.running.atomic import write_json, write_text
import hrope
from hrope.encodings import PRECISIONS
from prope_einsum import prope_einsum_apply, prope_einsum_attention, prope_einsum_tables
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"
TRAILING_SHAPES = {"depth_sigma": (2,)}  # per-token params with more than one number per token
PEER = "prope-einsum"  # the official module's algorithm, see prope_einsum.py
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}
MODES = (("forward", False), ("forward_backward", True))  # (results key, backward pass)
MALLOC_CACHE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def example_inputs(name: str, cameras: hrope.Cameras, grid, generator) -> dict:
    """Planes / per-token params for encoding ``name``: random planes facing the camera at depth
    1–2, depths 1–2, random rotations, identity transforms; other params 0.1 * U(0, 1)."""
    B, N = cameras.batch_size, cameras.num_views * grid[0] * grid[1]
    device = cameras.K.device
    enc = hrope.get_encoding(name)
    kwargs: dict = {"planes": None, "params": {}}
    if enc.needs_planes:
        normal = torch.randn(B, N, 3, generator=generator) * 0.3
        normal[..., 2] = -1.0
        kwargs["planes"] = hrope.Planes(normal.to(device), (1.0 + torch.rand(B, N, generator=generator)).to(device))
    for p in enc.param_names:
        if p == "depth":
            value = 1.0 + torch.rand(B, N, generator=generator)
        elif p == "rotation":
            value = random_rotations(B, N, generator=generator)
        elif p == "transform":
            value = torch.eye(4).repeat(B, N, 1, 1)
        else:  # log-depth half-widths, depth splits and sigmas of the query-frame encodings
            value = 0.1 * torch.rand(B, N, *TRAILING_SHAPES.get(p, ()), generator=generator)
        kwargs["params"][p] = value.to(device)
    return kwargs


def random_rotations(*shape, generator) -> torch.Tensor:
    """Uniform random rotations ``(*shape, 3, 3)`` in float32."""
    Q, R = torch.linalg.qr(torch.randn(*shape, 3, 3, generator=generator, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))[..., None, :]
    Q[..., :, 0] *= torch.linalg.det(Q)[..., None]
    return Q.float()


def make_cameras(B: int, V: int, image_size, generator) -> hrope.Cameras:
    """Cameras with f = 1.1 W, centred principal point, random rotations and translations."""
    H, W = image_size
    K = torch.tensor([[1.1 * W, 0, W / 2], [0, 1.1 * H, H / 2], [0, 0, 1.0]]).repeat(B, V, 1, 1)
    E = torch.eye(4).repeat(B, V, 1, 1)
    E[..., :3, :3] = random_rotations(B, V, generator=generator)
    E[..., :3, 3] = torch.randn(B, V, 3, generator=generator)
    return hrope.Cameras(K, E, image_size)


def saved_bytes(fn) -> int:
    """Bytes of tensors autograd saves for backward while running ``fn()``."""
    total = 0
    seen = set()

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--encodings", nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--compile", action="store_true", help="torch.compile every row (SDPA too) before timing")
    parser.add_argument(
        "--malloc-cache", action="store_true", help="rerun with glibc keeping freed memory (see the module docstring)"
    )
    parser.add_argument(
        "--warm-allocator",
        type=int,
        default=0,
        metavar="MB",
        help="allocate, fill and free one block of MB megabytes before timing",
    )
    parser.add_argument(
        "--prepared-once",
        action="store_true",
        help="prepare each encoding once before timing and time only its attention (one layer of a "
        "model that reuses the prepared transform in every layer)",
    )
    parser.add_argument(
        "--sdpa-backend",
        choices=("auto", *SDPA_BACKENDS),
        default="auto",
        help="restrict every SDPA call (the baseline's and the encodings') to one backend; auto: PyTorch's choice",
    )
    parser.add_argument(
        "--transform-backend",
        choices=("torch", "triton", "auto"),
        default="torch",
        help="how the relative encodings apply their transforms (Encoding.use_backend)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="Encoding.use_precision of every encoding; float32: SDPA in the tensors' dtype for all of them (the "
        "flash-eligible path this measures); auto runs the half-precision SDPA of encodings with blocks in float32",
    )
    parser.add_argument("--tag", default="", help="suffix of the output files (e.g. n8192)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


class Rows:
    """Plain SDPA and every encoding row on the same random cameras, q, k, v ``(1, heads, N, head_dim)``
    and per-row planes / params; ``functions[name](q, k, v)`` is a row's attention (compiled with
    ``--compile``, the compilation happening in the warm-up)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        self.grid = (args.grid, args.grid)
        self.names = args.encodings or [*hrope.ENCODINGS, PEER]
        self.device, self.dtype = torch.device(args.device), getattr(torch, args.dtype)
        self.cameras = make_cameras(1, args.views, (8 * args.grid, 8 * args.grid), gen).to(device=self.device)
        N = args.views * args.grid * args.grid
        self.q, self.k, self.v = (
            torch.randn(1, args.heads, N, args.head_dim, generator=gen).to(self.device, self.dtype) for _ in range(3)
        )
        self.inputs = {name: example_inputs(name, self.cameras, self.grid, gen) for name in self.names if name != PEER}
        self.encodings = {name: hrope.get_encoding(name).use_precision(args.precision) for name in self.inputs}
        for encoding in self.encodings.values():
            if not encoding.query_frame:
                encoding.use_backend(args.transform_backend)
        self.functions = {
            name: torch.compile(self.attend(name)) if args.compile else self.attend(name)
            for name in ["sdpa", *self.names]
        }

    def attend(self, name: str):
        """The row's attention as a function of (q, k, v)."""
        args, cameras, grid = self.args, self.cameras, self.grid
        if name == "sdpa":
            return F.scaled_dot_product_attention
        if name == PEER and args.prepared_once:  # as the official module's cached closures
            tables = prope_einsum_tables(cameras, grid, args.head_dim, self.dtype, self.device)
            return lambda q, k, v: prope_einsum_apply(q, k, v, tables)
        if name == PEER:
            return lambda q, k, v: prope_einsum_attention(q, k, v, cameras=cameras, grid=grid)
        inputs, encoding = self.inputs[name], self.encodings[name]
        if args.prepared_once:
            return encoding.prepare(cameras, grid, args.head_dim, planes=inputs["planes"], **inputs["params"]).attention
        return lambda q, k, v: hrope.multiview_attention(
            q, k, v, encoding=encoding, cameras=cameras, grid=grid, **inputs
        )

    def run(self, name: str, backward: bool):
        qq, kk, vv = (x.detach().requires_grad_(backward) for x in (self.q, self.k, self.v))
        out = self.functions[name](qq, kk, vv)
        if backward:
            out.sum().backward()
        return out

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, name: str, backward: bool) -> tuple[float, int]:
        """Seconds and minor page faults of one call."""
        with sdpa_backend(self.args.sdpa_backend):
            self.synchronize()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            if backward:
                self.run(name, True)
            else:
                with torch.no_grad():
                    self.run(name, False)
            self.synchronize()
            return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def time_mode(rows: Rows, backward: bool, reps: int) -> dict:
    """One mode's results: after a warm-up call of each row, ``reps`` interleaved repetitions of
    SDPA then every encoding; ratios to the SDPA time of the same repetition."""
    names = rows.names
    for name in ["sdpa", *names]:  # warm-up
        rows.timed(name, backward)
    ratios = {name: [] for name in names}
    faults = {name: [] for name in ["sdpa", *names]}
    sdpa_times = []
    for _ in range(reps):
        base, faults_sdpa = rows.timed("sdpa", backward)
        sdpa_times.append(base)
        faults["sdpa"].append(faults_sdpa)
        for name in names:
            seconds, row_faults = rows.timed(name, backward)
            ratios[name].append(seconds / base)
            faults[name].append(row_faults)
    return {
        "sdpa_ms": 1e3 * statistics.median(sdpa_times),
        "ratio": {n: statistics.median(r) for n, r in ratios.items()},
        "ratio_quartiles": {n: quartiles(r) for n, r in ratios.items()},
        "ratios_per_repetition": ratios,
        "page_faults_per_call": {n: statistics.median(f) for n, f in faults.items()},
    }


def saved_ratios(rows: Rows) -> dict[str, float]:
    """Bytes saved for backward by every encoding row relative to plain SDPA."""
    with sdpa_backend(rows.args.sdpa_backend):
        sdpa_saved = saved_bytes(lambda: rows.run("sdpa", True))
        return {n: saved_bytes(lambda n=n: rows.run(n, True)) / sdpa_saved for n in rows.names}


def run_config(args: argparse.Namespace, rows: Rows) -> dict:
    """The ``config`` entry of the results: shape, dtype, device, threads and every timing option."""
    return {
        "B": 1,
        "heads": args.heads,
        "views": args.views,
        "grid": rows.grid,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "device": str(rows.device),
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "compiled": args.compile,
        "malloc_cache": args.malloc_cache,
        "prepared_once": args.prepared_once,
        "sdpa_backend": args.sdpa_backend,
        "transform_backend": args.transform_backend,
        "precision": args.precision,
        "warm_allocator_mb": args.warm_allocator,
    }


def output_stem(args: argparse.Namespace) -> str:
    """``attention_overhead`` with a suffix per non-default device, dtype and option."""
    device = torch.device(args.device)
    return (
        "attention_overhead"
        + ("" if device.type == "cpu" else f"_{device.type}")
        + ("" if args.dtype == "float32" else f"_{args.dtype}")
        + ("_compiled" if args.compile else "")
        + ("_malloc_cache" if args.malloc_cache else "")
        + ("_warm" if args.warm_allocator else "")
        + ("_prepared_once" if args.prepared_once else "")
        + (f"_{args.tag}" if args.tag else "")
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.malloc_cache and any(os.environ.get(k) != v for k, v in MALLOC_CACHE_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_CACHE_ENV})
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.warm_allocator:
        torch.empty(args.warm_allocator << 18).fill_(0.0)  # MB of float32, freed at once
    rows = Rows(args)
    results = {mode: time_mode(rows, backward, args.reps) for mode, backward in MODES}
    results["saved_for_backward_ratio"] = saved_ratios(rows)
    results["load_average"] = [round(x, 2) for x in os.getloadavg()]
    results["provenance"] = provenance()
    results["command"] = " ".join(
        ["python", "benchmarks/attention_overhead.py", *(sys.argv[1:] if argv is None else argv)]
    )
    results["config"] = run_config(args, rows)
    write(results, rows.names, args.out, output_stem(args))


def sdpa_backend(name: str):
    """A context restricting SDPA to backend ``name`` (``auto``: no restriction)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def quartiles(values: list[float]) -> list[float]:
    """First and third quartiles (the spread of the per-repetition ratios)."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return [q1, q3]


def _settings(cfg: dict) -> list[str]:
    """The run's non-default options, as the table's heading names them."""
    return [
        name
        for name, on in (
            (f"SDPA backend {cfg.get('sdpa_backend')}", cfg.get("sdpa_backend", "auto") != "auto"),
            (
                f"transforms by the {cfg.get('transform_backend')} backend",
                cfg.get("transform_backend", "torch") != "torch",
            ),
            ("torch.compile", cfg.get("compiled")),
            ("malloc cache", cfg.get("malloc_cache")),
            ("each transform prepared once before timing", cfg.get("prepared_once")),
            (f"allocator warmed with one {cfg.get('warm_allocator_mb')} MB block", cfg.get("warm_allocator_mb")),
        )
        if on
    ]


def write(results: dict, names, out: Path, stem: str = "attention_overhead") -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", results)
    fwd, fb = results["forward"]["ratio"], results["forward_backward"]["ratio"]
    per_rep = results["forward"]["ratios_per_repetition"]
    spread = {n: "{:.2f}–{:.2f}".format(*results["forward"]["ratio_quartiles"][n]) for n in names}
    peers = [n for n in names if not n.startswith("hrope") and n not in ("none", "rope2d")]  # geometric peers
    faults = {n: f"{f:.0f}" for n, f in results["forward"].get("page_faults_per_call", {}).items()}
    best_peer = min(peers, key=lambda n: fwd[n]) if peers else None
    cfg = results["config"]
    settings = _settings(cfg)
    lines = [
        f"Shape: B=1, {cfg['heads']} heads, {cfg['views']} views x {cfg['grid'][0]}x{cfg['grid'][1]} patches, "
        f"head_dim {cfg['head_dim']}, {cfg.get('dtype', 'float32')} {cfg.get('device', 'cpu')}, "
        f"{cfg['threads']} threads, "
        f"{''.join(s + ', ' for s in settings)}"
        f"{cfg['reps']} interleaved repetitions "
        "(median of per-repetition ratios, quartiles in brackets; ratios between two encodings are "
        f"paired per repetition too). Plain SDPA: {results['forward']['sdpa_ms']:.1f} ms forward, "
        f"{results['forward_backward']['sdpa_ms']:.1f} ms forward+backward, {faults.get('sdpa', 'n/a')} page "
        f"faults per forward call. Load average at the end: {results['load_average']}. "
        f"Commit: `{describe(results.get('provenance'))}`.",
        "",
        f"| encoding | forward / SDPA | fwd+bwd / SDPA | forward / prope | forward / {PEER} "
        f"| forward / fastest peer ({best_peer}) | saved-for-backward / SDPA | page faults / forward |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ratio_to(n, ref):
        """Median over repetitions of time(n) / time(ref) measured in the same repetition."""
        return f"{statistics.median(a / b for a, b in zip(per_rep[n], per_rep[ref])):.3f}" if ref in per_rep else "n/a"

    for n in names:
        lines.append(
            f"| {n} | {fwd[n]:.3f} ({spread[n]}) | {fb[n]:.3f} | {ratio_to(n, 'prope')} | {ratio_to(n, PEER)} "
            f"| {ratio_to(n, best_peer)} | {results['saved_for_backward_ratio'][n]:.3f} "
            f"| {faults.get(n, 'n/a')} |"
        )
    write_text(out / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
