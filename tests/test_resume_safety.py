"""Resume safety: a resume under another config is refused, harmless keys may change, finished runs say
so, ``train.init_from`` fine-tunes into a new folder, ``segments.jsonl`` records every segment, and
SIGTERM / SIGKILL in a real ``hrope train`` process leave a checkpoint that resumes bit-exactly."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from _lvsm_helpers import small_config
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import hrope
import hrope.nvs.running.runs as runs_module
import hrope.nvs.running.provenance as provenance_module
from hrope.nvs.running.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from hrope.nvs.cli import run
from hrope.nvs.config import ConfigError, resolve, update_config
from hrope.nvs.model import PRESETS, build_model
from hrope.nvs.running.runs import SEGMENTS_NAME, resume_differences
from hrope.nvs.running.train import train
from hrope.nvs.running.train_step import make_optimizer

# (section, key, another value): each changes the trajectory, so a resume with it is refused
REFUSED = [
    ("model", "encoding", "gta"),
    ("model", "encoding", "none"),
    ("model", "dim", 64),
    ("model", "layers", 3),
    ("model", "image_size", 64),
    ("model", "predictor", "oracle"),
    ("model", "encoding_options", {"rope_base": 50.0}),
    ("model", "qk_norm_eps", 1e-5),
    ("data", "kind", "dl3dv"),
    ("data", "root", "elsewhere"),
    ("data", "num_scenes", 5),
    ("data", "num_context", 3),
    ("data", "num_target", 2),
    ("data", "seed", 1),
    ("data", "context_gap", [1, 2]),
    ("data", "synthetic", {"fov_deg": [40, 60]}),
    ("data", "view_sampling", "lvsm"),
    ("data", "normalize", "lvsm"),
    ("train", "seed", 1),
    ("train", "lr", 1e-3),
    ("train", "steps", 8),
    ("train", "min_lr_ratio", 0.5),
    ("train", "warmup", 3),
    ("train", "batch_size", 2),
    ("train", "weight_decay", 0.0),
    ("train", "grad_clip", 0.5),
    ("train", "bf16", True),
    ("train", "parameter_lr_scale", 2.0),
    ("train", "perceptual_weight", 0.5),
    ("train", "perceptual_loss", "vgg19"),
    ("train", "vgg19_weights", "vgg19.safetensors"),
    ("train", "skip_grad_factor", 5.0),
    ("train", "init_from", "a/run"),
]
HARMLESS = [
    ("data", "cache", False),
    ("data", "prefetch", False),
    ("data", "eval_root", "held-out"),
    ("data", "eval_index", "index.json"),
    ("train", "out", "moved"),
    ("train", "device", "cpu"),
    ("train", "threads", 2),
    ("train", "log_every", 3),
    ("train", "image_every", 0),
    ("train", "checkpoint_every", 3),
    ("train", "max_nonfinite_steps", 5),
    ("eval", "num_scenes", 7),
    ("eval", "batch_size", 1),
    ("eval", "lpips_weights", "lpips.safetensors"),
    ("eval", "lpips_net", "vgg"),
    ("model", "checkpoint_blocks", True),
]


def config_in(folder: Path, **changes):
    """The 4-step prope run config training into ``folder``, with ``changes`` (``section__key=value``)."""
    values: dict = {"train": {"out": str(folder)}}
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        values.setdefault(section, {})[key] = value
    return update_config(small_config(encoding="prope"), values)


def weights(folder: Path) -> dict:
    return {k: v for k, v in load_file(str(folder / "checkpoint.safetensors")).items() if k.startswith("model.")}


def assert_same_weights(a: Path, b: Path) -> None:
    expected, actual = weights(a), weights(b)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key


def segments(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / SEGMENTS_NAME).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A whole 4-step prope run and one stopped at step 2 (copy the latter before changing it)."""
    root = tmp_path_factory.mktemp("runs")
    train(config_in(root / "whole"), progress=False)
    train(config_in(root / "half"), stop_at=2, progress=False)
    return root


@given(st.sets(st.sampled_from(range(len(REFUSED) + len(HARMLESS))), max_size=6))
@settings(max_examples=40, deadline=None)
def test_resume_differences_refuse_exactly_the_trajectory_keys(chosen):
    # real data, so that data.root and the evaluation keys are the config's to change
    stored = update_config(small_config(encoding="prope"), {"data": {"kind": "re10k", "root": "scenes"}})
    changes = {f"{s}.{k}": (s, k, v) for s, k, v in ((REFUSED + HARMLESS)[i] for i in sorted(chosen))}
    values: dict = {}
    for section, key, value in changes.values():
        values.setdefault(section, {})[key] = value
    try:
        requested = update_config(stored, values)
    except ConfigError:  # changes that break a rule across keys (e.g. eval_index with dl3dv): no config
        assume(False)
    refused, harmless = resume_differences(stored, requested)
    expected = {name for name, change in changes.items() if change in REFUSED}
    lpips_loss = "train.perceptual_weight" in expected and "train.perceptual_loss" not in changes
    expected |= {
        k for k in ("eval.lpips_weights", "eval.lpips_net") if lpips_loss and k in changes
    }  # it trains with them
    assert set(refused) == expected and set(harmless) == set(changes) - expected
    model = stored.model.fields_dict()  # model fields: the preset / defaults applied
    for name, (section, key, value) in changes.items():
        old = model[key] if section == "model" else getattr(getattr(stored, section), key)
        assert {**refused, **harmless}[name] == (old, value)


