"""The settings in words: a resolved config with each key's doc (``hrope config``) and the reference
of every setting (docs/config.md), both read from the schema (:data:`hrope.nvs.config.SETTINGS`,
the sources' :data:`hrope.nvs.config.SOURCE_OPTIONS`, :class:`hrope.nvs.data.SyntheticConfig`)."""

from __future__ import annotations

import math

import yaml

from .running.atomic import write_text
from .config import SETTINGS, SHORTCUTS, SOURCE_OPTIONS, RunConfig, Setting, settings_of
from .data.synthetic import SyntheticConfig

__all__ = ["describe_config", "config_reference", "REFERENCE_PATH"]

REFERENCE_PATH = "docs/config.md"


def _yaml(value) -> str:
    """``value`` as one line of YAML (flow style)."""
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).removesuffix("\n...\n").strip()


def _lines(key: str, value, declared: Setting | None, indent: str, nested: dict[str, Setting]) -> list[str]:
    comment = f"  # {declared.doc}" if declared else ""
    if isinstance(value, dict) and value and nested:
        lines = [f"{indent}{key}:{comment}"]
        for name, entry in value.items():
            lines += _lines(name, entry, nested.get(name), indent + "  ", {})
        return lines
    return [f"{indent}{key}: {_yaml(value)}{comment}"]


def describe_config(config: RunConfig) -> str:
    """``config`` as YAML with each key's one-line doc as a comment; it loads back
    (``yaml.safe_load``) as ``config.to_dict()``."""
    # the settings of a mapping-valued key, by its dotted name
    nested = {
        "model.predictor_options": settings_of(SOURCE_OPTIONS[config.model.predictor]),
        "data.synthetic": settings_of(SyntheticConfig),
    }
    lines = []
    for section, values in config.to_dict().items():
        lines.append(f"{section}:")
        for key, value in values.items():
            lines += _lines(key, value, SETTINGS[section].get(key), "  ", nested.get(f"{section}.{key}", {}))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(entries: dict[str, Setting], prefix: str) -> list[str]:
    shortcuts = {key: name for name, key in SHORTCUTS.items()}
    lines = ["| key | default | accepts | what it is |", "|---|---|---|---|"]
    for name, declared in entries.items():
        notes = []
        if declared.resume:
            notes.append("may change on resume")
        if declared.sparse:
            notes.append("written into a config's plain form only off its default")
        if f"{prefix}{name}" in shortcuts:
            notes.append(f"shortcut `--{shortcuts[prefix + name]}`")
        doc = declared.doc + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"| `{prefix}{name}` | `{_cell(_yaml(declared.default))}` | {_cell(declared.check.describe())} | "
            f"{_cell(doc)} |"
        )
    return lines


def _predictor_options() -> list[str]:
    """One table per parameter source: its options class, each option's default, what it accepts and its doc."""
    lines = []
    for source, options in SOURCE_OPTIONS.items():
        lines += [f"### `{source}` (`{options.__name__}`)", "", (options.__doc__ or "").split("\n")[0], ""]
        lines += ["| option | default | accepts | what it is |", "|---|---|---|---|"]
        for name, declared in settings_of(options).items():
            accepts, doc = _cell(declared.check.describe()), _cell(declared.doc)
            lines.append(f"| `{name}` | `{_cell(_yaml(declared.default))}` | {accepts} | {doc} |")
        lines.append("")
    return lines


def config_reference() -> str:
    """The Markdown reference of every setting (the committed docs/config.md equals it)."""
    lines = [
        "# Config reference",
        "",
        "Every setting of a run config (`hrope train CONFIG`), generated from its one declaration in",
        "`hrope.nvs.config.schema` (and `hrope.nvs.data.SyntheticConfig`) by",
        "`hrope.nvs.config_docs.config_reference()`; do not edit by hand (`python -m hrope.nvs.config_docs`",
        "rewrites it).",
        "`hrope config [FILE] [--section.key VALUE ...]` prints a resolved config with these docs.",
        "Overrides are `--section.key VALUE`; resuming a run accepts changes only to the keys marked",
        '"may change on resume" (and `eval.lpips_weights`, `eval.lpips_net` only without an LPIPS perceptual loss).',
        "",
        "In Python a resolved config is one frozen, typed tree (`hrope.nvs.config.RunConfig`), checked once",
        "when it is built (`resolve`, `load_config`, `update_config`), its keys read as attributes:",
        "`config.model.heads` (a `ModelConfig`, the preset applied), `config.model.predictor_options.targets`",
        "(the options class of `config.model.predictor`, below), `config.data.num_context`,",
        "`config.train.lr`, `config.eval.split`. `config.to_dict()` is its plain form, the YAML below.",
        "",
    ]
    for section, entries in SETTINGS.items():
        lines += [f"## `{section}`", ""]
        if section == "model":
            lines += [
                "`preset`, `encoding` and `predictor` are written into the resolved config; the other fields",
                "take the preset's values, then these defaults, unless given.",
                "",
            ]
        lines += _table(entries, f"{section}.") + [""]
    lines += [
        "## `model.predictor_options`",
        "",
        "Each parameter source (`model.predictor`) has its own options class, `config.model.predictor_options`",
        "in a resolved config (`hrope.nvs.config.SOURCE_OPTIONS`); the options a config leaves out take",
        "these defaults.",
        "",
    ]
    lines += _predictor_options()
    lines += [
        "## `data.synthetic`",
        "",
        "Overrides of the synthetic generator's ranges (`hrope.nvs.data.SyntheticConfig`, synthetic kinds).",
        "",
    ]
    lines += _table(settings_of(SyntheticConfig), "data.synthetic.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_text(REFERENCE_PATH, config_reference())
