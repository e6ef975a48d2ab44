"""Training: schedule, learning check, checkpoints, exact resume, NaN guard, config errors, DDP."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import random_lpips_weights, small_config, synthetic_batch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import hrope.nvs.train as train_module
from hrope.nvs.config import ConfigError, apply_overrides, load_config, resolve
from hrope.nvs.evaluate import evaluate_model
from hrope.nvs.checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.datasets import build_dataset
from hrope.nvs.model import build_model
from hrope.nvs.train import learning_rate, make_optimizer, train


def config_in(tmp_path: Path, name: str = "run", **model) -> dict:
    config = small_config(**model)
    config["train"]["out"] = str(tmp_path / name)
    return config


def test_learning_rate_warmup_then_cosine():
    opts = {"lr": 1.0, "warmup": 4, "steps": 20, "min_lr_ratio": 0.1}
    lrs = [learning_rate(s, opts) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))  # non-increasing after warmup
    assert learning_rate(20, opts) == pytest.approx(0.1)


@pytest.mark.slow
def test_overfitting_one_scene_drives_psnr_up(tmp_path):
    config = config_in(tmp_path, encoding="prope")
    config["data"].update(num_scenes=1)
    config["train"].update(steps=60, lr=3e-3, warmup=5, checkpoint_every=60, image_every=0)
    dataset = build_dataset(config, "train")
    before = evaluate_model(build_model(config), dataset, 2).means
    model = train(config, progress=False).model
    after = evaluate_model(model, dataset, 2).means
    assert after["psnr"] > before["psnr"] + 3.0, (before, after)


def test_checkpoint_round_trip(tmp_path):
    config = config_in(tmp_path, encoding="hrope")
    model = build_model(config)
    optimizer = make_optimizer(model, config["train"])
    batch = synthetic_batch()
    model(batch).images.mean().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "ckpt.safetensors", model, optimizer, 7, config)
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, then renamed
    fresh = build_model(config)
    fresh_optimizer = make_optimizer(fresh, config["train"])
    info = load_checkpoint(path, fresh, fresh_optimizer)
    assert info["step"] == 7 and info["config"] == config
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], fresh_optimizer.state[q][key])
    loaded, loaded_config = load_model(path)
    assert loaded_config == config and not loaded.training


def parameters_of(path: Path) -> dict:
    return {k: v for k, v in load_file(str(path / "checkpoint.safetensors")).items() if k.startswith("model.")}


@pytest.mark.slow
def test_interrupted_and_resumed_run_equals_uninterrupted_run(tmp_path):
    whole = config_in(tmp_path, "whole", encoding="hrope")
    train(whole, progress=False)
    split = config_in(tmp_path, "split", encoding="hrope")
    first = train(split, stop_at=2, progress=False)
    assert first.step == 2
    second = train(split, progress=False)
    assert second.step == 4
    expected, actual = parameters_of(tmp_path / "whole"), parameters_of(tmp_path / "split")
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    assert (tmp_path / "split" / "config.yaml").is_file() and any((tmp_path / "split" / "tb").iterdir())


def test_non_finite_loss_skips_the_step(tmp_path, monkeypatch):
    config = config_in(tmp_path, encoding="prope")
    config["train"].update(steps=3)
    real_collate = train_module.collate
    calls = []

    def poisoned(scenes, num_context, device):
        batch = real_collate(scenes, num_context, device)
        calls.append(1)
        if len(calls) == 2:
            batch.images = torch.full_like(batch.images, float("nan"))
        return batch

    monkeypatch.setattr(train_module, "collate", poisoned)
    result = train(config, progress=False)
    assert result.skipped_steps == 1 and result.step == 3
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path)  # a folder without checkpoint.safetensors
    (tmp_path / "garbage.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_model(tmp_path / "garbage.safetensors")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CheckpointError, match="not an hrope checkpoint"):
        load_model(tmp_path / "other.safetensors")


def test_config_files_and_overrides(tmp_path):
    config = load_config(Path(__file__).parents[1] / "configs" / "tiny.yaml")
    overrides = ["--encoding", "hrope", "--steps", "7", "--train.lr=1e-3", "--data.cache", "false"]
    config = apply_overrides(config, overrides)
    assert config["model"]["encoding"] == "hrope" and config["train"]["steps"] == 7
    assert config["train"]["lr"] == 1e-3 and config["data"]["cache"] is False
    with pytest.raises(ConfigError, match="unknown config key 'train.stepz'"):
        apply_overrides(config, ["--train.stepz", "3"])
    with pytest.raises(ConfigError, match="unknown option --stepz"):
        apply_overrides(config, ["--stepz", "3"])
    with pytest.raises(ConfigError, match="needs a value"):
        apply_overrides(config, ["--steps"])
    with pytest.raises(ConfigError, match="unknown config section 'optim'"):
        resolve({"optim": {"lr": 1}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad.write_text("train:\n  steps: -5\n")
    with pytest.raises(ConfigError, match="train.steps must be a positive integer"):
        train(load_config(bad), progress=False)


DDP_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    from _lvsm_helpers import small_config
    from hrope.nvs.train import train
    from safetensors.torch import save_file
    config = small_config(encoding="prope")
    config["train"].update(out={out!r}, steps=2)
    model = train(config, progress=False).model
    rank = os.environ["RANK"]
    save_file({{k: v.contiguous() for k, v in model.state_dict().items()}}, {out!r} + f"/rank{{rank}}.safetensors")
""")


@pytest.mark.slow
def test_ddp_two_cpu_processes_keep_identical_parameters(tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent), out=str(out)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(script)], check=True, env=env,
                   timeout=240, capture_output=True)
    rank0, rank1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    initial = build_model(small_config(encoding="prope")).state_dict()
    assert any(not torch.equal(rank0[k], initial[k]) for k in rank0)  # training changed the parameters
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key


@pytest.mark.slow
def test_perceptual_loss_needs_local_weights(tmp_path):
    config = config_in(tmp_path, encoding="none")
    config["train"].update(steps=1, perceptual_weight=0.5)
    with pytest.raises(ConfigError, match="lpips_weights"):
        train(config, progress=False)
    random_lpips_weights(tmp_path / "lpips.safetensors")
    config["eval"]["lpips_weights"] = str(tmp_path / "lpips.safetensors")
    with_lpips = train(config, progress=False).last_loss
    plain = config_in(tmp_path, "plain", encoding="none")
    plain["train"].update(steps=1)
    assert with_lpips > train(plain, progress=False).last_loss + 1e-4  # same first batch, plus 0.5 LPIPS


def test_parameter_lr_scale_applies_to_the_parameter_heads_only(tmp_path):
    config = config_in(tmp_path, encoding="hrope-lift")
    config["train"]["parameter_lr_scale"] = 10.0
    model = build_model(config)
    optimizer = make_optimizer(model, config["train"])
    heads = {id(p) for p in model.source.parameters()}
    for group in optimizer.param_groups:
        inside = {id(p) in heads for p in group["params"]}
        assert len(inside) == 1 and group["lr_scale"] == (10.0 if inside == {True} else 1.0)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    train(config, progress=False)
    with safe_open(str(tmp_path / "run" / "checkpoint.safetensors"), framework="pt") as handle:
        groups = json.loads(handle.metadata()["optimizer_groups"])
    rates = {g["lr_scale"]: g["lr"] for g in groups}  # the last step's learning rates
    assert rates[10.0] == pytest.approx(10 * rates[1.0]) and rates[1.0] > 0