def test_a_preset_and_its_explicit_fields_are_the_same_model():
    preset = resolve({**small_config().to_dict(), "model": {"preset": "tiny", "encoding": "prope"}})
    explicit = resolve({**preset.to_dict(), "model": {"preset": None, "encoding": "prope", **PRESETS["tiny"]}})
    assert preset.to_dict() != explicit.to_dict() and preset.model == explicit.model
    assert resume_differences(preset, explicit) == ({}, {})


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("model", "encoding", "gta"),
        ("model", "encoding", "none"),
        ("model", "dim", 64),
        ("train", "seed", 1),
        ("train", "lr", 1e-3),
        ("train", "steps", 8),
        ("train", "steps", 1),
        ("data", "num_scenes", 5),
    ],
)
def test_resume_under_another_config_is_refused_and_changes_nothing(runs, tmp_path, section, key, value):
    folder = tmp_path / "run"
    shutil.copytree(runs / "half", folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    config = config_in(folder, **{f"{section}__{key}": value})
    with pytest.raises(ConfigError) as error:
        train(config, progress=False)
    message = str(error.value)
    assert (
        "\n" not in message
        and f"{section}.{key} {small_config(encoding='prope').to_dict()[section][key]!r} -> {value!r}" in message
        and "train.init_from" in message
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # config.yaml too


def test_another_number_of_ranks_is_refused(runs, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(runs / "half", folder)
    config = config_in(folder)
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
    step = load_checkpoint(folder, model, optimizer)["step"]
    save_checkpoint(folder / "checkpoint.safetensors", model, optimizer, step, config, {"world_size": 2})
    with pytest.raises(ConfigError, match=r"torchrun ranks 2 -> 1"):
        train(config, progress=False)


def test_harmless_changes_resume_exactly_and_keep_the_run_config(runs, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(runs / "half", folder)
    config_yaml = (folder / "config.yaml").read_text()
    changed = config_in(folder, train__log_every=3, train__checkpoint_every=3, data__prefetch=False, eval__num_scenes=1)
    result = train(changed, progress=False)
    assert result.step == 4 and result.outcome == "completed"
    assert_same_weights(runs / "whole", folder)
    assert (folder / "config.yaml").read_text() == config_yaml  # not rewritten with the changed keys
    stored = load_checkpoint(folder)["config"]
    assert stored == config_in(runs / "half") and stored.to_dict() == config_in(runs / "half").to_dict()  # its own
    first, second = segments(folder)
    assert first["outcome"] == "stopped" and (first["start_step"], first["end_step"]) == (0, 2)
    assert second["resumed_from_step"] == 2 and second["end_step"] == second["checkpoint_step"] == 4
    assert second["overrides"] == {
        "data.prefetch": [True, False],
        "eval.num_scenes": [2, 1],
        "train.checkpoint_every": [2, 3],
        "train.log_every": [1, 3],
        "train.out": [str(runs / "half"), str(folder)],
    }  # a copied run folder
    assert second["config_sha256"] != first["config_sha256"]


def test_a_finished_run_reports_already_trained(runs, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(runs / "whole", folder)
    before = (folder / "checkpoint.safetensors").read_bytes()
    last_loss = load_checkpoint(folder)["state"]["last_loss"]
    result = train(config_in(folder), progress=False)
    assert (result.outcome, result.step, result.last_loss) == ("already trained", 4, last_loss)
    assert 0 < last_loss < 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_in(folder).to_dict()))
    assert run(["train", str(tmp_path / "config.yaml")]) == 0
    printed = capsys.readouterr().out
    assert f"trained 4 steps (0 skipped), last loss {last_loss:.5f}" in printed and "nan" not in printed
    assert (folder / "checkpoint.safetensors").read_bytes() == before and len(segments(folder)) == 1


def test_init_from_fine_tunes_from_the_weights_into_a_new_run(runs, tmp_path):
    source = runs / "whole"
    config = config_in(tmp_path / "tuned", model__encoding="gta", train__init_from=str(source))
    start = train(config, stop_at=0, progress=False)  # nothing trained: the loaded weights
    for key, value in start.model.state_dict().items():
        assert torch.equal(value, weights(source)[f"model.{key}"]), key
    assert not (tmp_path / "tuned" / "checkpoint.safetensors").exists()
    result = train(config, progress=False)
    assert result.step == 4 and result.outcome == "completed"
    optimizer_steps = {
        k: v
        for k, v in load_file(str(tmp_path / "tuned" / "checkpoint.safetensors")).items()
        if k.startswith("optimizer.") and k.endswith(".step")
    }
    assert optimizer_steps and all(float(v) == 4 for v in optimizer_steps.values())  # fresh optimizer
    (segment,) = segments(tmp_path / "tuned")
    assert segment["init_from"] == str(source) and segment["resumed_from_step"] is None
    assert segment["start_step"] == 0
    with pytest.raises(ConfigError, match=r"train.init_from None -> "):  # out holds a run without init_from
        train(config_in(source, train__init_from=str(tmp_path / "tuned")), progress=False)


def test_init_from_needs_the_same_architecture(runs, tmp_path):
    config = config_in(tmp_path / "wide", model__dim=64, train__init_from=str(runs / "whole"))
    with pytest.raises(CheckpointError) as error:
        train(config, progress=False)
    message = str(error.value)
    assert "\n" not in message and "does not fit the model (mis-shaped: " in message
    assert re.search(r"\(48, 48\) in the file, \(64, 64\) in the model.*\(\+\d+ more\)", message)
    deeper = config_in(tmp_path / "deep", model__layers=3, train__init_from=str(runs / "whole"))
    with pytest.raises(CheckpointError, match=r"missing: blocks\.2\."):
        train(deeper, progress=False)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        train(config_in(tmp_path / "x", train__init_from=str(tmp_path / "nothing")), progress=False)
    with pytest.raises(ConfigError, match=r"train.init_from must be null or a path \(a non-empty string\), got 3"):
        config_in(tmp_path / "y", train__init_from=3)


def test_segments_record_provenance(runs, tmp_path):
    (first,) = segments(runs / "whole")
    assert first["hrope"] == hrope.__version__ and first["torch"] == torch.__version__
    assert first["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", first["commit"])
    assert first["config_sha256"] == runs_module.config_hash(config_in(runs / "whole"))
    assert first["seconds"] > 0 and first["started"].endswith("+00:00")
    assert (first["start_step"], first["end_step"], first["checkpoint_step"]) == (0, 4, 4)
    outside = tmp_path / "runs.py"  # a copy outside any git checkout
    outside.write_text("")
    assert provenance_module.code_provenance(outside) == {"commit": None, "dirty": None}


def test_provenance_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "")  # no git executable at all
    assert provenance_module.code_provenance() == {"commit": None, "dirty": None}


def run_cli_until_signal(tmp_path: Path, signum: int) -> tuple[Path, int, str, str]:
    """``hrope train`` of a 40-step run in a subprocess, sent ``signum`` right after its first checkpoint
    (step 5); returns the run folder, the exit status, stdout and stderr."""
    folder = tmp_path / "run"
    config = config_in(folder, train__steps=40, train__checkpoint_every=5, train__image_every=0)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))
    process = subprocess.Popen(
        [sys.executable, "-m", "hrope.nvs.cli", "train", str(tmp_path / "config.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 120
    while not (folder / "checkpoint.safetensors").exists() and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.01)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    return folder, process.returncode, stdout, stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(config_in(folder, train__steps=40, train__checkpoint_every=5, train__image_every=0), progress=False)
    return folder


@pytest.mark.slow
def test_sigterm_saves_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, uninterrupted):
    folder, status, stdout, stderr = run_cli_until_signal(tmp_path, signal.SIGTERM)
    assert status == 0, stderr
    (segment,) = segments(folder)
    step = load_checkpoint(folder)["step"]
    assert segment["outcome"] == "terminated" and segment["end_step"] == segment["checkpoint_step"] == step
    # the checkpoint of the step reached (end_step above); a signal that lands while the step-5
    # checkpoint is still being made durable (the folder's fsync after the rename) stops at step 5
    assert 5 <= step < 40
    assert f"SIGTERM: stopped after step {step} of 40" in stderr and f"trained {step} steps" in stdout
    result = train(config_in(folder, train__steps=40, train__checkpoint_every=5, train__image_every=0), progress=False)
    assert result.step == 40 and segments(folder)[-1]["resumed_from_step"] == step
    assert_same_weights(uninterrupted, folder)


@pytest.mark.slow
def test_sigkill_leaves_a_checkpoint_that_resumes_bit_exactly(tmp_path, uninterrupted):
    folder, status, _, stderr = run_cli_until_signal(tmp_path, signal.SIGKILL)
    assert status == -signal.SIGKILL, stderr
    step = load_checkpoint(folder)["step"]
    assert step % 5 == 0 and 5 <= step < 40  # a scheduled checkpoint, complete
    result = train(config_in(folder, train__steps=40, train__checkpoint_every=5, train__image_every=0), progress=False)
    assert result.step == 40 and segments(folder)[-1]["resumed_from_step"] == step
    assert_same_weights(uninterrupted, folder)
