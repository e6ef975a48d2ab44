"""The settings in words: a resolved config with each key's doc (``hrope config``) and the reference
of every setting (docs/config.md), both read from the schema (:data:`hrope.nvs.config.SETTINGS`,
:class:`hrope.nvs.config.PredictorOptions`, :class:`hrope.nvs.data.SyntheticConfig`)."""

from __future__ import annotations

import math

import yaml

from .running.atomic import write_text
from .config import SETTINGS, SHORTCUTS, SOURCE_OPTIONS, PredictorOptions, Setting, settings_of
from .data.synthetic import SyntheticConfig

__all__ = ["describe_config", "config_reference", "REFERENCE_PATH"]

REFERENCE_PATH = "docs/config.md"
# the settings of a mapping-valued key, by its dotted name
NESTED = {"model.predictor_options": PredictorOptions, "data.synthetic": SyntheticConfig}


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


def describe_config(config: dict) -> str:
    """``config`` (a resolved run config) as YAML with each key's one-line doc as a comment; it
    loads back (``yaml.safe_load``) as ``config``."""
    lines = []
    for section, values in config.items():
        lines.append(f"{section}:")
        for key, value in values.items():
            nested = NESTED.get(f"{section}.{key}")
            lines += _lines(key, value, SETTINGS[section].get(key), "  ", settings_of(nested) if nested else {})
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
        if f"{prefix}{name}" in shortcuts:
            notes.append(f"shortcut `--{shortcuts[prefix + name]}`")
        doc = declared.doc + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(
            f"| `{prefix}{name}` | `{_cell(_yaml(declared.default))}` | {_cell(declared.check.describe())} | "
            f"{_cell(doc)} |"
        )
    return lines


def _predictor_options() -> list[str]:
    lines = ["| option | sources (default) | accepts | what it is |", "|---|---|---|---|"]
    for name, declared in settings_of(PredictorOptions).items():
        sources = ", ".join(f"{source} (`{_cell(_yaml(SOURCE_OPTIONS[source][name]))}`)" for source in declared.sources)
        lines.append(f"| `{name}` | {sources} | {_cell(declared.check.describe())} | {_cell(declared.doc)} |")
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
        "Each parameter source (`model.predictor`) accepts the options that name it; the default is per",
        "source. `targets`: `learned` also accepts `hidden`, its default.",
        "",
    ]
    lines += _predictor_options() + [""]
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
