"""The settings in words: `hrope config` prints a resolved config with each key's doc, docs/config.md is the
generated reference of every setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hrope.nvs.cli import run
from hrope.nvs.config import SETTINGS, SOURCE_OPTIONS, apply_overrides, resolve, settings_of
from hrope.nvs.config_docs import REFERENCE_PATH, config_reference, describe_config
from hrope.nvs.data.synthetic import SyntheticConfig

ROOT = Path(__file__).parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


def test_the_committed_reference_is_the_generated_one():
    assert (ROOT / REFERENCE_PATH).read_text() == config_reference(), "run: python -m hrope.nvs.config_docs"


def test_the_reference_names_every_setting():
    text = config_reference()
    for section, entries in SETTINGS.items():
        for key in entries:
            assert f"| `{section}.{key}` |" in text
    for name, options in SOURCE_OPTIONS.items():
        section = text[text.index(f"### `{name}` (`{options.__name__}`)") :]
        for key in settings_of(options):
            assert f"| `{key}` |" in section.split("\n### ")[0]
    for key in settings_of(SyntheticConfig):
        assert f"| `data.synthetic.{key}` |" in text


def test_described_config_loads_back_and_documents_every_key():
    config = apply_overrides(
        resolve(),
        [
            "--lr",
            "1e-3",
            "--data.synthetic",
            "{fov_deg: [30, 40]}",
            "--model.predictor_options",
            "{targets: neutral}",
            "--model.dim",
            "64",
        ],
    )
    text = describe_config(config)
    assert yaml.safe_load(text) == config.to_dict()
    for line in text.splitlines():
        assert line.endswith(":") and not line.startswith(" ") or " # " in line, line
    assert "    fov_deg: [30, 40]  # horizontal field of view" in text
    assert "    targets: neutral  # target tokens' values" in text
    assert "  lr: 0.001  # peak AdamW learning rate" in text


def test_hrope_config_prints_the_resolved_config(capsys):
    assert run(["config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == resolve().to_dict()
    assert run(["config", TINY, "--steps", "7", "--train.lr=1e-3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 7 and printed["train"]["lr"] == 1e-3
    assert printed["train"]["out"] == yaml.safe_load(Path(TINY).read_text())["train"]["out"]
    assert run(["config", "--model.dim", "true"]) == 2  # the model section is checked too
    assert "model.dim must be a positive integer, got True" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train.step", "3"], "unknown config key 'train.step'; did you mean train.steps? known in 'train': ["),
        (["--trian.steps", "3"], "unknown config section 'trian'; did you mean train? known: ["),
        (["--stepz", "3"], "unknown option --stepz; did you mean --steps? use --section.key"),
    ],
)
def test_hrope_config_suggests_the_closest_key(capsys, args, message):
    assert run(["config", *args]) == 2
    assert f"hrope config: error: {message}" in capsys.readouterr().err
