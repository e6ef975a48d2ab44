"""docs/benchmarks.md, generated: one table of every committed microbenchmark result, and the
measured tables of the pages under docs/benchmarks/.

Each row of the summary is one result file under ``benchmarks/results/`` (``RESULTS``): what the
benchmark measures, the headline ratios the file records (to plain SDPA, or the plain counterpart
the row names, and to the strongest peer measured in the same run), the commit that produced it
(``provenance``; "not recorded" for files written before provenance was recorded) and its command.
On the detail pages, the text between ``<!-- benchmarks_page: PATH -->`` and
``<!-- /benchmarks_page -->`` is the committed Markdown ``benchmarks/results/PATH`` as its script
wrote it (headings made bold, so that they do not enter the page's outline).

    python -m experiments.benchmarks_page           # rewrite docs/benchmarks.md and the detail pages' tables
    python -m experiments.benchmarks_page --check   # exit 1 when they differ from the committed results
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hrope.nvs.running.atomic import write_text
from hrope.nvs.running.provenance import describe

__all__ = ["Benchmark", "Result", "BENCHMARKS", "RESULTS", "summary", "render_detail", "pages", "main"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
PAGE = DOCS / "benchmarks.md"
DETAILS = DOCS / "benchmarks"
BLOCK = re.compile(r"(<!-- benchmarks_page: (\S+) -->\n).*?(<!-- /benchmarks_page -->)", re.DOTALL)
THREE = ("prope", "hrope", "hrope-lift")
PEER = "prope-einsum"  # the official PRoPE module's algorithm (benchmarks/prope_einsum.py)


@dataclass(frozen=True)
class Benchmark:
    """A script of benchmarks/: its detail page (relative to docs/) and what it measures."""

    script: str
    page: str
    measures: str


@dataclass(frozen=True)
class Result:
    """One committed result file (relative to benchmarks/results/) and how its headline reads it.

    ``command``: only for files that do not record theirs (the command documented for them)."""

    benchmark: str
    path: str
    run: str
    headline: Callable[[dict], str]
    command: str | None = None


def _list(values: dict[str, float], names, digits: int = 3) -> str:
    return ", ".join(f"{name} {values[name]:.{digits}f}" for name in names if name in values)


def _paired(data: dict, name: str, ref: str) -> float:
    """Median over repetitions of forward time(name) / time(ref) measured in the same repetition."""
    per_rep = data["forward"]["ratios_per_repetition"]
    return statistics.median(a / b for a, b in zip(per_rep[name], per_rep[ref], strict=True))


def attention(data: dict) -> str:
    """Forward and forward+backward / SDPA of prope, hrope, hrope-lift; forward / the official algorithm."""
    names = [n for n in THREE if n in data["forward"]["ratio"]]
    text = (
        f"fwd / SDPA: {_list(data['forward']['ratio'], names)}; "
        f"fwd+bwd / SDPA: {_list(data['forward_backward']['ratio'], names)}"
    )
    if PEER in data["forward"].get("ratios_per_repetition", {}):
        text += f"; fwd / {PEER}: " + _list({n: _paired(data, n, PEER) for n in names}, names)
    return text


def query_frame(data: dict) -> str:
    """Process-CPU-time forward / SDPA and / prope at the fewest and the most views."""
    rows = data["results"]
    views = sorted({row["views"] for row in rows})
    parts = []
    for count in (views[0], views[-1]):
        at = {row["method"]: row for row in rows if row["views"] == count}
        names = [n for n in ("rayrope", "urope", "worldrope") if n in at]
        sdpa = ", ".join(f"{n} {at[n]['fwd_cpu_ratio_sdpa']:.2f}" for n in names)
        prope = ", ".join(f"{at[n]['fwd_cpu_ratio_prope']:.2f}" for n in names)
        parts.append(f"{count} views: fwd / SDPA {sdpa}; / prope {prope}")
    return "; ".join(parts) + " (process CPU time)"


def render_speed(data: dict) -> str:
    """Rendering per dataset and one training batch, in seconds; the target is the file's."""
    split = [(*row["what"].split(": ", 1), row["seconds"]) for row in data["rows"]]
    render = [(where, what, seconds) for where, what, seconds in split if what.startswith("render")]
    batch = next(seconds for where, _, seconds in split if where == "training batch")
    times = ", ".join(f"{where} {seconds:.3f} s" for where, _, seconds in render)
    return f"{render[0][1]}: {times} (target ≤ {data['target_render_s']} s); a training batch {batch:.3f} s"


