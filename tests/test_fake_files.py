"""Files that are not what their name says: a pickle, a truncated file or text under a
``.safetensors``, ``.npy``, image or ``transforms.json`` name. Each is one line naming the file
(exit status 2 from the command), and no payload ever runs."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import small_config

from hrope.nvs.config import update_config
from hrope.nvs import cli
from hrope.nvs.running.checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.data.scene import SceneError
from hrope.nvs.model import build_model
from test_loaders import truth, view_images, write_llff, write_nerfstudio


class Payload:
    """Unpickling it creates ``marker``: the proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory) -> bytes:
    """The bytes of a valid checkpoint of a small untrained model."""
    folder = tmp_path_factory.mktemp("run")
    config = small_config(encoding="prope")
    config = update_config(config, {"train": {"out": str(folder)}})
    save_checkpoint(folder / "checkpoint.safetensors", build_model(config), None, 1, config)
    return (folder / "checkpoint.safetensors").read_bytes()


def fakes(checkpoint: bytes, marker: Path) -> dict[str, bytes]:
    """What a user may find under a checkpoint's name."""
    zipped = io.BytesIO()
    torch.save({"model": Payload(marker)}, zipped)  # torch's zip format, a pickle inside
    return {
        "pickle": pickle.dumps({"model": Payload(marker)}),
        "torch.save": zipped.getvalue(),
        "empty": b"",
        "text": b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n",
        "cut in the header": checkpoint[:5],
        "cut after the header": checkpoint[: 8 + int.from_bytes(checkpoint[:8], "little")],
        "cut in the tensors": checkpoint[: len(checkpoint) - 100],
    }


@pytest.mark.parametrize(
    "kind",
    ["pickle", "torch.save", "empty", "text", "cut in the header", "cut after the header", "cut in the tensors"],
)
def test_a_fake_or_truncated_checkpoint_is_one_line_and_runs_nothing(tmp_path, checkpoint_bytes, kind, capsys):
    marker = tmp_path / "pwned"
    path = tmp_path / "run" / "checkpoint.safetensors"
    path.parent.mkdir()
    path.write_bytes(fakes(checkpoint_bytes, marker)[kind])
    for load in (load_model, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"checkpoint\.safetensors is not a readable safetensors") as error:
            load(path)
        assert "\n" not in str(error.value)
    code = cli.run(["eval", str(path.parent), "--num-scenes", "1", "--out", str(tmp_path / "eval")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "is not a readable safetensors checkpoint" in lines[0]
    assert not marker.exists()


def test_pickled_npy_files_are_refused_unread(tmp_path):
    marker = tmp_path / "pwned"
    K, E, _ = truth(3, centred=True, square_pixels=True)
    write_llff(tmp_path / "scene", K, E, view_images(3), factor=1)
    poses = tmp_path / "scene" / "poses_bounds.npy"
    np.save(poses, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(SceneError, match=r"poses_bounds\.npy: cannot read: .*allow_pickle=False"):
        load_scene(tmp_path / "scene")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"transforms\.json: the file is empty; expected a JSON object with a list 'frames'"),
        ("  \n", r"transforms\.json: the file is empty"),
        ("{}", r"transforms\.json: field 'frames' must be a list"),
        ("[]", r"transforms\.json: field 'frames' must be a list"),
        ('{"frames": []}', r"scene: no frames"),
        ("{'frames': [", r"transforms\.json: cannot read JSON: "),
    ],
)
def test_an_empty_or_malformed_transforms_json_is_one_line(tmp_path, content, message):
    K, E, _ = truth(4)
    K[:] = K[0]
    write_nerfstudio(tmp_path / "scene", K, E, view_images(4))
    (tmp_path / "scene" / "transforms.json").write_text(content)
    with pytest.raises(SceneError, match=message) as error:
        load_scene(tmp_path / "scene")
    assert "\n" not in str(error.value)


def test_a_text_file_under_an_image_name_names_the_frame_and_file(tmp_path):
    K, E, _ = truth(5)
    K[:] = K[0]
    write_nerfstudio(tmp_path / "scene", K, E, view_images(5))
    (tmp_path / "scene" / "images" / "frame_00002.png").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(SceneError, match=r"frames\[2\]: image .*frame_00002\.png is in no image format PIL can read"):
        load_scene(tmp_path / "scene")
