"""The video-LLM recipe of the HRoPE paper's Table 6 on a tiny Qwen2-style decoder from transformers.

Frames are views: each of F frames brings grid_h x grid_w visual tokens (random embeddings stand
in for the vision tower and projector) and its own camera; HRoPE encodes the visual tokens, the
text tokens (prompt, frame separators, question, answer) get the identity, and the decoder keeps
its causal mask and its own 1D RoPE. Greedy generation runs with transformers' cache, and a
full forward over prompt + answer (no cache) checks that it gives the same logits::

    python examples/video_llm_qwen2.py [--frames 4] [--grid 3 4] [--new-tokens 8]

The model is randomly initialised from a config (no download), so the answer is arbitrary tokens.
"""

from __future__ import annotations

import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import hrope
from hrope.integrations.transformers import NAME, Geometry

HIDDEN, VOCAB = 64, 128


def trajectory(frames: int, grid: tuple[int, int], patch: int = 14) -> hrope.Cameras:
    """A camera walking forward 0.2 per frame while turning 3 degrees per frame (OpenCV axes)."""
    H, W = grid[0] * patch, grid[1] * patch
    K = torch.tensor([[1.1 * W, 0, W / 2], [0, 1.1 * W, H / 2], [0, 0, 1]])
    poses = []
    for f in range(frames):
        a = torch.tensor(0.05 * f)
        R = torch.tensor([[a.cos(), 0, -a.sin()], [0, 1, 0], [a.sin(), 0, a.cos()]])
        E = torch.eye(4)
        E[:3, :3], E[:3, 3] = R, -R @ torch.tensor([0.0, 0.0, 0.2 * f])
        poses.append(E)
    return hrope.Cameras(K.expand(1, frames, 3, 3), torch.stack(poses)[None], image_size=(H, W))


def video_prompt(
    model: Qwen2ForCausalLM, frames: torch.Tensor, prefix: torch.Tensor, separator: int, question: torch.Tensor
) -> tuple[torch.Tensor, list[int]]:
    """``[prefix, frame 1, sep, ..., frame F, sep, question]`` as input embeddings ``(1, L, hidden)``,
    and the sequence positions of the visual tokens (frame-major, row-major inside a frame)."""
    embed = model.get_input_embeddings()
    parts, positions, length = [embed(prefix)], [], prefix.shape[1]
    for frame in frames.unbind(1):  # (1, P, hidden) each
        positions += range(length, length + frame.shape[1])
        parts += [frame, embed(torch.tensor([[separator]]))]
        length += frame.shape[1] + 1
    parts.append(embed(question))
    return torch.cat(parts, 1), positions


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--grid", type=int, nargs=2, default=(3, 4))
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--encoding", default="hrope")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        attn_implementation=NAME,
    )
    model = Qwen2ForCausalLM(config).eval()
    grid = tuple(args.grid)
    P = grid[0] * grid[1]
    frames = torch.randn(1, args.frames, P, HIDDEN) * 0.02  # stand-in for the projected vision features
    prompt, positions = video_prompt(model, frames, torch.randint(1, VOCAB, (1, 4)), 1, torch.randint(1, VOCAB, (1, 6)))
    # planes per visual token: fronto-parallel at depth 2 here; a plane head or a depth model in practice
    planes = hrope.Planes(
        torch.tensor([0.0, 0.0, -1.0]).expand(1, args.frames * P, 3), torch.full((1, args.frames * P), 2.0)
    )
    cameras = trajectory(args.frames, grid)

    def geometry() -> Geometry:  # one per model call or generation
        return Geometry(args.encoding, cameras, grid, planes=planes, camera_tokens=positions)

    with torch.no_grad():
        with geometry():  # generate() takes no extra model kwargs: the geometry is entered instead
            out = model.generate(
                inputs_embeds=prompt,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        answer = out.sequences  # (1, new tokens): generate with inputs_embeds returns the new ones only
        full = torch.cat([prompt, model.get_input_embeddings()(answer[:, :-1])], 1)
        logits = model(inputs_embeds=full, hrope_geometry=geometry()).logits[0, prompt.shape[1] - 1 :]
    cached = torch.cat(out.logits)  # float32, one row per generated token
    difference = (logits.float() - cached).abs().max().item()
    print(
        f"{args.encoding} on {args.frames} frames x {P} visual tokens among {prompt.shape[1]} prompt tokens; "
        f"answer {answer[0].tolist()}; cached vs full-forward logits differ by at most {difference:.1e}"
    )
    return {"answer": answer, "cached_logits": cached, "full_logits": logits, "camera_positions": positions}


if __name__ == "__main__":
    main()