def train_throughput(data: dict) -> str:
    """Training steps/s / ``none`` (the same model without a positional encoding)."""
    ratios = {row["encoding"]: row["ratio_to_none"] for row in data["results"]}
    return "steps/s / none: " + _list(ratios, ("prope", "hrope", "hrope-lift", "urope", "rayrope"), 2)


def real_loading(data: dict) -> str:
    rows = [row for row in data["results"] if row["data"] != "synthetic"]
    return "step time / synthetic step: " + ", ".join(
        f"{row['data']} {row['step_time_ratio_to_synthetic']:.2f}" for row in rows
    )


def real_step_cost(data: dict) -> str:
    rows = [row for row in data["results"] if row["data"] != "synthetic"]
    ratios = ", ".join(f"{row['data']} {row['ratio_to_synthetic']:.2f}" for row in rows)
    return f"step time / synthetic step: {ratios} (target ≤ {data['meta']['target']})"


def folded_modules(data: dict) -> str:
    """Module forward / the ``rope2d`` module (CPU time), unfolded and folded; training / none."""
    ratio = data["modules"]["forward"]["cpu_ratio_to_rope2d"]
    names = ["plain", "prope unfolded", "prope folded", "hrope-lift unfolded", "hrope-lift folded"]
    text = "module fwd / rope2d module: " + _list(ratio, names)
    if "training" in data:
        training = data["training"]["cpu_ratio_to_none"]
        text += "; training / none: " + _list(training, ["prope", "prope folded", "hrope-lift", "hrope-lift folded"])
    return text


def folded_per_call(data: dict) -> str:
    parts = []
    for path, timed in data["per_call"].items():
        parts.append(f"{path.replace('_', ' ')}: fwd / SDPA " + _list(timed["forward"]["ratio"], (*THREE, PEER)))
    return "; ".join(parts)


def compile_speed(data: dict) -> str:
    return "eager / compiled: " + ", ".join(
        f"{row['row']} {row['encoding']} {row['speedup']:.2f}" for row in data["results"]
    )


def banded_apply(data: dict) -> str:
    """Compiled / eager banded passes, forward and forward+backward, per layout."""
    ratio = {
        (row["layout"], row["mode"]): row["ratio_to_banded"] for row in data["rows"] if row["backend"] == "compiled"
    }
    layouts = list(dict.fromkeys(layout for layout, _ in ratio))
    forward = ", ".join(f"{layout} {ratio[layout, 'forward']:.2f}" for layout in layouts)
    backward = ", ".join(f"{ratio[layout, 'forward_backward']:.2f}" for layout in layouts)
    return f"compiled / eager banded, fwd: {forward}; fwd+bwd: {backward}"


def device_check(data: dict) -> str:
    checks = data["checks"]
    worst = {}
    for check in checks:
        if check["relative_error"] >= worst.get(check["dtype"], {"relative_error": -1.0})["relative_error"]:
            worst[check["dtype"]] = check
    errors = ", ".join(f"{dtype} {c['relative_error']:.1e} ({c['encoding']})" for dtype, c in worst.items())
    return f"{sum(c['ok'] for c in checks)} of {len(checks)} checks pass; largest relative error: {errors}"


