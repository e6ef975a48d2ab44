"""What each framework adapter costs over hrope's own attention: time ratios on the same q, k, v.

    python benchmarks/adapter_overhead.py [--reps 15] [--adapters transformers] [--encoding hrope]

Shape: B=1, 8 heads, 2 views x 32x32 patches plus one identity token (a cls token) per view
(L = 2050), head_dim 64, fp32 on the CPU, forward only. Each adapter has one function below that
returns its calls (zero-argument functions on fixed inputs) and the pairs (call, relative to) to
report; every repetition runs all of an adapter's calls back to back (interleaved), and a ratio is
the median over repetitions of time(call) / time(relative to) in that repetition.
Writes benchmarks/results/adapter_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hrope.nvs.running.atomic import write_json, write_text
import hrope
from hrope.nvs.running.provenance import describe, provenance

RESULTS = Path(__file__).resolve().parent / "results"


def inputs(args, generator: torch.Generator) -> dict:
    """Cameras, planes, q, k, v and the identity-token layout (one cls token before each view's patches)."""
    grid, P = (args.grid, args.grid), args.grid * args.grid
    K = torch.tensor([[1.1 * 8 * args.grid, 0, 4 * args.grid], [0, 1.1 * 8 * args.grid, 4 * args.grid], [0, 0, 1.0]])
    E = torch.eye(4).repeat(1, args.views, 1, 1)
    E[0, :, 0, 3] = torch.arange(args.views) * -0.5  # cameras side by side
    cameras = hrope.Cameras(K.repeat(1, args.views, 1, 1), E, (8 * args.grid, 8 * args.grid))
    normal = torch.randn(1, args.views * P, 3, generator=generator) * 0.3
    normal[..., 2] = -1.0
    planes = hrope.Planes(normal, 1.0 + torch.rand(1, args.views * P, generator=generator))
    is_patch = torch.ones(args.views, 1 + P, dtype=torch.bool)
    is_patch[:, 0] = False
    L = args.views * (1 + P)
    q, k, v = (torch.randn(1, args.heads, L, args.head_dim, generator=generator) for _ in range(3))
    positions = is_patch.flatten().nonzero().flatten().tolist()
    return dict(cameras=cameras, grid=grid, planes=planes, camera_tokens=positions, q=q, k=k, v=v)


def transformers_calls(args, x: dict) -> tuple[dict, list[tuple[str, str]]]:
    """hrope.integrations.transformers through transformers' attention interface (as a model calls it)
    against hrope.multiview_attention, the library's prepared transform, and transformers' own sdpa.
    ``decode``: one new text query over the L cached tokens and itself, a step of generation with a cache."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hrope.integrations.transformers import NAME, Geometry

    adapter, hf_sdpa = ALL_ATTENTION_FUNCTIONS[NAME], ALL_ATTENTION_FUNCTIONS["sdpa"]
    module = torch.nn.Module()  # what the attention functions read from a model's attention layer
    module.is_causal, module.num_key_value_groups = False, 1
    q, k, v, scale = x["q"], x["k"], x["v"], args.head_dim**-0.5
    where = dict(cameras=x["cameras"], grid=x["grid"], planes=x["planes"], camera_tokens=x["camera_tokens"])

    def geometry() -> Geometry:
        return Geometry(args.encoding, **where)

    reused, decoding = geometry(), geometry()
    prepared = reused.transform(q.shape[2], args.head_dim, q.dtype)
    # decoding: the cache holds the L tokens and one text token, the new query
    q1, k1, v1 = q[:, :, :1], torch.cat([k, k[:, :, :1]], 2), torch.cat([v, v[:, :, :1]], 2)
    decoding.transform(k1.shape[2], args.head_dim, q.dtype)  # the prompt: fixes the camera tokens' positions
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
        "transformers sdpa": lambda: hf_sdpa(module, q, k, v, None, scaling=scale),
        "multiview_attention": lambda: hrope.multiview_attention(q, k, v, encoding=args.encoding, scale=scale, **where),
        "adapter": lambda: adapter(module, q, k, v, None, scaling=scale, hrope_geometry=geometry()),
        "prepared once": lambda: prepared.attention(q, k, v, scale=scale),
        "adapter, geometry reused": lambda: adapter(module, q, k, v, None, scaling=scale, hrope_geometry=reused),
        "decode: transformers sdpa": lambda: hf_sdpa(module, q1, k1, v1, None, scaling=scale),
        "decode: adapter": lambda: adapter(module, q1, k1, v1, None, scaling=scale, hrope_geometry=decoding),
    }
    pairs = [
        ("adapter", "multiview_attention"),
        ("adapter, geometry reused", "prepared once"),
        ("adapter", "transformers sdpa"),
        ("adapter, geometry reused", "transformers sdpa"),
        ("transformers sdpa", "sdpa"),
        ("decode: adapter", "decode: transformers sdpa"),
    ]
    return calls, pairs


def diffusers_calls(args, x: dict) -> tuple[dict, list[tuple[str, str]]]:
    """hrope.integrations.diffusers: the processor's attention step on the same q, k, v against
    hrope.multiview_attention and the library's prepared transform, and a whole diffusers
    ``Attention`` layer (projections included) with the processor against diffusers' own
    ``AttnProcessor2_0``. A fresh SceneGeometry per call prepares the encoding, as the first layer
    of a forward pass does; a reused one is what every later layer gets."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from hrope.integrations.diffusers import MultiViewAttnProcessor, SceneGeometry

    q, k, v, L = x["q"], x["k"], x["v"], x["q"].shape[2]
    processor = MultiViewAttnProcessor(args.encoding)
    where = dict(cameras=x["cameras"], grid=x["grid"], planes=x["planes"])
    layout = dict(camera_tokens=x["camera_tokens"], length=L)

    def geometry():
        return SceneGeometry(**where).tokens(**layout)

    reused = geometry()
    prepared = reused.transform(processor.encoding, args.head_dim, q.dtype)
    layers = {}
    for name, layer_processor in (("diffusers", AttnProcessor2_0()), ("hrope", processor)):
        layers[name] = Attention(query_dim=args.heads * args.head_dim, heads=args.heads, dim_head=args.head_dim)
        layers[name].set_processor(layer_processor)
    hidden = q.transpose(1, 2).flatten(2)  # (1, L, heads * head_dim)
    calls = {
        "multiview_attention": lambda: hrope.multiview_attention(
            q, k, v, encoding=processor.encoding, camera_tokens=x["camera_tokens"], **where
        ),
        "processor": lambda: processor.attention(q, k, v, None, False, geometry()),
        "prepared once": lambda: prepared.attention(q, k, v),
        "processor, geometry reused": lambda: processor.attention(q, k, v, None, False, reused),
        "Attention + AttnProcessor2_0": lambda: layers["diffusers"](hidden),
        "Attention + processor": lambda: layers["hrope"](hidden, geometry=geometry()),
        "Attention + processor, geometry reused": lambda: layers["hrope"](hidden, geometry=reused),
    }
    pairs = [
        ("processor", "multiview_attention"),
        ("processor, geometry reused", "prepared once"),
        ("Attention + processor", "Attention + AttnProcessor2_0"),
        ("Attention + processor, geometry reused", "Attention + AttnProcessor2_0"),
    ]
    return calls, pairs


ADAPTERS = {"transformers": transformers_calls, "diffusers": diffusers_calls}


def interleaved(calls: dict, reps: int) -> dict[str, list[float]]:
    """Seconds of every call in each of ``reps`` repetitions (calls back to back), after one warm-up."""
    for fn in calls.values():
        fn()
    seconds = {name: [] for name in calls}
    for _ in range(reps):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--encoding", default="hrope")
    parser.add_argument("--adapters", nargs="*", choices=sorted(ADAPTERS), default=sorted(ADAPTERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, x: dict) -> dict[str, list[dict]]:
    """Per adapter, one row per reported pair: the median per-repetition ratio and the call's median ms."""
    results = {}
    with torch.no_grad():
        for name in args.adapters:
            calls, pairs = ADAPTERS[name](args, x)
            seconds = interleaved(calls, args.reps)
            results[name] = [
                {
                    "call": call,
                    "relative_to": ref,
                    "ratio": statistics.median(a / b for a, b in zip(seconds[call], seconds[ref])),
                    "median_ms": 1e3 * statistics.median(seconds[call]),
                }
                for call, ref in pairs
            ]
    return results


def write_outputs(meta: dict, results: dict[str, list[dict]], out: Path) -> None:
    """``adapter_overhead.{json,md}`` in ``out``; the table is also printed."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "adapter_overhead.json", {"meta": meta, "results": results})
    lines = [
        f"Adapter overhead, `{meta['encoding']}`: {meta['shape']}, {meta['threads']} thread(s), median over "
        f"{meta['reps']} interleaved repetitions of the per-repetition ratio.",
        f"Command: `{meta['command']}` (torch {meta['torch']}).  ",
        f"Commit: `{describe(meta['provenance'])}`.",
        "",
        "| adapter | call | relative to | ratio |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {r['call']} | {r['relative_to']} | {r['ratio']:.2f} |"
        for name, rows in results.items()
        for r in rows
    ]
    write_text(out / "adapter_overhead.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = inputs(args, torch.Generator().manual_seed(0))
    results = measure(args, x)
    L = x["q"].shape[2]
    meta = {
        "command": "python " + " ".join(["benchmarks/adapter_overhead.py", *(sys.argv[1:] if argv is None else argv)]),
        "torch": torch.__version__,
        "threads": args.threads,
        "reps": args.reps,
        "shape": f"B=1, {args.heads} heads, {args.views} views x {args.grid}x{args.grid} patches + 1 cls token "
        f"per view (L={L}), head_dim {args.head_dim}, fp32 cpu, forward",
        "encoding": args.encoding,
        "machine": platform.processor() or platform.machine(),
        "provenance": provenance(),
    }
    write_outputs(meta, results, args.out)
    return results


if __name__ == "__main__":
    main()
