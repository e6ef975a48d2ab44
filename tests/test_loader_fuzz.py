"""Fuzzed scene files: a loader returns every valid frame or raises SceneError, nothing else.

Each example copies a valid fixture (the writers of tests/test_loaders.py, test_colmap_binary.py,
test_idr.py and test_view_maps.py, 4 views of 12x16), corrupts it once (a deleted field, a bad
number, a dropped / repeated / shuffled line or record, a truncated file, flipped bytes, a deleted
image, mask or prior) and loads it through the skip-broken-scenes path next to a valid scene: the
loaded scene has exactly the frames the corrupted file still describes, or the scene was skipped
with a warning (a SceneError); any other exception fails the test. RealEstate10K chunks (a fuzzed
and an intact scene) are read with ``skip_errors=False``: the intact scene always loads, scenes the
listing leaves out are counted in a warning, and a truncated chunk is a SceneError.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hrope.nvs.data.real.loaders import make_source
from hrope.nvs.data.real.re10k import RealEstate10KSource
from hrope.nvs.data.scene import SceneError
from test_colmap_binary import camera_records, image_records, write_records
from test_idr import similarity, write_idr
from test_loaders import V, re10k_example, save_png, truth, view_images, write_colmap, write_llff, write_nerfstudio
from test_view_maps import object_masks

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BAD_VALUES = [0, -1, 0.5, math.nan, math.inf, -math.inf, 1e308, 10**400, "abc", None, [], True]
BAD_TOKENS = ["0", "-1", "0.5", "nan", "inf", "-inf", "1e308", "1" + "0" * 400, "abc", ""]
OPERATIONS = ["delete", "set", "drop", "repeat", "shuffle", "truncate", "delete image"]


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """One valid scene per format, plus valid neighbours for the skip path."""
    root = tmp_path_factory.mktemp("valid")
    K, E, _ = truth(60)
    K[:] = K[0]  # shared intrinsics: the top-level fields are fuzzed too
    write_nerfstudio(root / "nerfstudio", K, E, view_images(60))
    write_colmap(root / "colmap", K, E, view_images(61))
    K_llff, E_llff, _ = truth(62, centred=True, square_pixels=True)
    write_llff(root / "llff", K_llff, E_llff, view_images(62), factor=1)
    write_nerfstudio(root / "neighbour", K, E, view_images(63))
    for name in ("llff_masks", "llff_neighbour"):
        write_llff(root / name, K_llff, E_llff, view_images(64), factor=1)
        for v, mask in enumerate(object_masks(64)):
            save_png(root / name / "masks" / f"IMG_{v:03d}.png", mask)
    for name in ("idr", "idr_neighbour"):
        write_idr(root / name, K, E, similarity(65), view_images(65))
        for v in range(V):
            np.save(root / name / f"{v:06d}_depth.npy", np.full((12, 16), 0.5, np.float32))
            np.save(root / name / f"{v:06d}_normal.npy", np.full((3, 12, 16), 0.25, np.float32))
    return root


def load_or_skip_check(valid: Path, kind: str, corrupt, caplog, neighbour: str = "neighbour", **options) -> None:
    """Copy ``valid/kind``, ``corrupt(folder) -> expected frame count`` (or a set of possible counts),
    load it as scene 0 of a folder source (``options``) whose scene 1 (``neighbour``) is valid: scene 0
    must hold ``expected`` views, or be skipped."""
    caplog.clear()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(valid / kind, root / "a_fuzzed")
        shutil.copytree(valid / neighbour, root / "b_valid")
        expected = corrupt(root / "a_fuzzed")
        source = make_source("folder", root, **options)
        with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
            scene = source[0]
        event(f"{kind}: {'loaded' if scene.name == 'a_fuzzed' else 'skipped'}")
        if scene.name == "a_fuzzed":
            assert scene.num_views in ({expected} if isinstance(expected, int) else expected)
            assert source.num_skipped == 0
        else:
            assert scene.name == "b_valid" and source.num_skipped == 1
            assert "skipping scene folder" in caplog.text and "a_fuzzed" in caplog.text


def truncate(path: Path, data) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1), label="truncate at")])


def delete_image(folder: Path, data) -> None:
    images = sorted((folder / "images").iterdir())
    data.draw(st.sampled_from(images), label="deleted image").unlink()


# ---------------------------------------------------------------- transforms.json
def corrupt_transforms(folder: Path, data) -> int:
    path = folder / "transforms.json"
    operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
    if operation == "truncate":
        truncate(path, data)
        return V
    if operation == "delete image":
        delete_image(folder, data)
        return V - 1  # a listed frame whose image file is absent is skipped
    meta = json.loads(path.read_text())
    frames = meta["frames"]
    expected = V
    fields = [(meta, key) for key in meta if key != "frames"] + [(f, key) for f in frames for key in f]
    if operation == "delete":
        owner, key = data.draw(st.sampled_from(fields), label="deleted field")
        del owner[key]
    elif operation == "set":
        numbers = [(row, j) for f in frames for row in f["transform_matrix"] for j in range(len(row))]
        owner, key = data.draw(st.sampled_from(fields + numbers), label="field")
        owner[key] = data.draw(st.sampled_from(BAD_VALUES), label="value")
        expected -= key == "file_path" and isinstance(owner[key], str)  # an absent image: the frame is skipped
    elif operation == "drop":
        del frames[data.draw(st.integers(0, V - 1), label="dropped frame")]
        expected = V - 1
    elif operation == "repeat":
        frames.append(frames[data.draw(st.integers(0, V - 1), label="repeated frame")])
        expected = V  # a repeated frame (image and camera) is left out with a warning
    else:
        meta["frames"] = data.draw(st.permutations(frames), label="frame order")
    path.write_text(json.dumps(meta))
    return expected


@FUZZ
@given(data=st.data())
def test_fuzzed_transforms_json_loads_every_frame_or_is_skipped(valid, caplog, data):
    load_or_skip_check(valid, "nerfstudio", lambda folder: corrupt_transforms(folder, data), caplog)


# ---------------------------------------------------------------- COLMAP cameras.txt / images.txt
def is_image_line(line: str) -> bool:
    return line.endswith(".png") and not line.startswith("#")


def corrupt_colmap(folder: Path, data) -> int:
    operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
    if operation == "delete image":
        delete_image(folder, data)
        return V - 1  # a listed image whose file is absent is skipped
    path = folder / "sparse/0" / data.draw(st.sampled_from(["cameras.txt", "images.txt"]), label="file")
    if operation == "truncate":
        truncate(path, data)
        return V
    lines = path.read_text().splitlines()
    n = data.draw(st.integers(0, len(lines) - 1), label="line")
    line, expected = lines[n], V
    if operation == "drop":
        del lines[n]
        expected -= is_image_line(line)
    elif operation == "repeat":
        lines.insert(data.draw(st.integers(0, len(lines)), label="at"), line)  # a repeated image: skipped
    elif operation == "shuffle":
        lines = data.draw(st.permutations(lines), label="line order")
    else:  # delete or set a token
        tokens = line.split(" ")
        k = data.draw(st.integers(0, len(tokens) - 1), label="token")
        tokens[k : k + 1] = [] if operation == "delete" else [data.draw(st.sampled_from(BAD_TOKENS), label="value")]
        expected -= operation == "set" and is_image_line(line) and k == 9 and tokens[k] != ""  # another NAME: absent
        lines[n] = " ".join(tokens)
    path.write_text("\n".join(lines) + "\n")
    return expected


@FUZZ
@given(data=st.data())
def test_fuzzed_colmap_model_loads_every_frame_or_is_skipped(valid, caplog, data):
    load_or_skip_check(valid, "colmap", lambda folder: corrupt_colmap(folder, data), caplog)


# ---------------------------------------------------------------- LLFF poses_bounds.npy
def corrupt_llff(folder: Path, data) -> int:
    path = folder / "poses_bounds.npy"
    operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
    if operation == "truncate":
        truncate(path, data)
    elif operation == "delete image":
        delete_image(folder, data)
    else:
        rows = np.load(path)
        if operation == "delete":  # a column
            rows = np.delete(rows, data.draw(st.integers(0, 16), label="deleted column"), axis=1)
        elif operation == "set":
            value = data.draw(st.sampled_from([0.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 1e308]), label="value")
            rows[data.draw(st.integers(0, V - 1), label="row"), data.draw(st.integers(0, 16), label="column")] = value
        elif operation == "drop":
            rows = rows[1:]
        elif operation == "repeat":
            rows = np.concatenate([rows, rows[:1]])
        else:
            rows = rows[data.draw(st.permutations(range(V)), label="row order")]
        np.save(path, rows)
    return V


@FUZZ
@given(data=st.data())
def test_fuzzed_llff_poses_load_every_frame_or_are_skipped(valid, caplog, data):
    load_or_skip_check(valid, "llff", lambda folder: corrupt_llff(folder, data), caplog)


# ---------------------------------------------------------------- COLMAP cameras.bin / images.bin
BAD_DOUBLES = [0.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 1e308]


def corrupt_record(record: bytearray, file: str, data) -> bool:
    """Set one field of a binary record to a bad value; True when it renamed an image."""
    if file == "cameras.bin":
        field = data.draw(st.sampled_from(["CAMERA_ID", "MODEL_ID", "WIDTH", "HEIGHT", "PARAMS"]), label="field")
        at, layout, values = {
            "CAMERA_ID": (0, "<I", [0, 2**32 - 1]),
            "MODEL_ID": (4, "<i", [-1, 7, 99]),
            "WIDTH": (8, "<Q", [0, 2**63]),
            "HEIGHT": (16, "<Q", [0, 2**63]),
        }.get(field, (24 + 8 * data.draw(st.integers(0, 2), label="param"), "<d", BAD_DOUBLES))
    else:
        field = data.draw(st.sampled_from(["IMAGE_ID", "POSE", "CAMERA_ID", "NAME"]), label="field")
        if field == "NAME":
            end = record.index(0, 64)
            record[64:end] = data.draw(st.sampled_from([b"other.png", b"", b"\xff.png"]), label="name")
            return True
        at, layout, values = {
            "IMAGE_ID": (0, "<I", [0, 2**32 - 1]),
            "CAMERA_ID": (60, "<I", [0, 2**32 - 1]),
        }.get(field, (4 + 8 * data.draw(st.integers(0, 6), label="pose entry"), "<d", BAD_DOUBLES))
    record[at : at + struct.calcsize(layout)] = struct.pack(layout, data.draw(st.sampled_from(values), label="value"))
    return False


def corrupt_colmap_binary(folder: Path, data) -> int | set[int]:
    model = folder / "sparse/0"
    records = {"cameras.bin": camera_records(model), "images.bin": image_records(model)}
    for name in ("cameras.txt", "images.txt"):
        (model / name).unlink()
    operation = data.draw(st.sampled_from([*OPERATIONS, "flip"]), label="operation")
    file = data.draw(st.sampled_from(sorted(records)), label="file")
    chosen = [bytearray(record) for record in records[file]]
    k = data.draw(st.integers(0, len(chosen) - 1), label="record")
    count, expected = None, V
    if operation == "delete image":
        delete_image(folder, data)
        expected = V - 1
    elif operation == "set":
        expected = {V - 1, V} if corrupt_record(chosen[k], file, data) else V  # a renamed image is absent
    elif operation in ("drop", "delete"):  # a record left out, its count kept ("delete") or not
        del chosen[k]
        count = None if operation == "drop" else len(chosen) + 1
        expected = V - 1 if file == "images.bin" else V
    elif operation == "repeat":
        chosen.insert(data.draw(st.integers(0, len(chosen)), label="at"), chosen[k])
    elif operation == "shuffle":
        chosen = data.draw(st.permutations(chosen), label="record order")
    records[file] = [bytes(record) for record in chosen]
    for name, entries in records.items():
        write_records(model / name, entries, count if name == file else None)
    if operation == "truncate":
        truncate(model / file, data)
    elif operation == "flip":
        raw = bytearray((model / file).read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1), label="flipped byte")
        raw[at] ^= data.draw(st.integers(1, 255), label="mask")
        (model / file).write_bytes(bytes(raw))
        expected = {V - 1, V}  # a flip in a NAME makes its image absent
    return expected


@FUZZ
@given(data=st.data())
def test_fuzzed_colmap_binary_model_loads_every_frame_or_is_skipped(valid, caplog, data):
    load_or_skip_check(valid, "colmap", lambda folder: corrupt_colmap_binary(folder, data), caplog)


# ---------------------------------------------------------------- IDR / MonoSDF cameras.npz and priors
def corrupt_idr(folder: Path, data) -> int:
    operation = data.draw(st.sampled_from([*OPERATIONS, "prior"]), label="operation")
    path = folder / "cameras.npz"
    if operation == "truncate":
        truncate(path, data)
    elif operation == "delete image":
        (folder / f"{data.draw(st.integers(0, V - 1), label='deleted image'):06d}_rgb.png").unlink()
    elif operation == "prior":
        prior = folder / data.draw(st.sampled_from(sorted(p.name for p in folder.glob("*.npy"))), label="prior")
        action = data.draw(st.sampled_from(["delete", "truncate", "zero", "resize", "range"]), label="prior action")
        if action == "delete":
            prior.unlink()
        elif action == "truncate":
            truncate(prior, data)
        else:
            array = np.load(prior)
            np.save(prior, {"zero": 0 * array, "resize": array[..., :-1], "range": array * 9 - 4}[action])
    else:
        with np.load(path) as archive:
            arrays = dict(archive)
        view = data.draw(st.integers(0, V - 1), label="view")
        if operation == "delete":
            del arrays[data.draw(st.sampled_from([f"world_mat_{view}", f"scale_mat_{view}"]), label="deleted key")]
        elif operation == "set":
            key = data.draw(st.sampled_from([f"world_mat_{view}", f"scale_mat_{view}"]), label="key")
            entry = (data.draw(st.integers(0, 3), label="row"), data.draw(st.integers(0, 3), label="column"))
            arrays[key][entry] = data.draw(st.sampled_from([0.0, -1.0, 0.5, math.nan, math.inf, 1e308]), label="value")
        elif operation == "drop":
            del arrays[f"world_mat_{V - 1}"], arrays[f"scale_mat_{V - 1}"]
        elif operation == "repeat":
            arrays.update({f"world_mat_{V}": arrays["world_mat_0"], f"scale_mat_{V}": arrays["scale_mat_0"]})
        else:
            order = data.draw(st.permutations(range(V)), label="camera order")
            arrays.update({f"world_mat_{v}": arrays[f"world_mat_{order[v]}"].copy() for v in range(V)})
        np.savez(path, **arrays)
    return V


@FUZZ
@given(data=st.data())
def test_fuzzed_idr_cameras_and_priors_load_every_frame_or_are_skipped(valid, caplog, data):
    load_or_skip_check(valid, "idr", lambda folder: corrupt_idr(folder, data), caplog, "idr_neighbour", priors=True)


# ---------------------------------------------------------------- LLFF object masks
def corrupt_masks(folder: Path, data) -> int:
    masks = sorted((folder / "masks").iterdir())
    mask = data.draw(st.sampled_from(masks), label="mask")
    operation = data.draw(
        st.sampled_from(["delete", "truncate", "zero", "resize", "swap", "rename"]), label="operation"
    )
    if operation == "delete":
        mask.unlink()
    elif operation == "truncate":
        truncate(mask, data)
    elif operation in ("zero", "resize"):
        save_png(mask, np.zeros((12, 16), np.uint8) if operation == "zero" else np.full((6, 8), 255, np.uint8))
    elif operation == "swap":
        other = data.draw(st.sampled_from(masks), label="other mask")
        a, b = mask.read_bytes(), other.read_bytes()
        mask.write_bytes(b)
        other.write_bytes(a)
    else:
        mask.rename(mask.with_name(mask.stem + "_mask.png"))  # NeRD's other naming: still found
    return V


@FUZZ
@given(data=st.data())
def test_fuzzed_llff_masks_load_every_frame_or_are_skipped(valid, caplog, data):
    load_or_skip_check(
        valid, "llff_masks", lambda folder: corrupt_masks(folder, data), caplog, "llff_neighbour", masks=True
    )


# ---------------------------------------------------------------- RealEstate10K chunks
def corrupt_chunk(examples: list[dict], data) -> None:
    operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
    example = examples[0]
    if operation == "delete":
        del example[data.draw(st.sampled_from(sorted(example)), label="deleted field")]
    elif operation == "set":
        row, column = data.draw(st.integers(0, V - 1), label="row"), data.draw(st.integers(0, 17), label="column")
        example["cameras"][row, column] = data.draw(st.sampled_from([0.0, -1.0, math.nan, math.inf, 3e38]))
    elif operation == "drop":
        del example["images"][data.draw(st.integers(0, V - 1), label="dropped image")]
    elif operation == "repeat":
        examples.append(dict(example))
    elif operation == "shuffle":
        order = data.draw(st.permutations(range(V)), label="image order")
        example["images"] = [example["images"][i] for i in order]
    elif operation == "delete image":
        example["images"][data.draw(st.integers(0, V - 1), label="emptied image")] = torch.zeros(0, dtype=torch.uint8)
    else:  # truncate a JPEG
        i = data.draw(st.integers(0, V - 1), label="truncated image")
        example["images"][i] = example["images"][i][: data.draw(st.integers(0, len(example["images"][i]) - 1))]


@FUZZ
@given(data=st.data())
def test_fuzzed_re10k_chunk_loads_every_frame_or_raises_scene_error(caplog, data):
    caplog.clear()
    examples = [re10k_example("fuzzed", 64)[0], re10k_example("intact", 65)[0]]
    corrupt_chunk(examples, data)
    with tempfile.TemporaryDirectory() as tmp, caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        path = Path(tmp) / "000000.torch"
        torch.save(examples, path)
        if data.draw(st.booleans(), label="truncate the chunk file"):
            truncate(path, data)
            with pytest.raises(SceneError, match="no readable"):
                RealEstate10KSource(tmp, skip_errors=False)
            return
        source = RealEstate10KSource(tmp, skip_errors=False)
        counted = sum(int(n) for n in re.findall(r"(\d+) scene\(s\) (?:without|repeat)", caplog.text))
        assert len(source) + counted == len(examples)
        for i, key in enumerate(source.keys):
            try:
                scene = source[i]
            except SceneError:
                assert key != "intact"
                continue
            assert scene.num_views == V