def adapter_overhead(data: dict) -> str:
    """Each adapter against hrope's own call, and against the framework's own attention."""
    rows = [(adapter, row) for adapter, rows in data["results"].items() for row in rows]
    own = [row["ratio"] for _, row in rows if row["relative_to"] in ("multiview_attention", "prepared once")]
    framework = [
        f"{adapter} {row['call']} / {row['relative_to']} {row['ratio']:.2f}"
        for adapter, row in rows
        if "geometry" not in row["call"] and row["relative_to"] in ("transformers sdpa", "Attention + AttnProcessor2_0")
    ]
    return f"adapter / hrope's own call: {min(own):.2f}–{max(own):.2f}; " + "; ".join(framework)


def plane_conditioning(data: dict) -> str:
    """Largest norm of one token pair's plane transform, capped at |m| <= 2 and uncapped, against prope's."""
    parts = []
    for dataset in data["datasets"]:
        norms = {plane["cap"]: plane["norm_max"] for plane in dataset["planes"]}
        prope = dataset["prope"]["norm_max"]
        parts.append(f"{dataset['dataset']} {norms[2.0]:.2f} (uncapped {norms[None]:.2f}, prope {prope:.2f})")
    return "largest ‖D_i D_j⁻¹‖ with |m| ≤ 2: " + "; ".join(parts)


def half_precision(data: dict) -> str:
    """Worst bf16 / fp16 error of the default (``auto``) path as a multiple of max(SDPA's error, the
    floor), how many encoding x dtype cells are within 2x of SDPA's error or of the floor, and the
    time ratio auto / float32."""
    parts = []
    for dtype, name in (("bfloat16", "bf16"), ("float16", "fp16")):
        worst = data["summary"][dtype]["excess"]
        parts.append(f"{name} {worst['value']:.1f}x max(SDPA's error, floor), worst `{worst['encoding']}`")
    verdicts = data["verdicts"]
    reached = sum(v["verdict"] != "misses" for v in verdicts)
    ratios = [row["median_ratio"] for row in data["speed"]]
    return (
        "; ".join(parts)
        + f"; {reached} of {len(verdicts)} encoding x dtype within 2x of SDPA's error or of the floor"
        + f"; time auto / float32: median {statistics.median(ratios):.2f}"
    )


BENCHMARKS = {
    b.script: b
    for b in (
        Benchmark(
            "attention_overhead",
            "benchmarks/attention_overhead.md",
            "one multi-view attention call (prepare, transforms, SDPA) at N = 2048, head_dim 64",
        ),
        Benchmark(
            "query_frame_scaling",
            "benchmarks/query_frame_scaling.md",
            "the query-frame encodings' time and memory at 2, 4 and 8 views",
        ),
        Benchmark("folded_attention", "benchmarks/folded_attention.md", "the `hrope.nn` modules, folded and unfolded"),
        Benchmark("banded_apply", "benchmarks/banded_apply.md", "the transform y = D x alone, eager and compiled"),
        Benchmark(
            "compile_speed", "benchmarks/compile_speed.md", "attention and a training step under `torch.compile`"
        ),
        Benchmark("train_throughput", "benchmarks/train_throughput.md", "training steps/s of the `tiny` LVSM"),
        Benchmark("real_loading", "benchmarks/real_loading.md", "training on a COLMAP capture of large JPEGs"),
        Benchmark(
            "real_step_cost",
            "real_data.md#the-real-capture-benchmark",
            "a cached training step on real captures cut into 3-view scenes",
        ),
        Benchmark("render_speed", "benchmarks/synthetic_data.md", "rendering synthetic scenes and batches"),
        Benchmark(
            "device_check", "benchmarks/gpu_suite.md", "every encoding in low precision against the float64 reference"
        ),
        Benchmark(
            "adapter_overhead",
            "integrations/transformers.md#what-the-adapter-costs",
            "the `transformers` and `diffusers` adapters",
        ),
        Benchmark(
            "half_precision",
            "encodings.md#numerics-in-half-precision",
            "every encoding in bfloat16 and float16 at scenes 1e-3 to 1e3 units and planes at the cap",
        ),
        Benchmark(
            "plane_conditioning",
            "notebook.md#why-geometry-hurts-on-object-planes-next-to-the-camera",
            "how far one token pair's plane transform stretches q and k (true planes)",
        ),
    )
}

