"""The image cache of decoded views, reduced-scale JPEG decoding, decoding threads, and the
benchmark of real-data loading (benchmarks/real_loading.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, JpegImagePlugin

import hrope.nvs.data.real.frames as frames_module
from hrope.nvs.data.real.frames import Frame, load_view, pinhole
from hrope.nvs.data.real.image_cache import ImageCache, default_cache_dir
from hrope.nvs.data.real.loaders import load_scene

H, W = 48, 64
SIZE = (16, 16)


def write_capture(folder: Path, k: float = -0.05, count: int = 3, seed: int = 0) -> list[np.ndarray]:
    """A COLMAP scene of ``count`` PNG views through a SIMPLE_RADIAL lens (undistorted when read)."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(count)]
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / "images" / f"{i}.png")
    (folder / "cameras.txt").write_text(f"1 SIMPLE_RADIAL {W} {H} 50 32 24 {k}\n")
    (folder / "images.txt").write_text("".join(f"{i + 1} 1 0 0 0 {0.1 * i} 0 0 1 {i}.png\n\n" for i in range(count)))
    return images


def entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.npy"))


def assert_same(a, b) -> None:
    assert torch.equal(a.images, b.images) and torch.equal(a.cameras.K, b.cameras.K)


def test_views_are_decoded_once_and_read_back_exactly(tmp_path, monkeypatch):
    write_capture(tmp_path / "scene")
    cache = tmp_path / "cache"
    first = load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    assert len(entries(cache)) == 3 and not list((tmp_path / "scene").rglob("*.npy"))  # never in the data folder
    assert_same(first, load_scene(tmp_path / "scene", SIZE))  # 8-bit either way: cached == uncached

    def no_decoding(*args, **kwargs):
        raise AssertionError("a cached view was decoded again")

    monkeypatch.setattr(frames_module, "read_image", no_decoding)
    assert_same(first, load_scene(tmp_path / "scene", SIZE, cache_dir=cache))
    entry = np.load(entries(cache)[0], allow_pickle=False)  # a numpy record, never a pickle
    assert entry["image"].dtype == np.uint8 and entry["image"].shape == (*SIZE, 3)
    assert entry["source_size"].tolist() == [H, W]


def test_the_key_follows_the_file_the_target_size_and_the_lens(tmp_path):
    images = write_capture(tmp_path / "scene")
    cache = tmp_path / "cache"
    load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    load_scene(tmp_path / "scene", (8, 8), cache_dir=cache)
    assert len(entries(cache)) == 6  # one entry per target size

    Image.fromarray(255 - images[0]).save(tmp_path / "scene" / "images" / "0.png")  # an edited photo
    edited = load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    assert_same(edited, load_scene(tmp_path / "scene", SIZE))
    assert len(entries(cache)) == 7

    path = tmp_path / "scene" / "images" / "1.png"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes, a new key
    load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    assert len(entries(cache)) == 8

    (tmp_path / "scene" / "cameras.txt").write_text(f"1 SIMPLE_RADIAL {W} {H} 50 32 24 0.05\n")  # another lens
    relensed = load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    assert len(entries(cache)) == 11
    assert not torch.equal(relensed.images, edited.images)
    assert_same(relensed, load_scene(tmp_path / "scene", SIZE))


def test_an_unreadable_or_pickled_entry_is_a_miss_and_is_rewritten(tmp_path):
    write_capture(tmp_path / "scene", count=2)
    cache = tmp_path / "cache"
    expected = load_scene(tmp_path / "scene", SIZE, cache_dir=cache)
    damaged, pickled = entries(cache)
    damaged.write_bytes(damaged.read_bytes()[:100])
    np.save(pickled, np.array([{"payload": 1}], dtype=object), allow_pickle=True)
    assert_same(expected, load_scene(tmp_path / "scene", SIZE, cache_dir=cache))
    for entry in (damaged, pickled):
        assert ImageCache(cache).get(entry.stem) is not None  # rewritten


