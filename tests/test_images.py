"""Images as users have them: every mode, alpha, EXIF orientation, odd sizes and names, huge files.

Each image is written with PIL (or by hand, for 16-bit RGB) from known pixels; the decoded
``(3, H, W)`` values are compared with what the documented rule gives from those pixels.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hrope.nvs.data.real.images import read_image
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.data.scene import SceneError
from test_loaders import (
    V,
    assert_images,
    assert_reprojects,
    points_in_front,
    project_cv,
    save_png,
    truth,
    view_images,
    write_colmap,
    write_nerfstudio,
)

H, W = 12, 16
RNG = np.random.default_rng(5)
RGB = RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)
ALPHA = RNG.integers(0, 256, (H, W), dtype=np.uint8)


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def png16_rgb(pixels: np.ndarray) -> bytes:
    """A 16-bit RGB PNG of ``pixels`` ``(H, W, 3)`` uint16, written by hand (PIL writes none)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[i].astype(">u2").tobytes() for i in range(height))
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """``(H, W, 3)`` or ``(H, W)`` 8-bit levels -> ``(3, H, W)`` in [0, 1]."""
    x = torch.from_numpy(np.asarray(array, dtype=np.float32) / 255)
    return x.expand(3, -1, -1) if x.ndim == 2 else x.permute(2, 0, 1)


def test_greyscale_palette_bilevel_and_cmyk_decode_to_their_rgb():
    grey = Image.fromarray(RGB).convert("L")
    expected = as_tensor(np.asarray(grey))
    torch.testing.assert_close(read_image(encode(grey)), expected, atol=0, rtol=0)
    bilevel = grey.convert("1")
    torch.testing.assert_close(read_image(encode(bilevel)), as_tensor(np.asarray(bilevel, dtype=np.uint8) * 255))
    palette = Image.fromarray(RGB).convert("P")
    torch.testing.assert_close(read_image(encode(palette)), as_tensor(np.asarray(palette.convert("RGB"))))
    # a CMYK JPEG (print workflows): decoded to about the RGB it was made from (JPEG error only)
    smooth = Image.fromarray(RGB).resize((4, 3)).resize((W, H), Image.BICUBIC)
    cmyk = read_image(encode(smooth.convert("CMYK"), "JPEG", quality=98))
    rgb = read_image(encode(smooth, "JPEG", quality=98))
    assert cmyk.shape == (3, H, W) and (cmyk - as_tensor(np.asarray(smooth))).abs().mean() < 0.02  # measured 0.006
    assert (rgb - as_tensor(np.asarray(smooth))).abs().mean() < 0.02


def test_16_bit_pngs_keep_their_levels():
    grey = RNG.integers(0, 65536, (H, W), dtype=np.uint16)
    decoded = read_image(encode(Image.fromarray(grey)))  # PIL mode I;16
    torch.testing.assert_close(decoded, torch.from_numpy(grey / 65535.0).float().expand(3, -1, -1))
    colour = RNG.integers(0, 65536, (H, W, 3), dtype=np.uint16)
    decoded = read_image(png16_rgb(colour))  # PIL reads 16-bit RGB as 8-bit RGB: within one 8-bit level
    assert (decoded - torch.from_numpy(colour / 65535.0).float().permute(2, 0, 1)).abs().max() <= 1 / 255


def test_alpha_is_composited_over_white_unless_told_otherwise():
    a = ALPHA[..., None] / 255.0
    rgba = encode(Image.fromarray(np.dstack([RGB, ALPHA])))
    over_white = torch.from_numpy(RGB / 255.0 * a + (1 - a)).float().permute(2, 0, 1)
    torch.testing.assert_close(read_image(rgba), over_white)
    over_grey = torch.from_numpy(RGB / 255.0 * a + 0.5 * (1 - a)).float().permute(2, 0, 1)
    torch.testing.assert_close(read_image(rgba, background=(0.5, 0.5, 0.5)), over_grey)
    torch.testing.assert_close(read_image(rgba, background=None), as_tensor(RGB))  # alpha dropped
    grey = np.asarray(Image.fromarray(RGB).convert("L"), dtype=np.float64) / 255
    la = encode(Image.fromarray(np.dstack([(grey * 255).round().astype(np.uint8), ALPHA]), "LA"))
    la_over_white = torch.from_numpy(grey * a[..., 0] + (1 - a[..., 0])).float().expand(3, -1, -1)
    torch.testing.assert_close(read_image(la), la_over_white)
    palette = Image.fromarray(RGB).convert("P")
    transparent = int(np.asarray(palette)[0, 0])
    decoded = read_image(encode(palette, transparency=transparent))
    hidden = torch.from_numpy(np.asarray(palette) == transparent)
    assert bool((decoded[:, hidden] == 1).all())  # the transparent index is the background
    torch.testing.assert_close(decoded[:, ~hidden], as_tensor(np.asarray(palette.convert("RGB")))[:, ~hidden])