_OVERHEAD = "python benchmarks/attention_overhead.py --threads 1"
_TARGETS = f"{_OVERHEAD} --reps 30 --encodings prope hrope hrope-lift prope-einsum --out benchmarks/results/targets"

RESULTS: tuple[Result, ...] = (
    Result("attention_overhead", "attention_overhead.json", "per call, process as it starts", attention, _OVERHEAD),
    Result(
        "attention_overhead",
        "attention_overhead_warm.json",
        "per call, allocator warmed",
        attention,
        f"{_OVERHEAD} --warm-allocator 16",
    ),
    Result(
        "attention_overhead",
        "attention_overhead_malloc_cache.json",
        "per call, glibc keeping freed memory",
        attention,
        f"{_OVERHEAD} --malloc-cache",
    ),
    Result(
        "attention_overhead",
        "attention_overhead_prepared_once.json",
        "prepared once (one more layer)",
        attention,
        f"{_OVERHEAD} --prepared-once",
    ),
    Result(
        "attention_overhead",
        "attention_overhead_warm_prepared_once.json",
        "prepared once, allocator warmed",
        attention,
        f"{_OVERHEAD} --prepared-once --warm-allocator 16",
    ),
    Result(
        "attention_overhead",
        "attention_overhead_compiled.json",
        "per call, `torch.compile` on every row",
        attention,
        f"{_OVERHEAD} --compile --reps 9 --encodings prope hrope hrope-lift",
    ),
    Result(
        "attention_overhead", "targets/attention_overhead.json", "30 reps, process as it starts", attention, _TARGETS
    ),
    Result(
        "attention_overhead",
        "targets/attention_overhead_warm.json",
        "30 reps, allocator warmed",
        attention,
        f"{_TARGETS} --warm-allocator 16",
    ),
    Result(
        "attention_overhead",
        "targets/attention_overhead_malloc_cache.json",
        "30 reps, glibc keeping freed memory",
        attention,
        f"{_TARGETS} --malloc-cache",
    ),
    Result(
        "attention_overhead",
        "targets/attention_overhead_prepared_once.json",
        "30 reps, prepared once",
        attention,
        f"{_TARGETS} --prepared-once",
    ),
    Result("query_frame_scaling", "query_frame_scaling.json", "2, 4, 8 views", query_frame),
    Result("folded_attention", "folded_attention.json", "modules and training", folded_modules),
    Result(
        "folded_attention", "folded_attention_malloc_cache.json", "modules, glibc keeping freed memory", folded_modules
    ),
    Result("folded_attention", "folded_attention_malloc_cache_per_call.json", "per-call path", folded_per_call),
    Result("banded_apply", "banded_apply_cpu_n2048/banded_apply.json", "N = 2048", banded_apply),
    Result("banded_apply", "banded_apply_cpu_tiny/banded_apply.json", "the `tiny` training shape", banded_apply),
    Result("compile_speed", "compile_speed.json", "", compile_speed),
    Result("train_throughput", "train_throughput.json", "", train_throughput),
    Result(
        "train_throughput",
        "train_throughput_before_b5dded8/train_throughput.json",
        "before the training-speed changes",
        train_throughput,
    ),
    Result("real_loading", "real_loading.json", "", real_loading),
    Result("real_step_cost", "real_captures/real_step_cost.json", "", real_step_cost),
    Result("render_speed", "render_speed.json", "", render_speed),
    Result(
        "device_check", "device_check_cpu.json", "CPU", device_check, "python benchmarks/device_check.py --device cpu"
    ),
    Result(
        "device_check",
        "device_check_cpu_triton.json",
        "CPU, fused Triton path (interpreter)",
        device_check,
        "TRITON_INTERPRET=1 python benchmarks/device_check.py --device cpu --encodings prope hrope hrope-lift "
        "--transform-backend triton",
    ),
    Result("adapter_overhead", "adapter_overhead.json", "", adapter_overhead),
    Result("plane_conditioning", "plane_conditioning.json", "", plane_conditioning),
    Result("half_precision", "half_precision.json", "", half_precision, "python benchmarks/half_precision.py"),
)