def test_a_cache_that_cannot_be_written_warns_once_and_leaves_nothing_behind(tmp_path, caplog, monkeypatch):
    write_capture(tmp_path / "scene")
    (tmp_path / "file").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        scene = load_scene(tmp_path / "scene", SIZE, cache_dir=tmp_path / "file" / "cache")
    assert_same(scene, load_scene(tmp_path / "scene", SIZE))
    assert caplog.text.count("cannot be written") == 1 and "views are decoded every time" in caplog.text

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    caplog.clear()
    monkeypatch.setattr(np, "save", disk_full)  # fails halfway through an entry
    with caplog.at_level(logging.WARNING, logger="hrope.nvs.data"):
        load_scene(tmp_path / "scene", SIZE, cache_dir=tmp_path / "cache")
    assert "No space left on device" in caplog.text
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no partial entry, no temporary file


def test_default_cache_dir_is_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "hrope" / "images"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "hrope" / "images"


def test_decoding_threads_give_the_same_scene(tmp_path):
    write_capture(tmp_path / "scene", count=5)
    assert_same(load_scene(tmp_path / "scene", SIZE, workers=3), load_scene(tmp_path / "scene", SIZE))


def test_large_jpegs_are_decoded_at_a_reduced_scale_with_exact_intrinsics(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    coarse = Image.fromarray(rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)).resize((256, 192), Image.BICUBIC)
    coarse.save(tmp_path / "photo.jpg", quality=95)
    K = pinhole(200.0, 190.0, 130.0, 95.0)
    frame = Frame(tmp_path / "photo.jpg", K, torch.eye(4, dtype=torch.float64), (192, 256))
    requested = []
    draft = JpegImagePlugin.JpegImageFile.draft
    monkeypatch.setattr(
        JpegImagePlugin.JpegImageFile,
        "draft",
        lambda self, mode, size: requested.append(size) or draft(self, mode, size),
    )
    image, K_out = load_view(frame, SIZE)
    # 192x256 to cover 16x16 needs 16x21; decoding at 1/4 leaves 48x64, at least twice that
    assert requested == [(64, 48)]
    full = np.asarray(Image.open(tmp_path / "photo.jpg").convert("RGB"))
    reference, K_reference = frames_module.resize_crop(
        torch.from_numpy(full.copy()).permute(2, 0, 1)[None].float() / 255, K[None], SIZE
    )
    torch.testing.assert_close(K_out, K_reference[0], atol=1e-12, rtol=0)  # the scale is exact
    assert (image - reference[0]).abs().max() < 0.015  # DCT scaling filters differently: measured 0.0066
    assert load_view(frame)[0].shape == (3, 192, 256)  # without a target size: full resolution
    assert len(requested) == 1
    odd = Frame(tmp_path / "odd.jpg", K, torch.eye(4, dtype=torch.float64), (191, 256))
    coarse.resize((256, 191)).save(odd.image, quality=95)
    load_view(odd, SIZE)
    assert len(requested) == 1  # no scale divides 191x256 exactly: no reduced decoding


def test_real_loading_benchmark_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(Path(__file__).resolve().parents[1] / "benchmarks")
    import real_loading

    from hrope.nvs.train_step import train_step

    calls = []  # the toolkit's own training step is the one timed

    def counted(*args, **kwargs):
        calls.append(args[3])
        return train_step(*args, **kwargs)

    monkeypatch.setattr(real_loading, "train_step", counted)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "real_loading.py",
            "--rounds",
            "1",
            "--steps",
            "1",
            "--images",
            "3",
            "--size",
            "48",
            "64",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    real_loading.main()
    assert calls == [0, 0, 0, 1, 1, 1]  # a warm-up round, then one timed round; steps 0, 1 of each data set
    results = json.loads((tmp_path / "out" / "real_loading.json").read_text())
    assert [row["data"] for row in results["results"]] == list(real_loading.KINDS)
    assert all(row["steps_per_s"] > 0 and len(row["steps_per_s_per_round"]) == 1 for row in results["results"])
    assert results["results"][0]["step_time_ratio_to_synthetic"] == 1.0
    assert results["meta"]["provenance"]["torch"] == torch.__version__
    table = (tmp_path / "out" / "real_loading.md").read_text()
    assert "| real, cached |" in table and "Commit: `" in table
    assert len(entries(tmp_path / "work" / "cache")) == 3  # the cached data set's views, at 64x64
