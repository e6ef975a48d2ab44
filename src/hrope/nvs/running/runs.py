"""A run folder's rules: which config changes a resume accepts, and the log of its training segments.

A run folder holds one training run: ``config.yaml``, ``checkpoint.safetensors`` and
``segments.jsonl``, one JSON line per training segment (a first run, then each resume) with its
steps, outcome, harmless overrides and code provenance (:mod:`hrope.nvs.running.provenance`). A resume
must use the run's config: only the keys of :data:`HARMLESS_ON_RESUME` (the settings declared with ``resume=True``,
:data:`hrope.nvs.config.SETTINGS`; the rule is :func:`hrope.nvs.config.harmless_on_resume`) may differ, since
everything else changes the trajectory (docs/model.md, "Training").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from .atomic import append_line
from ..config import HARMLESS_ON_RESUME, RunConfig, harmless_on_resume

__all__ = [
    "SEGMENTS_NAME",
    "HARMLESS_ON_RESUME",
    "config_differences",
    "resume_differences",
    "config_hash",
    "append_segment",
]

SEGMENTS_NAME = "segments.jsonl"


def _flat(config: RunConfig) -> dict:
    """``{"section.key": value}`` of a run config as JSON values: every field of every section (the
    model's with its preset applied, unshown settings at their defaults too)."""
    plain = {"model": config.model.fields_dict()}
    plain.update({section: dataclasses.asdict(getattr(config, section)) for section in ("data", "train", "eval")})
    return {
        f"{section}.{k}": v for section, entries in json.loads(json.dumps(plain)).items() for k, v in entries.items()
    }


def config_differences(old: RunConfig, new: RunConfig) -> dict[str, tuple]:
    """``{"section.key": (old value, new value)}`` for every key whose value differs."""
    a, b = _flat(old), _flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def resume_differences(stored: RunConfig, requested: RunConfig) -> tuple[dict, dict]:
    """``(refused, harmless)``: the :func:`config_differences` of a run's stored config and the
    config it is resumed with, split by :func:`hrope.nvs.config.harmless_on_resume`."""
    differences = config_differences(stored, requested)
    harmless = {k: v for k, v in differences.items() if harmless_on_resume(k, requested)}
    return {k: v for k, v in differences.items() if k not in harmless}, harmless


def config_hash(config: RunConfig) -> str:
    """sha256 of the config's plain form (:meth:`~hrope.nvs.config.RunConfig.to_dict`), keys sorted."""
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()


def append_segment(out: Path, record: dict) -> None:
    """One JSON line per training segment in ``out/segments.jsonl`` (:func:`hrope.nvs.running.atomic.append_line`)."""
    append_line(out / SEGMENTS_NAME, json.dumps(record))
