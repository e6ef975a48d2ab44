"""Saved models (hrope.nvs.pretrained): a round trip gives the same outputs, `hrope export` of a run
gives a folder `hrope eval` scores like the run itself, writes are atomic, and every damaged or
missing file is a one-line error that never unpickles."""

from __future__ import annotations

import errno
import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from _lvsm_helpers import SMALL_MODEL, small_config, synthetic_batch
from test_cli import SMALL, TINY

from hrope.nvs.cli import run
from hrope.nvs.model import LVSM, ModelConfig
from hrope.nvs.running.atomic import StorageError
from hrope.nvs.running.tensor_files import read_safetensors
from hrope.nvs.pretrained import (
    CARD_NAME,
    CONFIG_NAME,
    PRETRAINED_FORMAT,
    WEIGHTS_NAME,
    PretrainedError,
    from_pretrained,
    load_pretrained,
    save_pretrained,
)

DATA = Path(__file__).parent / "data"


def small_model(encoding: str = "hrope-lift", **options) -> LVSM:
    torch.manual_seed(0)
    model = LVSM(ModelConfig(**SMALL_MODEL, encoding=encoding, **options))
    with torch.no_grad():  # non-zero plane heads, so that the planes they predict matter
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved hrope-lift model and its outputs on a synthetic batch."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    model = small_model()
    batch = synthetic_batch(num_scenes=2)
    with torch.no_grad():
        expected = model(batch).images
    save_pretrained(model, folder, config=small_config(encoding="hrope-lift"), step=7)
    return folder, batch, expected


def test_a_round_trip_gives_the_same_outputs_and_files(saved):
    folder, batch, expected = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    model, info = load_pretrained(folder)
    with torch.no_grad():
        assert torch.equal(model(batch).images, expected)
    assert not model.training and isinstance(from_pretrained(folder), LVSM)
    assert info["format"] == PRETRAINED_FORMAT and info["step"] == 7 and info["evaluation"] is None
    assert info["config"].model.encoding == "hrope-lift" and info["config"].data.num_scenes == 2
    card = (folder / CARD_NAME).read_text()
    assert card.startswith("---\nlibrary_name: hrope\n") and "- hrope-lift\n" in card
    assert "trained for 7 steps" in card and "Not evaluated" in card
    assert "| `model.dim` | `48` |" in card
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_the_model_class_saves_and_loads_itself(saved, tmp_path):
    """``LVSM.from_pretrained`` / ``model.save_pretrained``: the functions above are these methods."""
    folder, batch, expected = saved
    model = LVSM.from_pretrained(folder)
    with torch.no_grad():
        assert torch.equal(model(batch).images, expected) and not model.training
    info = load_pretrained(folder)[1]
    again = model.save_pretrained(tmp_path / "again", config=info["config"], step=info["step"])
    for name in (CONFIG_NAME, CARD_NAME):  # the same folder
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name
    assert same_weights_file(again, folder)


def test_a_folder_saved_before_the_typed_config_loads_and_saves_the_same(tmp_path):
    """tests/data/saved_model_v1: a saved hrope-lift model written by the code before the run config had
    types (seeded, with non-zero plane heads); it loads, and saving it again gives the same config.json
    and weights."""
    folder = DATA / "saved_model_v1"
    model, info = load_pretrained(folder)
    assert isinstance(model, LVSM) and info["step"] == 3
    config = info["config"]
    assert (config.model.encoding, config.model.dim, config.model.predictor_options.per_layer) == (
        "hrope-lift",
        16,
        False,
    )
    with torch.no_grad():
        out = model(synthetic_batch_of(16))
    assert out.images.shape == (1, 1, 3, 16, 16) and out.parameters[0]["planes"].abs().max() > 0
    again = model.save_pretrained(tmp_path / "again", config=config, step=info["step"])
    assert (again / CONFIG_NAME).read_bytes() == (folder / CONFIG_NAME).read_bytes()
    assert same_weights_file(again, folder)


def same_weights_file(a: Path, b: Path) -> bool:
    """The same tensors and metadata (checksum included) in both ``model.safetensors``; the order of the
    metadata keys in the header is safetensors' own, not stable from one write to the next."""
    (tensors_a, metadata_a), (tensors_b, metadata_b) = (read_safetensors(f / WEIGHTS_NAME) for f in (a, b))
    same = tensors_a.keys() == tensors_b.keys() and all(torch.equal(tensors_a[k], tensors_b[k]) for k in tensors_a)
    return same and metadata_a == metadata_b


def synthetic_batch_of(size: int):
    from hrope.nvs.data.batch import collate_scenes
    from hrope.nvs.data.synthetic import make_scene

    return collate_scenes([make_scene(0, 0, "room", num_views=3, image_size=(size, size))], 2)


