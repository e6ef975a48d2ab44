"""Files that are not what their name says: a pickle, a truncated file or text under a
``.safetensors``, ``.npy``, ``.npz``, ``.torch``, ``.jgz``, image, calibration or ``transforms.json``
name, for the checkpoints and for every loader. Each is one line naming the file (exit status 2 from
the command), and no payload ever runs (a marker file its unpickling would create never appears)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import small_config

from hrope.nvs.config import update_config
from hrope.nvs import cli
from hrope.nvs.running.checkpoints import CheckpointError, load_checkpoint, load_model, save_checkpoint
from hrope.nvs.data.real.co3d import read_frame_annotations
from hrope.nvs.data.real.loaders import load_scene, make_source
from hrope.nvs.data.real.re10k import RealEstate10KSource, read_chunk
from hrope.nvs.data.real.stereo import read_middlebury
from hrope.nvs.data.scene import SceneError
from hrope.nvs.model import build_model
from test_idr import similarity, write_idr
from test_loaders import (
    co3d_annotation,
    truth,
    view_images,
    write_llff,
    write_nerfstudio,
    write_objaverse,
    zero123_scene,
)
from test_real_stereo import write_middlebury


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


# ---------------------------------------------------------------- pickles in every capture file numpy or torch reads
def pickled_arrays(marker: Path, key: str) -> dict[str, bytes]:
    """Files whose unpickling would run ``Payload`` (create ``marker``): an object array saved as
    ``.npy``, a raw pickle, and an ``.npz`` archive holding an object array under ``key``."""
    array, archive = io.BytesIO(), io.BytesIO()
    np.save(array, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    np.savez(archive, **{key: np.array([Payload(marker)], dtype=object)})
    return {"object array": array.getvalue(), "raw pickle": pickle.dumps(Payload(marker)), "npz": archive.getvalue()}


def llff_capture(folder: Path) -> tuple[Path, dict]:
    K, E, _ = truth(70, centred=True, square_pixels=True)
    write_llff(folder, K, E, view_images(70), factor=1)
    return folder / "poses_bounds.npy", {}


def objaverse_capture(folder: Path) -> tuple[Path, dict]:
    _, _, E = zero123_scene()
    write_objaverse(folder, E, view_images(71, size=(64, 64)))
    return folder / "001.npy", {}


def nerfstudio_depth_capture(folder: Path) -> tuple[Path, dict]:
    K, E, _ = truth(72)
    K[:] = K[0]
    write_nerfstudio(folder, K, E, view_images(72))
    meta = json.loads((folder / "transforms.json").read_text())
    for v, frame in enumerate(meta["frames"]):
        frame["depth_file_path"] = f"depth_{v}.npy"
        np.save(folder / f"depth_{v}.npy", np.ones((12, 16), np.float32))
    (folder / "transforms.json").write_text(json.dumps(meta))
    return folder / "depth_2.npy", {"depth": "maps"}


def idr_capture(folder: Path) -> tuple[Path, dict]:
    K, E, _ = truth(73)
    write_idr(folder, K, E, similarity(73), view_images(73))
    return folder / "cameras.npz", {}


def prior_capture(kind: str):
    def capture(folder: Path) -> tuple[Path, dict]:
        idr_capture(folder)
        for v in range(4):
            np.save(folder / f"{v:06d}_{kind}.npy", np.full((3, 12, 16) if kind == "normal" else (12, 16), 0.5))
        return folder / f"000001_{kind}.npy", {"priors": True}

    return capture


CAPTURES = {
    "LLFF poses_bounds.npy": (llff_capture, "world_mat_0", r"poses_bounds\.npy: (cannot read|expected a numeric)"),
    "Objaverse camera .npy": (objaverse_capture, "world_mat_0", r"001\.npy: (cannot read|expected a numeric)"),
    "nerfstudio depth map .npy": (nerfstudio_depth_capture, "depth", r"frames\[2\]: cannot read depth map .*depth_2"),
    "IDR cameras.npz": (idr_capture, "world_mat_0", r"cameras\.npz: (cannot read|expected an \.npz archive)"),
    "MonoSDF depth prior": (prior_capture("depth"), "depth", r"cannot read depth prior .*000001_depth\.npy"),
    "MonoSDF normal prior": (prior_capture("normal"), "normal", r"cannot read normal prior .*000001_normal\.npy"),
}


@pytest.mark.parametrize("flavour", ["object array", "raw pickle", "npz"])
@pytest.mark.parametrize("capture", CAPTURES)
def test_a_pickle_in_any_capture_file_is_refused_and_never_runs(tmp_path, capture, flavour):
    """Every file a loader reads with numpy, replaced by a pickle whose unpickling would create a marker
    file: one line naming the file, and the marker never appears (``allow_pickle=False`` everywhere)."""
    write, key, message = CAPTURES[capture]
    marker = tmp_path / "pwned"
    path, options = write(tmp_path / "scene")
    path.write_bytes(pickled_arrays(marker, key)[flavour])
    source = make_source("folder", tmp_path / "scene", skip_errors=False, **options)
    with pytest.raises(SceneError, match=message) as error:
        source.load_views(0, [0, 1, 2])
    assert "\n" not in str(error.value)
    assert not marker.exists()


def test_a_pickled_re10k_chunk_or_cache_entry_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "re10k").mkdir()
    torch.save([{"key": "x", "payload": Payload(marker)}], tmp_path / "re10k" / "000000.torch")
    with pytest.raises(SceneError, match=r"no readable") as error:
        RealEstate10KSource(tmp_path / "re10k", skip_errors=False)
    assert "\n" not in str(error.value)
    with pytest.raises(
        SceneError, match=r"000000\.torch: cannot load chunk: UnpicklingError: Weights only load failed"
    ):
        read_chunk(tmp_path / "re10k" / "000000.torch")
    llff_capture(tmp_path / "scene")
    cache = tmp_path / "cache"
    first = load_scene(tmp_path / "scene", (8, 8), cache_dir=cache)
    for entry in cache.rglob("*.npy"):
        entry.write_bytes(pickled_arrays(marker, "image")["object array"])
    assert torch.equal(load_scene(tmp_path / "scene", (8, 8), cache_dir=cache).images, first.images)  # a miss
    assert not marker.exists()


# ---------------------------------------------------------------- cut, corrupt or garbled files of the other loaders
def co3d_file(folder: Path) -> Path:
    K, E, _ = truth(74)
    path = folder / "teddybear" / "frame_annotations.jgz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as file:
        json.dump([co3d_annotation(K, E, v, "s", "ndc_isotropic") for v in range(4)] * 20, file)
    return path


def flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 20 : middle + 20] = bytes(b ^ 0xFF for b in data[middle - 20 : middle + 20])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["cut", "corrupt"])
def test_a_cut_or_corrupt_co3d_annotation_file_is_one_line(tmp_path, damage):
    path = co3d_file(tmp_path)
    if damage == "cut":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    else:
        flip_middle(path)  # a corrupt deflate stream: zlib.error, not an OSError
    with pytest.raises(SceneError, match=r"frame_annotations\.jgz: cannot read gzip JSON: ") as error:
        read_frame_annotations(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("capture", ["LLFF poses_bounds.npy", "Objaverse camera .npy", "MonoSDF depth prior"])
def test_a_cut_npy_file_is_one_line(tmp_path, capture):
    write, _, message = CAPTURES[capture]
    path, options = write(tmp_path / "scene")
    whole = path.read_bytes()
    source = make_source("folder", tmp_path / "scene", skip_errors=False, **options)
    for cut in range(0, len(whole), 37):
        path.write_bytes(whole[:cut])
        with pytest.raises(SceneError, match=message) as error:
            source.load_views(0, [0, 1, 2])
        assert "\n" not in str(error.value)


MIDDLEBURY = {
    "baseline not a number": (
        lambda d: edit_text(d / "calib.txt", "193.001", "1.2.3"),
        r"field baseline must be a number",
    ),
    "camera matrix garbled": (
        lambda d: edit_text(d / "calib.txt", "100.5 0 4.25", "1.0.5 0 4.25"),
        r"field cam0 must be",
    ),
    "camera matrix short": (
        lambda d: edit_text(d / "calib.txt", "0 0 1]\ncam1", "0 1]\ncam1"),
        r"field cam0 needs 9 numbers",
    ),
    "calib not text": (lambda d: (d / "calib.txt").write_bytes(b"\xff\xfe\x00"), r"calib\.txt: not a text file"),
    "calib missing": (lambda d: (d / "calib.txt").unlink(), r"calib\.txt: cannot read"),
    "PFM scale garbled": (
        lambda d: edit_bytes(d / "disp0.pfm", b"-1.0", b"-1e."),
        r"disp0\.pfm: field scale must be a number",
    ),
    "PFM cut": (
        lambda d: (d / "disp0.pfm").write_bytes((d / "disp0.pfm").read_bytes()[:100]),
        r"PFM data is truncated",
    ),
    "PFM of another size": (
        lambda d: edit_bytes(d / "disp0.pfm", b"10 6", b"5 12"),
        r"disp0\.pfm: the disparity is \(12, 5\), the images \(6, 10\)",
    ),
    "image cut": (
        lambda d: (d / "im1.png").write_bytes((d / "im1.png").read_bytes()[:50]),
        r"cannot read image .*im1\.png",
    ),
}


def edit_text(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new, 1))


def edit_bytes(path: Path, old: bytes, new: bytes) -> None:
    path.write_bytes(path.read_bytes().replace(old, new, 1))


@pytest.mark.parametrize("case", MIDDLEBURY)
def test_a_garbled_middlebury_folder_is_one_line(tmp_path, case):
    write_middlebury(tmp_path)
    damage, message = MIDDLEBURY[case]
    damage(tmp_path)
    with pytest.raises(SceneError, match=message) as error:
        read_middlebury(tmp_path)
    assert "\n" not in str(error.value)
