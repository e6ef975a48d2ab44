"""Fuzzed scene files: a loader returns every valid frame or raises SceneError, nothing else.

Each example copies a valid fixture (tests/test_loaders.py writers, 4 views of 12x16), corrupts it
once (a deleted field, a bad number, a dropped / repeated / shuffled line, a truncated file, a
deleted image) and loads it through the skip-broken-scenes path next to a valid scene: the loaded
scene has exactly the frames the corrupted file still describes, or the scene was skipped with a
warning (a SceneError); any other exception fails the test. RealEstate10K chunks (a fuzzed and
an intact scene) are read with ``skip_errors=False``: the intact scene always loads, scenes the
listing leaves out are counted in a warning, and a truncated chunk is a SceneError.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
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
from test_loaders import V, re10k_example, truth, view_images, write_colmap, write_llff, write_nerfstudio

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BAD_VALUES = [0, -1, 0.5, math.nan, math.inf, -math.inf, 1e308, 10**400, "abc", None, [], True]
BAD_TOKENS = ["0", "-1", "0.5", "nan", "inf", "-inf", "1e308", "1" + "0" * 400, "abc", ""]
OPERATIONS = ["delete", "set", "drop", "repeat", "shuffle", "truncate", "delete image"]


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """One valid scene per format, plus a valid neighbour for the skip path."""
    root = tmp_path_factory.mktemp("valid")
    K, E, _ = truth(60)
    K[:] = K[0]  # shared intrinsics: the top-level fields are fuzzed too
    write_nerfstudio(root / "nerfstudio", K, E, view_images(60))
    write_colmap(root / "colmap", K, E, view_images(61))
    K_llff, E_llff, _ = truth(62, centred=True, square_pixels=True)
    write_llff(root / "llff", K_llff, E_llff, view_images(62), factor=1)
    write_nerfstudio(root / "neighbour", K, E, view_images(63))
    return root


def load_or_skip_check(valid: Path, kind: str, corrupt, caplog) -> None:
    """Copy ``valid/kind``, ``corrupt(folder) -> expected frame count``, load it as scene 0 of a
    folder source whose scene 1 is valid: scene 0 must hold ``expected`` views, or be skipped."""
    caplog.clear()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(valid / kind, root / "a_fuzzed")
        shutil.copytree(valid / "neighbour", root / "b_valid")
        expected = corrupt(root / "a_fuzzed")
        source = make_source("folder", root)
        with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
            scene = source[0]
        event(f"{kind}: {'loaded' if scene.name == 'a_fuzzed' else 'skipped'}")
        if scene.name == "a_fuzzed":
            assert scene.num_views == expected and source.num_skipped == 0
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