def test_saving_never_replaces_what_it_should_not(saved, tmp_path, monkeypatch):
    folder, _, _ = saved
    model = small_model("prope")
    with pytest.raises(PretrainedError, match="already holds a saved model; overwrite=True"):
        save_pretrained(model, folder)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(PretrainedError, match="holds something else than a saved model"):
        save_pretrained(model, other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(PretrainedError, match="is an existing file"):
        save_pretrained(model, tmp_path / "file")

    target = tmp_path / "model"
    save_pretrained(small_model("hrope-lift"), target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a model")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("hrope.nvs.model_folder.save_file", fail)  # the write fails half way
    with pytest.raises(StorageError) as caught:
        save_pretrained(model, target, overwrite=True)
    assert str(caught.value) == (
        f"cannot write {target}: No space left on device (ENOSPC); the previous saved model in {target} is "
        "intact and no temporary folder is left; free space"
    )
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "model", "notes"]  # no temporary left
    monkeypatch.undo()
    save_pretrained(model, target, overwrite=True)  # replaced whole
    assert from_pretrained(target).config.encoding == "prope"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "model", "notes"]


def test_non_finite_weights_are_not_saved(tmp_path):
    model = small_model("prope")
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    with pytest.raises(PretrainedError, match="non-finite weights in head.weight"):
        save_pretrained(model, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def damaged_copy(saved, tmp_path, damage) -> str:
    folder = tmp_path / "copy"
    folder.mkdir()
    for path in saved[0].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    damage(folder)
    return str(folder)


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def other_architecture(folder):
    info = json.loads((folder / CONFIG_NAME).read_text())
    info["config"]["model"]["layers"] = 3
    (folder / CONFIG_NAME).write_text(json.dumps(info))


def pickled_weights(folder):
    (folder / WEIGHTS_NAME).write_bytes(pickle.dumps({"head.weight": [1.0]}))


DAMAGES = {
    "no config": (lambda f: (f / CONFIG_NAME).unlink(), "holds neither a run's checkpoint.safetensors nor"),
    "config not JSON": (lambda f: (f / CONFIG_NAME).write_text("{"), "config.json is not JSON"),
    "other format": (
        lambda f: (f / CONFIG_NAME).write_text('{"format": "x"}'),
        "is not an hrope saved model (format 'x'",
    ),
    "bad config value": (
        lambda f: (f / CONFIG_NAME).write_text(json.dumps({"format": PRETRAINED_FORMAT, "config": {"model": 3}})),
        "config.json: its config is invalid",
    ),
    "no weights": (lambda f: (f / WEIGHTS_NAME).unlink(), "model.safetensors is missing"),
    "truncated weights": (
        lambda f: (f / WEIGHTS_NAME).write_bytes((f / WEIGHTS_NAME).read_bytes()[:100]),
        "is not a readable safetensors file",
    ),
    "pickled weights": (pickled_weights, "is not a readable safetensors file"),
    "a changed byte": (lambda f: flip_last_byte(f / WEIGHTS_NAME), "checksum missing or mismatched"),
    "other architecture": (other_architecture, "does not fit the model (missing: blocks.2."),
}


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_damaged_folders_are_one_line_errors(saved, tmp_path, capsys, case):
    damage, message = DAMAGES[case]
    folder = damaged_copy(saved, tmp_path, damage)
    assert run(["eval", folder]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hrope eval: error: ") and message in err[0], err


@pytest.mark.slow
def test_export_of_a_run_scores_like_the_run(tmp_path, capsys):
    """`hrope export` carries the run's evaluation into the card; `hrope eval` and `hrope viz planes`
    accept the folder, and its scores equal the run's."""
    out, folder = tmp_path / "run", tmp_path / "saved"
    assert run(["train", TINY, "--encoding", "hrope-lift", "--steps", "2", "--out", str(out), *SMALL]) == 0
    assert run(["eval", str(out)]) == 0
    run_results = json.loads((out / "eval" / "results.json").read_text())
    assert run(["export", str(out), str(folder)]) == 0
    assert f"wrote {folder}" in capsys.readouterr().out
    card = (folder / CARD_NAME).read_text()
    assert f"| psnr | {run_results['metrics']['psnr']:.4f} |" in card and "trained for 2 steps" in card
    assert json.loads((folder / CONFIG_NAME).read_text())["evaluation"] == run_results

    assert run(["eval", str(folder)]) == 0
    saved_results = json.loads((folder / "eval" / "results.json").read_text())
    assert saved_results["metrics"] == run_results["metrics"] and saved_results["name"] == run_results["name"]
    assert run(["viz", "planes", str(folder), "--num-scenes", "1"]) == 0
    assert (folder / "viz" / "planes.png").is_file()
    assert run(["eval", str(folder), "--protocol", "views", "--factors", "2", "--num-scenes", "1"]) == 0

    assert run(["export", str(out), str(folder)]) == 2
    assert "--overwrite" in capsys.readouterr().err
