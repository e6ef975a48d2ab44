"""Every setting of a run config, declared once: its default, what it accepts and a one-line doc.

Sections (frozen dataclasses, fields declared with :func:`hrope.nvs.config.fields.setting`, each
checking its values when built): ``model`` (:data:`PRESET` plus :class:`ModelSettings`, the fields
of :class:`hrope.nvs.config.ModelConfig`), ``data`` (:class:`DataSettings`), ``train``
(:class:`TrainSettings`) and ``eval`` (:class:`EvalSettings`); :data:`SETTINGS` holds them as
``{section: {key: Setting}}``. ``model.predictor_options`` are the options of the predictor, one
class per source (:mod:`hrope.nvs.config.options`); ``data.synthetic`` takes
:class:`hrope.nvs.data.SyntheticConfig` fields. A setting added to ``data``, ``train`` or ``eval``
(or to the model) is declared ``sparse=True``: a plain form names it only off its default
(:func:`hrope.nvs.config.fields.plain_values`), so the defaults, saved configs, checkpoints and
saved models keep their form and hashes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ...encodings.base import BACKENDS
from ...rays import RAY_FRAMES
from .fields import ConfigError, Field, Setting, check_fields, setting, settings_of
from .options import PREDICTORS, SourceOptions

__all__ = [
    "DEVICES",
    "DEPTH_SOURCES",
    "CAPTURES_KIND",
    "CAPTURE_PROTOCOLS",
    "GEOMETRY_SOURCES",
    "BACKGROUNDS",
    "CAPTURE_KEYS",
    "VIEW_SAMPLINGS",
    "NORMALIZATIONS",
    "LPIPS_NETS",
    "PERCEPTUAL_LOSSES",
    "PRESET",
    "ModelSettings",
    "DataSettings",
    "TrainSettings",
    "EvalSettings",
    "SETTINGS",
    "SHORTCUTS",
    "OPEN_SECTIONS",
    "defaults",
    "check_device",
]

DEVICES = ("auto", "cpu", "cuda")
DEPTH_SOURCES = ("none", "points", "maps")  # data.depth (hrope.nvs.data.real.depth_maps)
CAPTURES_KIND = "captures"  # data.kind of posed captures cut into 3-view scenes (hrope.nvs.data.real.captures)
CAPTURE_PROTOCOLS = ("views", "captures")  # data.protocol (hrope.nvs.data.real.view_splits)
GEOMETRY_SOURCES = ("none", "sfm", "priors")  # data.geometry (hrope.nvs.data.real.capture_geometry)
BACKGROUNDS = ("photo", "composite")  # data.background (hrope.nvs.data.real.captures)
VIEW_SAMPLINGS = ("uniform", "lvsm")  # data.view_sampling (hrope.nvs.data.dataset)
NORMALIZATIONS = ("context", "lvsm")  # data.normalize (hrope.nvs.data.normalize)
LPIPS_NETS = ("alex", "vgg")  # eval.lpips_net (hrope.nvs.evaluation.metrics.LPIPS)
PERCEPTUAL_LOSSES = ("lpips", "vgg19")  # train.perceptual_loss (hrope.nvs.running.train_step.perceptual_loss)

_COUNT = Field("int", low=1)
_SEED = Field("int", low=0, high=2**63 - 1)
_NON_NEGATIVE = Field("float", low=0)
_OPTIONAL_PATH = Field("path", nullable=True)

PRESET = Setting(
    "preset",
    "tiny",
    Field("str", nullable=True),
    "architecture preset (hrope.nvs.model.PRESETS: tiny, small, paper, lvsm) giving image_size, patch_size, "
    "dim, layers, heads; null: the ModelSettings defaults",
    shortcut="preset",
)


@dataclass(frozen=True)
class ModelSettings:
    """The model section's fields (:class:`hrope.nvs.config.ModelConfig` checks them, the encoding
    and predictor names against their registries, and the rules across them)."""

    image_size: int = setting(64, _COUNT, "square image side in pixels (a multiple of patch_size)", shown=False)
    patch_size: int = setting(8, _COUNT, "patch side in pixels (one token per patch)", shown=False)
    dim: int = setting(128, _COUNT, "token width (heads of even size)", shown=False)
    layers: int = setting(4, _COUNT, "transformer blocks", shown=False)
    heads: int = setting(4, _COUNT, "attention heads", shown=False)
    mlp_ratio: float = setting(4.0, Field("float", above=0), "MLP hidden width / dim", shown=False)
    qk_norm: bool = setting(True, Field("bool"), "RMS-normalise queries and keys before the encoding", shown=False)
    qk_norm_eps: float | None = setting(
        None,
        Field("float", above=0, nullable=True),
        "QK-norm epsilon (null: the dtype's; LVSM: 1e-5)",
        shown=False,
        sparse=True,
    )
    encoding: str = setting(
        "none", Field("str"), "positional encoding: a hrope.ENCODINGS name or <name>-ape", shortcut="encoding"
    )
    encoding_options: dict = setting({}, Field("mapping"), "keyword options of the encoding's constructor", shown=False)
    rays: str = setting(
        "auto",
        Field("str", choices=("auto", *RAY_FRAMES)),
        "Plücker ray frame: auto (world for none and *-ape, else camera), world or camera",
        shown=False,
    )
    predictor: str = setting(
        "learned",
        Field("str"),
        "parameter source of encodings with per-token inputs: " + ", ".join(PREDICTORS),
        shortcut="predictor",
    )
    predictor_options: SourceOptions = setting(
        {}, Field("mapping"), "options of the predictor (its SourceOptions: model.predictor_options below)", shown=False
    )
    depth_init: float = setting(
        1.0,
        Field("float", above=0),
        "neutral depth of decoded planes and depths (scene units: the context baseline)",
        shown=False,
    )
    additive: str | None = setting(
        None,
        Field("str", nullable=True),
        "a parameterised encoding (hrope.nvs.model.APE_ENCODINGS) whose per-token values, from the "
        "predictor, are embedded and added to the tokens on top of `encoding` (one without per-token "
        "inputs); <name>-ape is encoding none with additive <name>",
        shown=False,
    )
    transform_backend: str = setting(
        "torch",
        Field("str", choices=BACKENDS),
        "how the encoding's transforms are applied (auto: the fused Triton kernel on CUDA); float rounding only",
        shown=False,
        resume=True,
    )
    checkpoint_blocks: bool = setting(
        False,
        Field("bool"),
        "training: recompute each block's activations in the backward pass (less memory, same gradients; LVSM does)",
        shown=False,
        sparse=True,
        resume=True,
    )
    folded_attention: bool = setting(
        False,
        Field("bool"),
        "fold the encoding's per-view camera factors into the attention projection weights "
        "(hrope.nn fold=True; same weights and outputs up to float rounding)",
        shown=False,
        resume=True,
    )


@dataclass(frozen=True)
class DataSettings:
    """The data section (``data.kind`` is checked where the dataset is built, :mod:`hrope.nvs.build_data`)."""

    def __post_init__(self) -> None:
        check_fields(self, "data", ConfigError)

    kind: str = setting(
        "room",
        Field("str"),
        "synthetic: room | object; real (hrope.nvs.data.LOADERS): re10k | co3d | dl3dv | ...; captures "
        "(posed captures cut into 3-view scenes, docs/real_data.md)",
    )
    root: str | None = setting(None, _OPTIONAL_PATH, "real data: the dataset folder (required for real kinds)")
    note: str | None = setting(
        None,
        Field("str", nullable=True),
        "free text, not read: e.g. what a dataset given to hrope.nvs.running.train(dataset=...) holds",
        sparse=True,
        resume=True,
    )
    eval_root: str | None = setting(
        None, _OPTIONAL_PATH, "real data: held-out folder for evaluation (null: root)", resume=True
    )
    eval_index: str | None = setting(
        None, _OPTIONAL_PATH, "RE10K evaluation index JSON (2 context + 3 targets per scene), eval only", resume=True
    )
    context_gap: list | None = setting(
        None,
        Field("range", nullable=True),
        "[low, high] frames between the outer context views, low >= num_context - 1 (null: kind default)",
    )
    view_sampling: str = setting(
        "uniform", Field("str", choices=VIEW_SAMPLINGS), "training views (docs/data.md): uniform or lvsm", sparse=True
    )
    normalize: str = setting(
        "context",
        Field("str", choices=NORMALIZATIONS),
        "scene frame and scale (docs/data.md): context or lvsm",
        sparse=True,
    )
    num_scenes: int | None = setting(
        256, Field("int", low=1, nullable=True), "synthetic: training scenes; real data: at most this many (null: all)"
    )
    num_context: int = setting(2, _COUNT, "context views per example")
    num_target: int = setting(1, _COUNT, "target views per example")
    seed: int = setting(0, _SEED, "seed of the scenes and the views drawn")
    cache: bool = setting(
        True,
        Field("bool"),
        "synthetic: keep generated scenes in memory; real: keep decoded views on disk (cache_dir)",
        resume=True,
    )
    prefetch: bool = setting(True, Field("bool"), "load the next step's scenes in a background thread", resume=True)
    synthetic: dict | None = setting(
        {},
        Field("mapping", nullable=True),
        "synthetic kinds: overrides of hrope.nvs.data.SyntheticConfig fields (e.g. {fov_deg: [40, 60]})",
    )
    depth: str = setting(
        "none",
        Field("str", choices=DEPTH_SOURCES),
        "real folder kinds: none | points (COLMAP points3D.txt) | maps (depth_file_path per frame)",
    )
    depth_scale: float = setting(
        0.001, Field("float", above=0), "scene units per count of a 16-bit PNG depth map (0.001: millimetres)"
    )
    image_factor: int | None = setting(
        None,
        Field("int", low=1, nullable=True),
        "real folder kinds: read images_N/ (1: images/); null: images/, else the smallest N",
    )
    undistort: bool = setting(
        True, Field("bool"), "real data: undistort lens-distorted captures to pinhole images (false: ignore, warn)"
    )
    cache_dir: str | None = setting(
        None,
        _OPTIONAL_PATH,
        "real data, data.cache on: folder of decoded views (null: $XDG_CACHE_HOME/hrope/images)",
        resume=True,
    )
    workers: int = setting(
        0,
        Field("int", low=0),
        "real data: threads decoding the views of one example (0: the loading thread)",
        resume=True,
    )

    protocol: str = setting(
        "views",
        Field("str", choices=CAPTURE_PROTOCOLS),
        "captures: what is held out (docs/real_data.md): views (every test_every-th view of each capture) "
        "or captures (those named in held_out)",
        sparse=True,
    )
    held_out: list = setting(
        [],
        Field("names"),
        "captures, protocol captures: capture folder names giving only test and validation targets",
        sparse=True,
    )
    test_every: int = setting(
        8,
        Field("int", low=3),
        "captures: view i is a test target when i % N == 0, a validation target when i % N == N // 2",
        sparse=True,
    )
    test_every_by_capture: dict = setting(
        {}, Field("mapping"), "captures: test_every of the captures named ({name: N}; e.g. {scan24: 4})", sparse=True
    )
    geometry: str = setting(
        "none",
        Field("str", choices=GEOMETRY_SOURCES),
        "captures: context depth from none | sfm (points triangulated from the training views) | priors "
        "(monocular priors aligned to those points, with their normals)",
        sparse=True,
    )
    background: str = setting(
        "photo",
        Field("str", choices=BACKGROUNDS),
        "captures: photo (as taken) or composite (the masked object over background_color; needs object masks)",
        sparse=True,
    )
    background_color: list = setting(
        [1.0, 1.0, 1.0], Field("color"), "captures, background composite: the plain colour (RGB in [0, 1])", sparse=True
    )
    context_choices: int = setting(
        2,
        Field("int", low=2),
        "captures, training: each target's 2 contexts are drawn from its N nearest training views at every "
        "step (2: always the nearest two)",
        sparse=True,
    )
    sfm_cache_dir: str | None = setting(
        None,
        _OPTIONAL_PATH,
        "captures, geometry sfm or priors: folder of the triangulated points (null: sfm/ in the image cache "
        "folder when data.cache is on)",
        sparse=True,
        resume=True,
    )


CAPTURE_KEYS = (  # the keys only data.kind captures reads
    "protocol",
    "held_out",
    "test_every",
    "test_every_by_capture",
    "geometry",
    "background",
    "background_color",
    "context_choices",
    "sfm_cache_dir",
)


@dataclass(frozen=True)
class TrainSettings:
    """The train section."""

    def __post_init__(self) -> None:
        check_fields(self, "train", ConfigError)

    out: str = setting(
        "runs/default", Field("path"), "run folder (config, checkpoint, logs)", resume=True, shortcut="out"
    )
    steps: int = setting(1000, _COUNT, "optimizer steps (the cosine schedule's length)", shortcut="steps")
    batch_size: int = setting(4, _COUNT, "examples per step (per rank)", shortcut="batch-size")
    lr: float = setting(4e-4, Field("float", above=0), "peak AdamW learning rate", shortcut="lr")
    min_lr_ratio: float = setting(0.1, Field("float", low=0, high=1), "final learning rate / lr (cosine decay)")
    warmup: int = setting(100, Field("int", low=0), "linear warm-up steps")
    weight_decay: float = setting(0.05, _NON_NEGATIVE, "AdamW weight decay")
    grad_clip: float = setting(
        1.0, Field("float", above=0), "gradient-norm bound (clipping is always on; a large value is a no-op)"
    )
    skip_grad_factor: float | None = setting(
        None,
        Field("float", low=1, nullable=True),
        "skip the update of a step whose gradient norm exceeds this x grad_clip (null: never; LVSM: 5)",
        sparse=True,
    )
    bf16: bool = setting(False, Field("bool"), "bf16 autocast")
    seed: int = setting(0, _SEED, "seed of the weights and the batch order", shortcut="seed")
    device: str = setting(
        "auto", Field("str", choices=DEVICES), "auto (CUDA when available) | cpu | cuda", resume=True, shortcut="device"
    )
    log_every: int = setting(10, _COUNT, "steps between log lines", resume=True)
    image_every: int = setting(200, Field("int", low=0), "steps between image grids (0: none)", resume=True)
    checkpoint_every: int = setting(250, _COUNT, "steps between checkpoints", resume=True)
    perceptual_weight: float = setting(
        0.0,
        _NON_NEGATIVE,
        "weight of the perceptual loss (perceptual_loss) added to the MSE; > 0 needs its local weights",
    )
    perceptual_loss: str = setting(
        "lpips", Field("str", choices=PERCEPTUAL_LOSSES), "lpips (eval.lpips_weights) or vgg19 (LVSM's)", sparse=True
    )
    vgg19_weights: str | None = setting(
        None, _OPTIONAL_PATH, "local VGG-19 weights of perceptual_loss vgg19 (torchvision layout)", sparse=True
    )
    parameter_lr_scale: float = setting(
        1.0, _NON_NEGATIVE, "learning-rate multiplier of the parameter source's heads (planes, ...)"
    )
    threads: int = setting(0, Field("int", low=0), "torch CPU threads; 0 keeps torch's default", resume=True)
    max_nonfinite_steps: int = setting(
        20, _COUNT, "stop with an error after this many consecutive non-finite steps", resume=True
    )
    dist_timeout: int = setting(
        600, _COUNT, "torchrun: seconds a rank waits for the others at a collective, then stops", resume=True
    )
    init_from: str | None = setting(
        None,
        _OPTIONAL_PATH,
        "fine-tune: start from the model weights of this run, checkpoint or saved model folder (fresh "
        "optimizer, step 0; the parameters another encoding adds start from their initialisation)",
    )


@dataclass(frozen=True)
class EvalSettings:
    """The eval section (it may change on resume, except ``lpips_weights`` / ``lpips_net`` under an LPIPS loss)."""

    def __post_init__(self) -> None:
        check_fields(self, "eval", ConfigError)

    num_scenes: int | None = setting(
        16,
        Field("int", low=1, nullable=True),
        "held-out scenes (synthetic eval split; real data: the first N, null: all)",
        resume=True,
    )
    batch_size: int = setting(4, _COUNT, "examples per evaluation batch", resume=True)
    lpips_weights: str | None = setting(
        None,
        _OPTIONAL_PATH,
        "local weights of the LPIPS backbone (lpips_net) and its heads; null: LPIPS unavailable",
        resume=True,
    )
    lpips_net: str = setting(
        "alex", Field("str", choices=LPIPS_NETS), "LPIPS backbone: alex or vgg (LVSM's)", resume=True, sparse=True
    )
    num_grid_scenes: int = setting(4, Field("int", low=0), "scenes in the evaluation image grid", resume=True)
    split: str = setting(
        "eval",
        Field("str", choices=("eval", "val")),
        "held-out scenes scored: eval (the test scenes) or val (validation scenes, disjoint from both, "
        "for choosing options; synthetic kinds and captures)",
        resume=True,
    )


SETTINGS: dict[str, dict[str, Setting]] = {
    "model": {"preset": PRESET, **settings_of(ModelSettings)},
    "data": settings_of(DataSettings),
    "train": settings_of(TrainSettings),
    "eval": settings_of(EvalSettings),
}
# sections that accept keys their resolved defaults do not show (model values are checked by ModelConfig)
OPEN_SECTIONS = ("model",)
SHORTCUTS = {
    s.shortcut: f"{section}.{s.name}" for section, entries in SETTINGS.items() for s in entries.values() if s.shortcut
}


def defaults() -> dict:
    """The default run config ``{section: {key: value}}`` (a fresh copy; model: the shown keys only)."""
    return {
        section: {key: copy.deepcopy(s.default) for key, s in entries.items() if s.shown}
        for section, entries in SETTINGS.items()
    }


def check_device(name, key: str = "train.device") -> torch.device:
    """The torch device of a device option (one of :data:`DEVICES`; ``auto`` is CUDA when
    available); a :class:`ConfigError` naming ``key`` otherwise, and for ``cuda`` without CUDA."""
    Field("str", choices=DEVICES).check(key, name)
    available = torch.cuda.is_available()
    if name == "cuda" and not available:
        raise ConfigError(
            f"{key} is 'cuda' but torch.cuda.is_available() is False (no CUDA device or a CPU-only "
            f"torch build); use cpu or auto"
        )
    return torch.device("cuda" if available and name != "cpu" else "cpu")