def _recorded(data: dict, key: str):
    """``data[key]`` or ``data["meta"][key]`` (the scripts keep their metadata in either place)."""
    return data.get(key, data.get("meta", {}).get(key))


def command(result: Result, data: dict) -> str:
    """The file's recorded command, else the one documented for it (a file may not have both)."""
    recorded = _recorded(data, "command")
    if (recorded is None) == (result.command is None):
        state = "records a command" if recorded else "records no command"
        raise ValueError(f"{result.path} {state}: give RESULTS a command only for files without one")
    return recorded or result.command


INTRO = """# Benchmarks

Speed and memory of the encodings and the toolkit, one row per committed result file under
`benchmarks/results/`. Each headline is what that file records: ratios to plain SDPA (or to the
plain counterpart the row names: the `rope2d` module, training with `none`, a synthetic step) and to
the strongest peer timed in the same run (the official PRoPE algorithm, `prope-einsum`, for one
attention call; `prope` for the query-frame encodings). Ratios are medians of per-repetition ratios
from interleaved repetitions; absolute times on the shared 2-core CPU they were measured on vary
by 10–30 %. Every result is from a CPU (torch 2.13.0 CPU build, one thread unless the command
says otherwise); the GPU suite has no committed result ([GPU suite](benchmarks/gpu_suite.md)).
Each benchmark's page gives the shapes, every row and the reading; how results record their code,
and the NVS experiments' cells and intervals, are in [provenance](benchmarks/provenance.md); the
NVS results are on [results.md](results.md).

This page is generated from the committed JSON by `python -m experiments.benchmarks_page`
(`tests/test_benchmarks_page.py` checks it). `make bench` runs the CPU benchmarks (about 35
minutes).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def summary() -> str:
    """The whole of docs/benchmarks.md."""
    lines = [
        "| benchmark | what it measures | run | headline (from the result file) | commit | command |",
        "|---|---|---|---|---|---|",
    ]
    shown = set()
    for result in RESULTS:
        benchmark = BENCHMARKS[result.benchmark]
        data = json.loads((RESULTS_DIR / result.path).read_text())
        first = result.benchmark not in shown
        shown.add(result.benchmark)
        name = f"[{benchmark.script}]({benchmark.page})" if first else benchmark.script
        cells = [
            name,
            benchmark.measures if first else "",
            result.run,
            result.headline(data),
            f"`{describe(_recorded(data, 'provenance'), short=True)}`",
            f"`{command(result, data)}`",
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return INTRO + "\n" + "\n".join(lines) + "\n"


def _included(path: str) -> str:
    """The committed Markdown result ``path``, its headings as bold lines (blank lines around it, so
    that the markers stay apart from its paragraphs and tables)."""
    text = (RESULTS_DIR / path).read_text()
    text = re.sub(r"^#+[ \t]+(.*?)[ \t]*$", r"**\1**", text, flags=re.M)
    return text if text.endswith("\n") else text + "\n"


def render_detail(text: str) -> str:
    """``text`` with every ``benchmarks_page`` block replaced by the committed result it names."""

    def replace(match: re.Match) -> str:
        path = match.group(2)
        if not (RESULTS_DIR / path).is_file():
            raise ValueError(f"benchmarks_page block names {path!r}: no such file under benchmarks/results/")
        return match.group(1) + "\n" + _included(path) + "\n" + match.group(3)

    return BLOCK.sub(replace, text)


def pages() -> dict[Path, str]:
    """Every generated page and what it should hold."""
    out = {PAGE: summary()}
    for page in sorted(DETAILS.glob("*.md")):
        out[page] = render_detail(page.read_text())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for page, text in pages().items():
        current = page.read_text() if page.exists() else None
        if current == text:
            continue
        stale.append(page)
        if not args.check:
            write_text(page, text)
    if args.check and stale:
        names = ", ".join(str(page.relative_to(ROOT)) for page in stale)
        print(f"{names}: out of date; run python -m experiments.benchmarks_page", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
