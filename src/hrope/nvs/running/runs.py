"""A run folder's rules: which config changes a resume accepts, and the log of its training segments.

A run folder holds one training run: ``config.yaml``, ``checkpoint.safetensors`` and
``segments.jsonl``, one JSON line per training segment (a first run, then each resume) with its
steps, outcome, harmless overrides and code provenance (:mod:`hrope.nvs.running.provenance`). A resume
must use the run's config: only the keys of :data:`HARMLESS_ON_RESUME` (the settings declared with ``resume=True``,
:data:`hrope.nvs.config.SETTINGS`) may differ, since everything else changes the trajectory
(docs/model.md, "Training").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .atomic import append_line
from ..config import SETTINGS, setting_value
from ..model import ModelConfig

__all__ = [
    "SEGMENTS_NAME",
    "HARMLESS_ON_RESUME",
    "config_differences",
    "resume_differences",
    "config_hash",
    "append_segment",
]

SEGMENTS_NAME = "segments.jsonl"

# Keys that may differ on resume: where outputs go, how the run is executed and logged, evaluation.
HARMLESS_ON_RESUME = frozenset(
    f"{section}.{key}" for section, entries in SETTINGS.items() for key, declared in entries.items() if declared.resume
)


def _flat(config: dict) -> dict:
    """``{"section.key": value}`` of a run config as JSON values; the model section as the fields of
    its :class:`ModelConfig` (preset applied)."""
    config = json.loads(json.dumps(config))
    values = {f"model.{k}": v for k, v in ModelConfig.from_dict(config["model"]).to_dict().items()}
    for section, entries in config.items():
        if section != "model":  # settings a config leaves out (shown=False) at their defaults
            values.update({f"{section}.{k}": setting_value(entries, section, k) for k in SETTINGS[section]})
    return values


def config_differences(old: dict, new: dict) -> dict[str, tuple]:
    """``{"section.key": (old value, new value)}`` for every key whose value differs."""
    a, b = _flat(old), _flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _harmless(key: str, config: dict) -> bool:
    if key in ("eval.lpips_weights", "eval.lpips_net"):  # an LPIPS perceptual loss trains with these weights
        train = config["train"]
        return not (train["perceptual_weight"] and setting_value(train, "train", "perceptual_loss") == "lpips")
    return key in HARMLESS_ON_RESUME


def resume_differences(stored: dict, requested: dict) -> tuple[dict, dict]:
    """``(refused, harmless)``: the :func:`config_differences` of a run's stored config and the
    config it is resumed with, split by :data:`HARMLESS_ON_RESUME`."""
    differences = config_differences(stored, requested)
    harmless = {k: v for k, v in differences.items() if _harmless(k, requested)}
    return {k: v for k, v in differences.items() if k not in harmless}, harmless


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def append_segment(out: Path, record: dict) -> None:
    """One JSON line per training segment in ``out/segments.jsonl`` (:func:`hrope.nvs.running.atomic.append_line`)."""
    out.mkdir(parents=True, exist_ok=True)
    append_line(out / SEGMENTS_NAME, json.dumps(record))