def test_exif_orientation_is_ignored_as_colmap_and_nerfstudio_do():
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    tagged = encode(Image.fromarray(RGB), "JPEG", quality=95, exif=exif.tobytes())
    assert Image.open(io.BytesIO(tagged)).getexif()[0x0112] == 6
    plain = encode(Image.fromarray(RGB), "JPEG", quality=95)
    torch.testing.assert_close(read_image(tagged), read_image(plain), atol=0, rtol=0)  # stored pixels, H x W


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"name,x,y\n1,2,3\n", r"is in no image format PIL can read \(it starts with b'name,x,y"),
        (b"", r"is in no image format PIL can read \(it starts with b''\)"),
        (encode(Image.fromarray(RGB))[:120], r"cannot read image .*: image file is truncated"),
        (encode(Image.fromarray(RGB.astype(np.float32)[..., 0]), "TIFF"), r"floating-point image \(mode F\)"),
    ],
    ids=["text", "empty", "truncated", "float"],
)
def test_files_that_are_not_photographs_are_one_line_scene_errors(tmp_path, content, message):
    path = tmp_path / "photo 1.png"
    path.write_bytes(content)
    with pytest.raises(SceneError, match=message) as error:
        read_image(path, "frames[3]")
    assert str(error.value).startswith("frames[3]: ") and "\n" not in str(error.value)


def test_a_file_beyond_the_decompression_bomb_limit_is_refused_before_decoding(tmp_path, monkeypatch):
    path = tmp_path / "huge.png"
    Image.fromarray(RGB).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", H * W // 4)  # the limit is twice this
    with pytest.raises(SceneError, match=r"huge\.png is too large to decode .*raise PIL\.Image\.MAX_IMAGE_PIXELS"):
        read_image(path, "x")


def test_large_pngs_are_reduced_before_the_float_conversion(monkeypatch):
    big = np.asarray(Image.fromarray(RGB).resize((64, 48), Image.BICUBIC))
    decoded = read_image(encode(Image.fromarray(big)), target=(6, 8))  # 48x64 at 1/4 leaves 12x16 >= 2 x 6x8
    boxes = torch.nn.functional.avg_pool2d(as_tensor(big)[None], 4)[0]
    assert decoded.shape == (3, 12, 16)
    assert (decoded - boxes).abs().max() <= 0.5 / 255 + 1e-6  # PIL's box reduction rounds to 8 bits
    assert read_image(encode(Image.fromarray(big))).shape == (3, 48, 64)  # no target: full size
    with_alpha = encode(Image.fromarray(np.dstack([big, np.full(big.shape[:2], 255, np.uint8)])))
    assert read_image(with_alpha, target=(6, 8)).shape == (3, 48, 64)  # alpha first composited at full size


def test_mixed_image_sizes_in_one_capture(tmp_path):
    K, E, _ = truth(8)
    K[:] = K[0]
    images = view_images(8)
    write_nerfstudio(tmp_path, K, E, images)
    double = np.asarray(Image.fromarray(images[0]).resize((2 * W, 2 * H), Image.NEAREST))
    save_png(tmp_path / "images" / "frame_00000.png", double)  # a 2x copy: the camera says 12x16
    with pytest.raises(SceneError, match=r"different image sizes \[\(12, 16\), \(24, 32\)\]; pass image_size"):
        load_scene(tmp_path)
    scene = load_scene(tmp_path, image_size=(H, W))  # K follows each image's own size
    X = points_in_front(E, 8)
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert scene.images.shape == (V, 3, H, W)
    torch.testing.assert_close(scene.images[1:], torch.stack([as_tensor(a) for a in images[1:]]), atol=0, rtol=0)


@pytest.mark.parametrize("writer", ["nerfstudio", "colmap"])
def test_image_names_with_spaces_and_non_ascii_characters(tmp_path, writer):
    K, E, _ = truth(9)
    K[:] = K[0]
    images = view_images(9)
    if writer == "nerfstudio":
        write_nerfstudio(tmp_path, K, E, images)
    else:
        write_colmap(tmp_path, K, E, images, models=("PINHOLE",) * V)
    listing = tmp_path / ("transforms.json" if writer == "nerfstudio" else "sparse/0/images.txt")
    text = listing.read_text()
    for old in sorted((tmp_path / "images").iterdir()):
        new = old.with_name(f"vue d'été  n°{old.stem[-1]} 東京.png")
        shutil.move(old, new)
        text = text.replace(old.name, json.dumps(new.name)[1:-1] if writer == "nerfstudio" else new.name)
    listing.write_text(text)
    scene = load_scene(tmp_path)
    assert scene.num_views == V
    X = points_in_front(E, 9)
    assert_reprojects(scene, project_cv(K, E, X), X)
    assert_images(scene, images)


def test_images_read_through_a_path_or_bytes_agree(tmp_path):
    path = Path(tmp_path / "été.png")
    path.write_bytes(encode(Image.fromarray(np.dstack([RGB, ALPHA]))))
    torch.testing.assert_close(read_image(path), read_image(path.read_bytes()), atol=0, rtol=0)


def test_a_header_read_for_the_size_fails_like_a_decode(tmp_path, monkeypatch):
    """transforms.json without w/h reads each image's size from its header: the same one-line errors."""
    K, E, _ = truth(10)
    K[:] = K[0]
    write_nerfstudio(tmp_path, K, E, view_images(10))
    meta = json.loads((tmp_path / "transforms.json").read_text())
    del meta["w"], meta["h"]
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    assert load_scene(tmp_path).image_size == (H, W)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", H * W // 4)
    with pytest.raises(
        SceneError, match=r"frames\[0\] \(no 'w'/'h'\): image .*frame_00000\.png is too large to decode"
    ):
        load_scene(tmp_path)
    monkeypatch.undo()
    (tmp_path / "images" / "frame_00001.png").write_text("<html>404</html>")
    with pytest.raises(
        SceneError, match=r"frames\[1\] \(no 'w'/'h'\): image .* PIL can read \(it starts with b'<html>"
    ):
        load_scene(tmp_path)
