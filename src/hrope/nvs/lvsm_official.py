"""Official LVSM checkpoints (the decoder-only scene model of Haian-Jin/LVSM) as :class:`~hrope.nvs.model.LVSM`.

With the ``none`` encoding and world-frame Plücker rays our model is LVSM's decoder-only
architecture: the same tokenizers, pre-norm blocks (bias-free LayerNorms and linears, RMS QK-norm
with epsilon 1e-5, GELU MLP of ratio 4), input and output LayerNorms and sigmoid head, and the
same rays ``[o x d, d]`` through the pixel centres. :func:`load_official_state` reads an official
state dict into such a model; the weights then fine-tune with any encoding through
``train.init_from`` (save the model with :func:`hrope.nvs.pretrained.save_pretrained` first).

Names (official -> ours): ``image_tokenizer.1`` -> ``context_tokenizer``, ``target_pose_tokenizer.1``
-> ``target_tokenizer``, ``transformer_input_layernorm`` -> ``input_norm``,
``transformer_blocks.{i}.{norm1, norm2}`` -> ``blocks.{i}.{norm1, norm2}``, ``...attn.to_qkv`` ->
``...attn.qkv`` (rows q, k, v, each head-major, in both), ``...attn.fc`` -> ``...attn.out``,
``...attn.{q_norm, k_norm}`` -> the same, ``...mlp.mlp.{0, 2}`` -> ``...mlp.{0, 2}``,
``image_token_decoder.{0, 1}`` -> ``output_norm`` / ``head``.

The one change to the values is the order of the features inside a patch. LVSM flattens a patch
as ``(ph pw c)`` (the pixel's row, then its column, the channel fastest); our patchify
(:func:`hrope.geometry.patchify`) as ``(c ph pw)`` (the channel slowest). So the tokenizers'
columns and the head's rows are permuted (:func:`patch_order`): our feature ``c * p² + k`` is
LVSM's ``k * C + c`` for the pixel ``k = ph * p + pw`` of the patch and channel ``c`` of ``C``
(9 for the context tokenizer: RGB then the 6 ray channels, 6 for the target tokenizer, 3 for the
head). Files are read without unpickling anything else than tensors: safetensors, or
``torch.load(weights_only=True)`` for LVSM's ``.pt`` checkpoints (the state dict under ``model``).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from .model import LVSM, ModelConfig, ModelError
from .running.checkpoints import CheckpointError, load_model_state

__all__ = [
    "OFFICIAL_QK_NORM_EPS",
    "OfficialCheckpointError",
    "read_official_state",
    "official_names",
    "official_config",
    "patch_order",
    "convert_official_state",
    "load_official_state",
]

OFFICIAL_QK_NORM_EPS = 1e-5  # LVSM's RMSNorm default
_WRAPPERS = ("module.", "_orig_mod.")  # DistributedDataParallel and torch.compile prefixes
_IGNORED = ("loss_computer.",)  # the frozen VGG / LPIPS networks of LVSM's loss, saved with the model
_BLOCK = re.compile(r"transformer_blocks\.(\d+)\.")
_RENAMED = {
    "transformer_input_layernorm.weight": "input_norm.weight",
    "image_token_decoder.0.weight": "output_norm.weight",
}
_BLOCK_PARTS = {
    "norm1.weight": "norm1.weight",
    "attn.to_qkv.weight": "attn.qkv.weight",
    "attn.fc.weight": "attn.out.weight",
    "attn.q_norm.weight": "attn.q_norm.weight",
    "attn.k_norm.weight": "attn.k_norm.weight",
    "norm2.weight": "norm2.weight",
    "mlp.mlp.0.weight": "mlp.0.weight",
    "mlp.mlp.2.weight": "mlp.2.weight",
}
# official name -> (ours, channels C of its patches, axis of the patch features)
_PATCHED = {
    "image_tokenizer.1.weight": ("context_tokenizer.weight", 9, 1),
    "target_pose_tokenizer.1.weight": ("target_tokenizer.weight", 6, 1),
    "image_token_decoder.1.weight": ("head.weight", 3, 0),
}


class OfficialCheckpointError(CheckpointError):
    """A file or state dict that is not an official LVSM decoder-only checkpoint."""


def _listed(keys: list[str], limit: int = 3) -> str:
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def read_official_state(source: str | Path | dict) -> dict[str, Tensor]:
    """The tensors of an official checkpoint: a safetensors file, a ``torch.save`` file read with
    ``weights_only=True`` (LVSM's ``.pt`` files keep the state dict under ``model``), or a state
    dict; wrapper prefixes (``module.``, ``_orig_mod.``) removed, the loss networks
    (``loss_computer.*``) dropped."""
    if isinstance(source, dict):
        state = source
    else:
        path = Path(source)
        if not path.is_file():
            raise OfficialCheckpointError(f"official LVSM checkpoint not found: {path}")
        try:
            state = load_file(str(path)) if path.suffix == ".safetensors" else _torch_load(path)
        except OfficialCheckpointError:
            raise
        except Exception as error:  # safetensors and torch.load raise their own types for bad files
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise OfficialCheckpointError(f"{path} is not a readable checkpoint: {first}") from None
    if isinstance(state.get("model"), dict):
        state = state["model"]
    out = {}
    for name, value in state.items():
        for prefix in _WRAPPERS:
            name = name.removeprefix(prefix)
        if isinstance(value, Tensor) and not name.startswith(_IGNORED):
            out[name] = value
    return out


def _torch_load(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise OfficialCheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return state


def official_names(layers: int, qk_norm: bool = True) -> set[str]:
    """The parameter names of an official decoder-only model with ``layers`` blocks."""
    parts = [p for p in _BLOCK_PARTS if qk_norm or "_norm." not in p]
    return {*_RENAMED, *_PATCHED, *(f"transformer_blocks.{i}.{p}" for i in range(layers) for p in parts)}


def _check_names(state: dict[str, Tensor], source: str) -> tuple[int, bool]:
    """``(layers, qk_norm)`` of an official state dict; a one-line error when its names are not
    an official decoder-only model's."""
    layers = 1 + max((int(m.group(1)) for m in map(_BLOCK.match, state) if m), default=-1)
    qk_norm = any(name.endswith("attn.q_norm.weight") for name in state)
    expected = official_names(layers, qk_norm)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected or not layers:
        found = (("missing", missing), ("unexpected", unexpected))
        detail = "; ".join(f"{kind}: {_listed(keys)}" for kind, keys in found if keys) or "no transformer blocks"
        raise OfficialCheckpointError(f"{source} is not an official LVSM decoder-only checkpoint ({detail})")
    return layers, qk_norm


def official_config(
    state: dict[str, Tensor], image_size: int = 256, heads: int | None = None, source: str = "the state dict"
) -> ModelConfig:
    """Our :class:`ModelConfig` of an official state dict (from :func:`read_official_state`):
    encoding ``none``, world-frame rays, LVSM's QK-norm epsilon; dim, patch size, layers, MLP ratio
    and (with QK-norm) heads read from the shapes. ``image_size`` is not stored in the weights
    (LVSM's RE10K model: 256); ``heads`` is needed only for a model without QK-norm."""
    layers, qk_norm = _check_names(state, source)
    dim, features = state["image_tokenizer.1.weight"].shape
    patch = round((features // 9) ** 0.5)
    if qk_norm:
        heads = dim // state["transformer_blocks.0.attn.q_norm.weight"].shape[0]
    elif heads is None:
        raise OfficialCheckpointError(f"{source} has no QK-norm, so its heads cannot be read from it: pass heads")
    hidden = state["transformer_blocks.0.mlp.mlp.0.weight"].shape[0]
    values = dict(image_size=image_size, patch_size=patch, dim=dim, layers=layers, heads=heads)
    values.update(mlp_ratio=hidden / dim, qk_norm=qk_norm, qk_norm_eps=OFFICIAL_QK_NORM_EPS if qk_norm else None)
    try:
        return ModelConfig(**values, encoding="none", rays="world")
    except ModelError as error:
        raise OfficialCheckpointError(f"{source}: {error}") from None


def patch_order(channels: int, patch_size: int) -> Tensor:
    """``index (C * p²,)``: our patch feature ``i`` (``(c ph pw)`` order) is LVSM's feature
    ``index[i]`` (``(ph pw c)`` order), so ``weight[:, index]`` turns an official tokenizer into
    ours and ``weight[index]`` an official head."""
    pixels = patch_size**2
    c, k = torch.meshgrid(torch.arange(channels), torch.arange(pixels), indexing="ij")  # ours: c * p² + k
    return (k * channels + c).flatten()


def convert_official_state(state: dict[str, Tensor], patch_size: int) -> dict[str, Tensor]:
    """An official state dict (names checked by :func:`official_config`) under our names, with the
    tokenizers' and the head's patch features in our order (:func:`patch_order`)."""
    out = {}
    for name, value in state.items():
        if name in _PATCHED:
            ours, channels, axis = _PATCHED[name]
            out[ours] = value.index_select(axis, patch_order(channels, patch_size))
        elif name in _RENAMED:
            out[_RENAMED[name]] = value
        else:
            block = _BLOCK.match(name)
            assert block is not None, name  # official_config checked every name
            out[f"blocks.{block.group(1)}.{_BLOCK_PARTS[name[block.end() :]]}"] = value
    return out


def load_official_state(
    source: str | Path | dict, *, image_size: int = 256, heads: int | None = None, device: str | torch.device = "cpu"
) -> LVSM:
    """An :class:`LVSM` (eval mode, float32, on ``device``) with the weights of an official LVSM
    decoder-only checkpoint ``source`` (a file or a state dict: :func:`read_official_state`),
    configured by :func:`official_config`. It renders what the official model renders (on the
    official test vectors: at most 4.8e-7 apart in float32, pixels in [0, 1]). A file that is not
    such a checkpoint raises :class:`OfficialCheckpointError`, one line naming the missing and
    unexpected keys."""
    name = "the state dict" if isinstance(source, dict) else str(source)
    state = read_official_state(source)
    config = official_config(state, image_size, heads, name)
    model = LVSM(config)
    load_model_state(model, convert_official_state(state, config.patch_size), name)
    return model.to(device).eval()
