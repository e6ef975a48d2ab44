"""Training: schedule, learning check, checkpoints, exact resume, NaN guard, config errors, DDP."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import random_lpips_weights, small_config, synthetic_batch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import hrope.nvs.running.train as train_module
from hrope.nvs.config import ConfigError, TrainSettings, apply_overrides, load_config, resolve, update_config
from hrope.nvs.evaluation.evaluate import evaluate_model
from hrope.nvs.running.checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.build_data import build_dataset
from hrope.nvs.model import build_model
from hrope import InputError
from hrope.nvs.running.train import TrainingError, train
from hrope.nvs.running.train_step import learning_rate, make_optimizer, train_step


def config_in(tmp_path: Path, name: str = "run", **model):
    return update_config(small_config(**model), {"train": {"out": str(tmp_path / name)}})


def test_learning_rate_warmup_then_cosine():
    opts = TrainSettings(lr=1.0, warmup=4, steps=20, min_lr_ratio=0.1)
    lrs = [learning_rate(s, opts) for s in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))  # non-increasing after warmup
    assert learning_rate(20, opts) == pytest.approx(0.1)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # bf16 rms_norm on a CPU
def test_train_step_schedules_clips_updates_and_skips_a_non_finite_batch():
    """The public one-step function: the schedule's learning rate times each group's lr_scale, the
    MSE of the target views, the gradient clipped to train.grad_clip, the update applied; NaN targets
    change no parameter and no optimiser state; bf16 autocast with train.bf16."""
    config = small_config(encoding="hrope-lift")
    config = update_config(config, {"train": dict(parameter_lr_scale=10.0, grad_clip=1e-3)})
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
    batch = synthetic_batch()
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, optimizer, batch, 0, config.train, measure_heads=True)
    assert result.finite and result.lr == learning_rate(0, config.train)
    assert {g["lr"] for g in optimizer.param_groups} == {result.lr, 10 * result.lr}
    target = batch.images[:, batch.num_context :]
    assert torch.equal(result.loss, torch.nn.functional.mse_loss(result.output.images.float(), target).detach())
    assert result.heads_norm > 0 and float(result.grad_norm) > 1e-3
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert float(clipped) == pytest.approx(1e-3, rel=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    updated = [p.detach().clone() for p in model.parameters()]
    steps = [float(optimizer.state[p]["step"]) for p in model.parameters()]
    batch.images[:, batch.num_context :] = float("nan")  # the targets: a NaN loss and gradient
    skipped = train_step(model, optimizer, batch, 1, config.train)
    assert not skipped.finite and skipped.heads_norm is None and skipped.lr == learning_rate(1, config.train)
    assert all(torch.equal(a, b) for a, b in zip(updated, model.parameters()))
    assert steps == [float(optimizer.state[p]["step"]) for p in model.parameters()]
    config = update_config(config, {"train": {"bf16": True}})
    assert train_step(model, optimizer, synthetic_batch(), 2, config.train).output.images.dtype == torch.bfloat16


@pytest.mark.slow
def test_overfitting_one_scene_drives_psnr_up(tmp_path):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"data": dict(num_scenes=1)})
    config = update_config(config, {"train": dict(steps=60, lr=3e-3, warmup=5, checkpoint_every=60, image_every=0)})
    dataset = build_dataset(config, "train")
    before = evaluate_model(build_model(config), dataset, 2).means
    model = train(config, progress=False).model
    after = evaluate_model(model, dataset, 2).means
    assert after["psnr"] > before["psnr"] + 3.0, (before, after)


def test_checkpoint_round_trip(tmp_path):
    config = config_in(tmp_path, encoding="hrope")
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
    batch = synthetic_batch()
    model(batch).images.mean().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "ckpt.safetensors", model, optimizer, 7, config)
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, then renamed
    fresh = build_model(config)
    fresh_optimizer = make_optimizer(fresh, config.train)
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
    assert first.step == 2 and first.outcome == "stopped"
    second = train(split, progress=False)
    assert second.step == 4 and second.outcome == "completed"
    expected, actual = parameters_of(tmp_path / "whole"), parameters_of(tmp_path / "split")
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    assert (tmp_path / "split" / "config.yaml").is_file() and any((tmp_path / "split" / "tb").iterdir())


def poison_batches(monkeypatch, calls: set[int]) -> None:
    """NaN images in the batches of the given (1-based) collate calls, i.e. steps ``call - 1``."""
    real_collate = train_module.collate
    count = []

    def poisoned(scenes, num_context, device):
        batch = real_collate(scenes, num_context, device)
        count.append(1)
        if len(count) in calls:
            batch.images = torch.full_like(batch.images, float("nan"))
        return batch

    monkeypatch.setattr(train_module, "collate", poisoned)


def test_non_finite_loss_skips_the_step(tmp_path, monkeypatch):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"train": dict(steps=3)})
    poison_batches(monkeypatch, {2})
    result = train(config, progress=False)
    assert result.skipped_steps == 1 and result.step == 3
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def test_only_consecutive_non_finite_steps_count(tmp_path, monkeypatch):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"train": dict(steps=7, max_nonfinite_steps=3)})
    poison_batches(monkeypatch, {2, 3, 5, 6})
    result = train(config, progress=False)
    assert (result.step, result.skipped_steps, result.outcome) == (7, 4, "completed")


def test_a_diverged_run_stops_with_an_error_and_keeps_its_last_checkpoint(tmp_path, monkeypatch):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"train": dict(steps=10, checkpoint_every=3, max_nonfinite_steps=3)})
    poison_batches(monkeypatch, set(range(5, 11)))  # steps 4, 5, 6, ... are non-finite
    with pytest.raises(TrainingError) as error:
        train(config, progress=False)
    path = tmp_path / "run" / "checkpoint.safetensors"
    assert isinstance(error.value, InputError) and str(error.value) == (
        "training diverged: 3 consecutive non-finite steps (4-6) reached train.max_nonfinite_steps = 3; last good "
        f"checkpoint: step 6 in {path}"
    )
    model = build_model(config)
    assert load_checkpoint(path, model)["step"] == 6  # checksum and finite weights verified
    segment = json.loads((tmp_path / "run" / "segments.jsonl").read_text())
    assert (segment["outcome"], segment["end_step"], segment["checkpoint_step"]) == ("diverged", 7, 6)
    fresh = config_in(tmp_path, "fresh", encoding="prope")
    fresh = update_config(fresh, {"train": dict(steps=10, max_nonfinite_steps=2)})
    poison_batches(monkeypatch, {1, 2})
    with pytest.raises(TrainingError, match=r"last good checkpoint: none was written$"):
        train(fresh, progress=False)
    with pytest.raises(ConfigError, match="train.max_nonfinite_steps must be a positive integer, got 0"):
        update_config(fresh, {"train": {"max_nonfinite_steps": 0}})


def test_sigterm_finishes_the_step_saves_and_restores_the_handler(tmp_path, monkeypatch):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"train": dict(steps=4, checkpoint_every=10)})  # no checkpoint before the end
    real_collate = train_module.collate
    count = []

    def terminating(scenes, num_context, device):
        count.append(1)
        if len(count) == 2:  # during step 1
            os.kill(os.getpid(), signal.SIGTERM)
        return real_collate(scenes, num_context, device)

    monkeypatch.setattr(train_module, "collate", terminating)
    received = []
    previous = signal.signal(signal.SIGTERM, lambda *args: received.append(args))
    try:
        mine = signal.getsignal(signal.SIGTERM)
        result = train(config, progress=False)
        assert signal.getsignal(signal.SIGTERM) is mine and not received
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (result.outcome, result.step) == ("terminated", 2)
    assert load_checkpoint(tmp_path / "run")["step"] == 2
    monkeypatch.undo()
    assert train(config, progress=False).step == 4


def test_training_off_the_main_thread_installs_no_handler(tmp_path):
    config = config_in(tmp_path, encoding="prope")
    config = update_config(config, {"train": dict(steps=1)})
    results = []
    worker = threading.Thread(target=lambda: results.append(train(config, progress=False)))
    worker.start()
    worker.join()
    assert [r.step for r in results] == [1]


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
    assert config.model.encoding == "hrope" and config.train.steps == 7
    assert config.train.lr == 1e-3 and config.data.cache is False
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
    from hrope.nvs.config import update_config
    from hrope.nvs.running.train import train
    from safetensors.torch import save_file
    config = small_config(encoding="prope")
    config = update_config(config, {{"train": dict(out={out!r}, steps=2)}})
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
    subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
        check=True,
        env=env,
        timeout=240,
        capture_output=True,
    )
    rank0, rank1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    initial = build_model(small_config(encoding="prope")).state_dict()
    assert any(not torch.equal(rank0[k], initial[k]) for k in rank0)  # training changed the parameters
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key


@pytest.mark.slow
def test_perceptual_loss_needs_local_weights(tmp_path):
    config = config_in(tmp_path, encoding="none")
    with pytest.raises(
        ConfigError, match="train.perceptual_weight > 0 needs local LPIPS weights in eval.lpips_weights"
    ):
        update_config(config, {"train": dict(steps=1, perceptual_weight=0.5)})
    random_lpips_weights(tmp_path / "lpips.safetensors")
    weights = {"lpips_weights": str(tmp_path / "lpips.safetensors")}
    config = update_config(config, {"train": dict(steps=1, perceptual_weight=0.5), "eval": weights})
    with_lpips = train(config, progress=False).last_loss
    plain = config_in(tmp_path, "plain", encoding="none")
    plain = update_config(plain, {"train": dict(steps=1)})
    assert with_lpips > train(plain, progress=False).last_loss + 1e-4  # same first batch, plus 0.5 LPIPS


def test_parameter_lr_scale_applies_to_the_parameter_heads_only(tmp_path):
    config = config_in(tmp_path, encoding="hrope-lift")
    config = update_config(config, {"train": {"parameter_lr_scale": 10.0}})
    model = build_model(config)
    optimizer = make_optimizer(model, config.train)
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
