"""COLMAP binary models: a text model of a scene (the text reader's fixtures) rewritten in COLMAP's
binary layout by an independent writer here (``struct``, from COLMAP's documented format) loads as
the same frames and points; every malformed field or cut file is a one-line SceneError naming the
file, the record and the field."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
import torch

from hrope.nvs.data import make_scene
from hrope.nvs.data.real.colmap import read_colmap_frames
from hrope.nvs.data.real.colmap_points import observed_points, read_points3d, write_colmap_model
from hrope.nvs.data.real.loaders import detect_format, load_scene, make_source
from hrope.nvs.data.scene import SceneError
from test_loaders import V, assert_reprojects, points_in_front, project_cv, truth, view_images, write_colmap

MODEL_IDS = {  # COLMAP's camera model ids (src/colmap/sensor/models.h)
    "SIMPLE_PINHOLE": 0,
    "PINHOLE": 1,
    "SIMPLE_RADIAL": 2,
    "RADIAL": 3,
    "OPENCV": 4,
    "OPENCV_FISHEYE": 5,
    "FULL_OPENCV": 6,
    "FOV": 7,
}


def model_lines(path: Path) -> list[str]:
    """The lines of a text model file that are not comments (blank POINTS2D lines kept)."""
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def camera_records(model: Path) -> list[bytes]:
    records = []
    for line in model_lines(model / "cameras.txt"):
        camera_id, name, width, height, *params = line.split()
        head = struct.pack("<IiQQ", int(camera_id), MODEL_IDS[name], int(width), int(height))
        records.append(head + struct.pack(f"<{len(params)}d", *map(float, params)))
    return records


def image_records(model: Path) -> list[bytes]:
    """One record per image line, its POINTS2D from the line after it (``x y POINT3D_ID`` triples)."""
    lines = model_lines(model / "images.txt")
    records = []
    for image_line, points_line in zip(lines[0::2], lines[1::2]):
        image_id, *pose, camera_id, name = image_line.split(maxsplit=9)
        tokens = points_line.split()
        points = [(float(x), float(y), int(i)) for x, y, i in zip(tokens[0::3], tokens[1::3], tokens[2::3])]
        record = struct.pack("<I7dI", int(image_id), *map(float, pose), int(camera_id)) + name.encode() + b"\0"
        record += struct.pack("<Q", len(points)) + b"".join(struct.pack("<ddq", *point) for point in points)
        records.append(record)
    return records


def point_records(model: Path) -> list[bytes]:
    records = []
    for line in model_lines(model / "points3D.txt"):
        point_id, x, y, z, r, g, b, error, *track = line.split()
        record = struct.pack(
            "<q3d3Bd", int(point_id), float(x), float(y), float(z), int(r), int(g), int(b), float(error)
        )
        pairs = list(zip(track[0::2], track[1::2]))
        records.append(
            record + struct.pack("<Q", len(pairs)) + b"".join(struct.pack("<II", int(i), int(j)) for i, j in pairs)
        )
    return records


def write_records(path: Path, records: list[bytes], count: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(records) if count is None else count) + b"".join(records))


def to_binary(scene: Path, out: Path) -> Path:
    """``out``: a copy of the COLMAP text scene folder ``scene`` whose model is binary instead."""
    shutil.copytree(scene, out)
    model = out / "sparse" / "0"
    write_records(model / "cameras.bin", camera_records(model))
    write_records(model / "images.bin", image_records(model))
    if (model / "points3D.txt").exists():
        write_records(model / "points3D.bin", point_records(model))
    for name in ("cameras.txt", "images.txt", "points3D.txt"):
        (model / name).unlink(missing_ok=True)
    return out


@pytest.fixture(scope="module")
def text_and_binary(tmp_path_factory):
    """The text fixture of test_loaders (four camera models, POINTS2D lines) and its binary twin."""
    root = tmp_path_factory.mktemp("colmap")
    K, E, _ = truth(3)
    for v in (1, 2):  # single-focal models
        K[v, 1, 1] = K[v, 0, 0]
    write_colmap(root / "text", K, E, view_images(3))
    return root / "text", to_binary(root / "text", root / "binary"), K, E


def test_binary_model_gives_the_frames_of_the_text_model(text_and_binary):
    text, binary, K, E = text_and_binary
    assert detect_format(binary) == "colmap"
    from_text, from_binary = read_colmap_frames(text), read_colmap_frames(binary)
    assert (
        [f.image.name for f in from_binary]
        == [f.image.name for f in from_text]
        == [f"img_{v:02d}.png" for v in range(V)]
    )
    for a, b in zip(from_text, from_binary):
        assert torch.equal(a.K, b.K) and torch.equal(a.world_to_cam, b.world_to_cam)
        assert a.intrinsics_size == b.intrinsics_size and a.distortion == b.distortion
        ids = torch.tensor([int(t) for t in a.tracks[1].split()[2::3]], dtype=torch.int64)
        assert torch.equal(b.tracks[1], ids) and b.tracks[0].name == "points3D.bin"
    X = points_in_front(E, 3)
    assert_reprojects(load_scene(binary, undistort=False), project_cv(K, E, X), X)


def test_binary_points_give_the_depth_of_the_text_points(tmp_path):
    """A rendered scene with SfM points (write_colmap_model): the same points, the same sparse depth."""
    scene = make_scene(5, 0, "room", 3, (32, 32), frames=[0, 20, 40])
    text = write_colmap_model(scene, tmp_path / "text", points_per_view=50)
    binary = to_binary(text, tmp_path / "binary")
    ids_t, xyz_t = read_points3d(text / "sparse/0/points3D.txt")
    ids_b, xyz_b = read_points3d(binary / "sparse/0/points3D.bin")
    assert torch.equal(ids_t, ids_b) and torch.equal(xyz_t, xyz_b) and len(ids_b) == 150
    for a, b in zip(read_colmap_frames(text), read_colmap_frames(binary)):
        assert torch.equal(observed_points(*a.tracks, a.label), observed_points(*b.tracks, b.label))
    depth_t = make_source("colmap", text, depth="points").load_views(0, [0, 1, 2]).depth
    depth_b = make_source("colmap", binary, depth="points").load_views(0, [0, 1, 2]).depth
    assert torch.equal(depth_t, depth_b) and torch.isfinite(depth_b).sum() == 150


def test_a_folder_with_both_models_reads_the_text_one(text_and_binary, tmp_path):
    text, binary, _, _ = text_and_binary
    both = shutil.copytree(binary, tmp_path / "both")
    for name in ("cameras.txt", "images.txt"):
        shutil.copy(text / "sparse/0" / name, both / "sparse/0" / name)
    (both / "sparse/0/cameras.bin").write_bytes(b"")  # would fail if read
    assert [f.label for f in read_colmap_frames(both)][0].endswith("images.txt:4")


# ---------------------------------------------------------------- malformed binary files
def camera(model: str = "PINHOLE", params=(10.0, 11.0, 8.0, 6.0), width=16, height=12, camera_id=1) -> bytes:
    return struct.pack("<IiQQ", camera_id, MODEL_IDS.get(model, 42), width, height) + struct.pack(
        f"<{len(params)}d", *params
    )


def image(name: bytes = b"img_00.png", quaternion=(1.0, 0, 0, 0), image_id=1, camera_id=1, points=()) -> bytes:
    record = struct.pack("<I7dI", image_id, *quaternion, 0.0, 0.0, 1.0, camera_id) + name + b"\0"
    return record + struct.pack("<Q", len(points)) + b"".join(struct.pack("<ddq", *p) for p in points)


CAMERA_CASES = {
    "zero width": (
        [camera(width=0)],
        None,
        r"cameras\.bin record 0: field WIDTH must be a positive whole number, got 0",
    ),
    "NaN focal": (
        [camera(params=(float("nan"), 11.0, 8.0, 6.0))],
        None,
        r"record 0: field PARAMS fx must be a positive finite number, got nan",
    ),
    "unknown model id": ([camera("XYZ")], None, r"record 0: field MODEL_ID 42 is no COLMAP camera model"),
    "unsupported model": (
        [camera("FOV", (10.0, 11.0, 8.0, 6.0, 0.1))],
        None,
        r"record 0: camera model FOV is not supported",
    ),
    "count beyond the records": ([camera()], 2, r"cameras\.bin: the file ends inside record 1 \(CAMERA_ID MODEL_ID"),
    "huge count": ([camera()], 2**64 - 1, r"the file ends inside record 1"),
    "bytes after the last record": (
        [camera(), b"\0\0\0"],
        1,
        r"cameras\.bin: 3 bytes follow the last of its 1 cameras \(a count edited",
    ),
}


def binary_scene(folder: Path, cameras: list[bytes], images: list[bytes], counts=(None, None)) -> Path:
    model = folder / "sparse" / "0"
    model.mkdir(parents=True)
    write_records(model / "cameras.bin", cameras, counts[0])
    write_records(model / "images.bin", images, counts[1])
    return folder


@pytest.mark.parametrize("case", CAMERA_CASES)
def test_malformed_cameras_bin_names_the_record_and_field(tmp_path, case):
    cameras, count, message = CAMERA_CASES[case]
    binary_scene(tmp_path, cameras, [image()], (count, None))
    with pytest.raises(SceneError, match=message) as error:
        read_colmap_frames(tmp_path)
    assert "\n" not in str(error.value)


IMAGE_CASES = {
    "zero quaternion": (
        [image(quaternion=(0.0, 0, 0, 0))],
        None,
        r"images\.bin record 0: field QW QX QY QZ is a zero quaternion",
    ),
    "name not UTF-8": ([image(name=b"\xff\xfe.png")], None, r"images\.bin: record 0 \(NAME\) is not UTF-8 text"),
    "name without its NUL": ([image()[:-9]], None, r"the file ends inside record 0 \(NAME\) \(no NUL byte ends it\)"),
    "repeated image id": (
        [image(), image(b"img_01.png")],
        None,
        r"record 1: field IMAGE_ID 1 repeats that of record 0",
    ),
    "unknown camera": ([image(camera_id=9)], None, r"record 0: field CAMERA_ID 9 is not in .*cameras\.bin"),
    "too many points": (
        [image()[:-8] + struct.pack("<Q", 2**40)],
        None,
        r"ends inside record 0 \(its 1099511627776 POINTS2D\)",
    ),
    "count beyond the records": ([image()], 3, r"images\.bin: the file ends inside record 1 \(IMAGE_ID"),
}


@pytest.mark.parametrize("case", IMAGE_CASES)
def test_malformed_images_bin_names_the_record_and_field(tmp_path, case):
    images, count, message = IMAGE_CASES[case]
    binary_scene(tmp_path, [camera()], images, (None, count))
    with pytest.raises(SceneError, match=message) as error:
        read_colmap_frames(tmp_path)
    assert "\n" not in str(error.value)


def test_a_binary_file_cut_anywhere_is_a_one_line_error(text_and_binary, tmp_path):
    """Every cut of cameras.bin / images.bin (every 7th byte) and of points3D.bin (every 13th) is an error
    naming the file: counts come first, so a file never reads as fewer frames."""
    _, binary, _, _ = text_and_binary
    scene = make_scene(5, 0, "room", 2, (16, 16), frames=[0, 20])
    points = to_binary(write_colmap_model(scene, tmp_path / "text", points_per_view=5), tmp_path / "points")
    for folder, name, step in ((binary, "cameras.bin", 7), (binary, "images.bin", 7), (points, "points3D.bin", 13)):
        path = folder / "sparse/0" / name
        whole = path.read_bytes()
        try:
            for cut in range(0, len(whole), step):
                path.write_bytes(whole[:cut])
                with pytest.raises(SceneError, match=rf"{name}: (the file ends inside|cannot read)") as error:
                    if name == "points3D.bin":
                        read_points3d(path)
                    else:
                        read_colmap_frames(folder)
                assert "\n" not in str(error.value)
        finally:
            path.write_bytes(whole)


def test_malformed_points3d_bin_names_the_record_and_field(tmp_path):
    scene = make_scene(5, 0, "room", 2, (16, 16), frames=[0, 20])
    folder = to_binary(write_colmap_model(scene, tmp_path / "text", points_per_view=5), tmp_path / "binary")
    path = folder / "sparse/0/points3D.bin"
    records = point_records(tmp_path / "text/sparse/0")
    records[3] = records[3][:8] + struct.pack("<d", float("nan")) + records[3][16:]
    write_records(path, records)
    with pytest.raises(SceneError, match=r"points3D\.bin record 3: field X Y Z must be finite"):
        read_points3d(path)
    records = point_records(tmp_path / "text/sparse/0")
    write_records(path, records[:2] + records[3:])  # point 3 is gone, an image still observes it
    source = make_source("colmap", folder, depth="points")
    with pytest.raises(SceneError, match=r"images\.bin record 0: field POINTS2D refers to POINT3D_ID 3, which"):
        source.load_views(0, [0, 1])
    write_records(path, records + records[:1])
    with pytest.raises(SceneError, match=r"points3D\.bin: field POINT3D_ID 1 repeats"):
        read_points3d(path)
