"""experiments/real_planes_figure.py: the planes of one real view from SfM points, from the priors and learned.

On a synthetic object orbit written as a MonoSDF capture with priors (tests/test_captures.py's fixture;
SfM stubbed by the true depth at every 2nd pixel) and a 2-step learned ``hrope-lift`` run: the panels
(i) and (ii) are what the ``external`` source gives that view with the benchmark's options, panel (iii)
the trained model's planes, each turned into normals and ray depths here in float64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from experiments import real_planes_figure as figure
from hrope.errors import InputError
from hrope.nvs import cli
from hrope.nvs.build_data import build_dataset, collate
from hrope.nvs.config import resolve, update_config
from hrope.nvs.data.real import capture_geometry
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.pretrained import load_trained
from hrope.nvs.sources import ExternalSource
from test_captures import FRAMES, NATIVE, NUM_VIEWS, SfmStub, write_capture

SCENE, VIEW = 1, 1  # the second test scene's second context view


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("planes") / "capture"
    write_capture(folder, 1, priors=True)
    return folder


@pytest.fixture
def sfm(monkeypatch) -> SfmStub:
    stub = SfmStub({"capture": make_scene(1, 0, "object", NUM_VIEWS, NATIVE, frames=FRAMES).depth}, stride=2)
    monkeypatch.setattr(capture_geometry, "triangulate", stub.triangulate)
    monkeypatch.setattr(capture_geometry, "sparse_depth", stub.sparse_depth)
    return stub


@pytest.fixture(scope="module")
def run(capture, tmp_path_factory) -> Path:
    """A learned-plane hrope-lift run of 2 steps on the capture (every 4th view a test target), 32 px."""
    tmp_path = tmp_path_factory.mktemp("run")
    preset = Path(__file__).resolve().parents[1] / "configs" / "captures.yaml"
    options = ["--data.root", str(capture), "--data.test_every", "4", "--model.encoding", "hrope-lift"]
    options += ["--model.predictor_options", "{targets: transfer}", "--model.image_size", "32"]
    options += ["--train.steps", "2", "--train.batch_size", "2", "--train.out", str(tmp_path / "run")]
    options += ["--data.cache_dir", str(tmp_path / "cache")]
    assert cli.run(["train", str(preset), *options]) == 0
    return tmp_path / "run"


def normals_and_depth(m: torch.Tensor, K: torch.Tensor, grid: tuple[int, int], patch: int):
    """Unit normals ``-m / |m|`` and the z-depth ``1 / (m · K^-1 (u, v, 1))`` at the patch centres, float64."""
    m = m.double()
    rows, columns = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    pixels = torch.stack([(columns.flatten() + 0.5) * patch, (rows.flatten() + 0.5) * patch, torch.ones(m.shape[0])])
    rays = (torch.linalg.inv(K.double()) @ pixels.double()).T
    return -m / m.norm(dim=-1, keepdim=True), 1.0 / (m * rays).sum(-1)


def external_planes(batch, config, **options) -> torch.Tensor:
    """``m (P, 3)`` of context view VIEW: the external source with ``options`` on ``batch``."""
    model, _ = load_trained(config.train.out)  # its specs: the hrope-lift planes
    source = ExternalSource(model.source.specs, config.model.patch_size, targets="transfer", **options)
    P = config.model.grid[0] * config.model.grid[1]
    return source.static(batch, batch.cameras, config.model.grid, 2)["planes"][0, VIEW * P : (VIEW + 1) * P]


def scene_batch(config, geometry: str):
    data = build_dataset(update_config(config, {"data": {"geometry": geometry}}), "eval")
    return collate([data[SCENE]], 2, torch.device("cpu"))


def check_panel(panel, m, K, config) -> None:
    normals, depth = normals_and_depth(m, K, config.model.grid, config.model.patch_size)
    # float32 planes and rays against float64: measured at most 6.3e-8 (normals) and 8.7e-8 (relative,
    # inverse depth) in the three panels; tolerances 1e-6, a margin over 10x
    torch.testing.assert_close(panel.normals.double(), normals, rtol=0, atol=1e-6)
    torch.testing.assert_close(1 / panel.depth.double(), 1 / depth, rtol=1e-6, atol=0)


def test_the_panels_are_the_sources_planes_of_the_view(run, capture, sfm, tmp_path):
    planes = figure.view_planes(run, capture, SCENE, VIEW)
    _, config = load_trained(run)
    sfm, priors = scene_batch(config, "sfm"), scene_batch(config, "priors")
    K = sfm.cameras.K[0, VIEW]
    assert planes.image.shape == (3, 32, 32) and torch.equal(planes.image, sfm.images[0, VIEW])
    assert torch.equal(planes.sfm_depth, sfm.depth[0, VIEW])
    robust = external_planes(sfm, config, fit="robust", use_normals=False)
    check_panel(planes.panels[0], robust, K, config)
    assert (robust - external_planes(sfm, config)).abs().max() > 1e-3  # the robust fit, not least squares
    with_normals = external_planes(priors, config, use_normals=True)
    check_panel(planes.panels[1], with_normals, K, config)
    assert (with_normals - external_planes(priors, config, use_normals=False)).abs().max() > 1e-3
    model, _ = load_trained(run)
    learned = model(collate([build_dataset(config, "eval")[SCENE]], 2, torch.device("cpu")))
    P = config.model.grid[0] * config.model.grid[1]
    check_panel(planes.panels[2], learned.parameters[-1]["planes"][0, VIEW * P : (VIEW + 1) * P].detach(), K, config)
    assert "2 steps, seed 0" in planes.panels[2].title
    counts = figure.point_counts(planes)
    assert counts.sum() == torch.isfinite(sfm.depth[0, VIEW]).sum() and (counts >= planes.min_points).any()
    path = figure.plot(planes, tmp_path / "planes.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > image.height > 300


def test_bad_arguments_are_one_line_errors(run, capture, sfm):
    with pytest.raises(InputError, match="--view must be 0 or 1"):
        figure.view_planes(run, capture, SCENE, 2)
    command = ["--capture", str(capture), "--learned", str(run), "--out", "unused.png", "--view", "2"]
    with pytest.raises(SystemExit, match="^real_planes_figure.py: error: --view must be 0 or 1"):
        figure.main(command)
    with pytest.raises(InputError, match="--scene 9 is out of range: the capture has 4 test scenes"):
        figure.view_planes(run, capture, 9, 0)
    with pytest.raises(InputError, match="trained on data.kind 'room', not 'captures'"):
        figure._on_capture(resolve({"data": {"kind": "room"}}), capture)
