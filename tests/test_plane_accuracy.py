"""Accuracy of predicted planes (hrope.nvs.evaluation.plane_accuracy): the definitions, evaluation, training log,
figure."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from _lvsm_helpers import small_config, synthetic_batch

from hrope.nvs.config import update_config
from hrope import Planes
from hrope.nvs.cli import run
from hrope.nvs.evaluation.evaluate import evaluate
from hrope.nvs.model import build_model
from hrope.nvs.evaluation.plane_accuracy import GROUPS, LOG_NAME, METRICS, measures_planes, plane_accuracy, read_log
from hrope.nvs.running.train import train

NUM_CONTEXT = 2


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(num_scenes=2, num_views=4, num_context=NUM_CONTEXT)


def folded_truth(model, batch) -> torch.Tensor:
    """The batch's true plane vectors on the model's folded sequences ``(B*Vt, (Vc+1)*P, 3)``."""
    m = batch.planes(model.config.patch_size).m(batch.cameras, model.config.grid, torch.float32)
    return model.fold_tokens(m, NUM_CONTEXT, batch.images.shape[1])


def test_exact_planes_give_zero_error(batch):
    model = build_model(small_config(encoding="hrope-lift"))
    accuracy = plane_accuracy([{"planes": folded_truth(model, batch)}], batch, model)
    for group in GROUPS:
        assert accuracy[group]["normal_error_deg"] == pytest.approx(0, abs=1e-4)
        assert accuracy[group]["depth_rel_error"] == pytest.approx(0, abs=1e-6)
    assert "per_layer" not in accuracy  # one entry (a static source's layout): no per-layer lists


def test_neutral_planes(batch):
    """hrope-lift's neutral planes are at infinity: 90 degrees and depth error 1; hrope's are
    fronto-parallel at depth_init: the angle of the true normal to the optical axis."""
    lift = build_model(small_config(encoding="hrope-lift"))
    accuracy = plane_accuracy(lift(batch).parameters, batch, lift)  # zero-initialised heads: neutral output
    for group in GROUPS:
        assert accuracy[group] == {metric: pytest.approx(90.0 if "normal" in metric else 1.0) for metric in METRICS}
        assert accuracy["per_layer"][group] == {"normal_error_deg": [90.0, 90.0], "depth_rel_error": [1.0, 1.0]}

    model = build_model(small_config(encoding="hrope"))
    true_m = folded_truth(model, batch)
    cameras = model.fold_cameras(batch.cameras, NUM_CONTEXT)
    normal, depth = Planes.from_m(true_m).normal_and_depth(cameras, model.config.grid)
    angle = torch.atan2(normal[..., :2].norm(dim=-1), normal[..., 2].abs()).rad2deg()  # to the optical axis
    depth_error = ((depth - model.config.depth_init).abs() / depth).clamp(max=1)
    B, Vt, P = batch.images.shape[0], batch.images.shape[1] - NUM_CONTEXT, model.config.grid[0] ** 2

    def group_mean(x, group):  # the scenes have equal patch counts and every true plane is valid here
        x = x.reshape(B, Vt, NUM_CONTEXT + 1, P)
        return float((x[:, :, :NUM_CONTEXT] if group == "context" else x[:, :, NUM_CONTEXT:]).mean())

    assert torch.isfinite(depth).all() and (depth > 0).all()
    accuracy = plane_accuracy([{"planes": torch.zeros_like(true_m)}], batch, model)  # predicted: at infinity
    for group in GROUPS:
        assert accuracy[group]["normal_error_deg_neutral"] == pytest.approx(group_mean(angle, group), abs=1e-3)
        assert accuracy[group]["depth_rel_error_neutral"] == pytest.approx(group_mean(depth_error, group), abs=1e-5)
        assert accuracy[group]["normal_error_deg"] == 90.0 and accuracy[group]["depth_rel_error"] == 1.0


@pytest.mark.parametrize("degrees", [10.0, 35.0])
def test_a_normal_rotated_by_a_known_angle_gives_that_angle(batch, degrees):
    model = build_model(small_config(encoding="hrope-lift"))
    true_m = folded_truth(model, batch)
    cameras = model.fold_cameras(batch.cameras, NUM_CONTEXT)
    normal, depth = Planes.from_m(true_m).normal_and_depth(cameras, model.config.grid)
    axis = F.normalize(
        torch.linalg.cross(normal, torch.randn(normal.shape, generator=torch.Generator().manual_seed(0))), dim=-1
    )  # perpendicular to the normal
    theta = math.radians(degrees)
    rotated = normal * math.cos(theta) + torch.linalg.cross(axis, normal) * math.sin(theta)
    m = Planes(rotated, depth).m(cameras, model.config.grid)  # same depth on the patch-centre ray
    accuracy = plane_accuracy([{"planes": m}], batch, model)
    for group in GROUPS:
        assert accuracy[group]["normal_error_deg"] == pytest.approx(degrees, abs=1e-3)


def test_sign_of_m_and_masked_ground_truth(batch):
    """m and -m are one plane (a plane crossed behind the camera: depth error 1, normal error 0);
    patches without a true plane (m = 0) are left out."""
    model = build_model(small_config(encoding="hrope-lift"))
    true_m = folded_truth(model, batch)
    accuracy = plane_accuracy([{"planes": -true_m}], batch, model)
    for group in GROUPS:
        assert accuracy[group]["normal_error_deg"] == pytest.approx(0, abs=1e-4)
        assert accuracy[group]["depth_rel_error"] == 1.0

    class WithoutSomePlanes:  # the same batch with half of every view's true planes missing
        def __init__(self, batch):
            self.images, self.cameras, self.num_context = batch.images, batch.cameras, batch.num_context
            self._m = batch.planes(model.config.patch_size).m(batch.cameras, model.config.grid)

        def planes(self, patch_size):
            return Planes.from_m(torch.where(torch.arange(self._m.shape[1])[:, None] % 2 == 0, self._m, 0.0))

    masked = WithoutSomePlanes(batch)
    wrong = torch.where(torch.arange(true_m.shape[1])[:, None] % 2 == 0, true_m, 0.0)  # right where defined
    accuracy = plane_accuracy([{"planes": wrong}], masked, model)
    for group in GROUPS:
        assert accuracy[group]["normal_error_deg"] == pytest.approx(0, abs=1e-4)
        assert accuracy[group]["depth_rel_error"] == pytest.approx(0, abs=1e-6)


def test_only_predicted_planes_are_measured():
    assert measures_planes(build_model(small_config(encoding="hrope-lift")))
    assert measures_planes(build_model(small_config(encoding="hrope")))
    assert not measures_planes(build_model(small_config(encoding="prope")))
    assert not measures_planes(build_model(small_config(encoding="hrope-depth")))
    assert not measures_planes(build_model(small_config(encoding="hrope-lift", predictor="oracle")))


def trained(tmp_path_factory, encoding: str):
    config = small_config(encoding=encoding)
    config = update_config(config, {"train": dict(steps=4, checkpoint_every=2)})
    config = update_config(config, {"train": {"out": str(tmp_path_factory.mktemp(encoding))}})
    train(config, stop_at=3, progress=False)
    return config


@pytest.fixture(scope="module")
def lift_run(tmp_path_factory):
    return trained(tmp_path_factory, "hrope-lift")


def test_training_logs_plane_accuracy_and_resume_appends(lift_run):
    out = lift_run.train.out
    records = read_log(f"{out}/{LOG_NAME}")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert all(0 <= record[g][m] <= (90 if "normal" in m else 1) for g in GROUPS for m in METRICS)
        assert len(record["per_layer"]["target"]["normal_error_deg"]) == 2
        assert record["parameter_grad_norm"] > 0  # the plane heads' gradient, before clipping
    train(lift_run, progress=False)  # resumes from step 3 and appends step 4
    assert [r["step"] for r in read_log(f"{out}/{LOG_NAME}")] == [1, 2, 3, 4]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(f"{out}/tb").Reload().Tags()["scalars"]
    assert {f"planes/{g}/{m}" for g in GROUPS for m in METRICS} | {"train/parameter_grad_norm"} <= set(tags)


def test_evaluate_writes_plane_accuracy_for_predicted_planes_only(lift_run, tmp_path_factory, tmp_path, capsys):
    results = evaluate(lift_run.train.out, tmp_path / "lift")
    assert set(results["planes"]) == {"context", "target", "per_layer"}
    for group in GROUPS:
        assert set(results["planes"][group]) == set(METRICS)
    assert json.loads((tmp_path / "lift" / "results.json").read_text())["planes"] == results["planes"]
    assert "| target |" in (tmp_path / "lift" / "results.md").read_text()

    prope = trained(tmp_path_factory, "prope")
    assert "planes" not in evaluate(prope.train.out, tmp_path / "prope")
    assert "| target |" not in (tmp_path / "prope" / "results.md").read_text()
    assert run(["viz", "plane-accuracy", prope.train.out]) == 2  # prope logs no plane accuracy
    assert f"no {prope.train.out}/{LOG_NAME}" in capsys.readouterr().err


def test_viz_plane_accuracy(lift_run, tmp_path, capsys):
    assert run(["viz", "plane-accuracy", lift_run.train.out, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plane_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run(["viz", "plane-accuracy", str(tmp_path / "nothing")]) == 2
    assert "run not found" in capsys.readouterr().err
