"""Fuzzed image files and COLMAP camera models: a valid input decodes to what the rules say, anything
else is a one-line SceneError; no other exception escapes.

Images: random bytes, valid encodings of random size, mode and format, and those encodings with
bytes flipped or cut, through :func:`read_image` with and without a target size. Cameras: a valid
COLMAP scene whose ``cameras.txt`` gets one random line (a known or unknown model, a random size,
the wrong number of parameters, bad numbers) for all its images.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from hrope.nvs.data.real.colmap import _MODELS
from hrope.nvs.data.real.images import decoding_scale, read_image
from hrope.nvs.data.real.loaders import load_scene
from hrope.nvs.data.scene import SceneError
from test_loaders import V, truth, view_images, write_colmap

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# mode -> the formats PIL writes it in
FORMATS = {
    "1": ["PNG", "BMP", "TIFF", "GIF"],
    "L": ["PNG", "JPEG", "BMP", "TIFF", "GIF", "WEBP"],
    "LA": ["PNG", "TIFF"],
    "P": ["PNG", "BMP", "TIFF", "GIF"],
    "RGB": ["PNG", "JPEG", "BMP", "TIFF", "GIF", "WEBP"],
    "RGBA": ["PNG", "TIFF", "WEBP", "GIF"],
    "CMYK": ["JPEG", "TIFF"],
    "I;16": ["PNG", "TIFF"],
    "I": ["TIFF"],
}


@st.composite
def encoded_images(draw) -> tuple[bytes, tuple[int, int]]:
    """A valid encoding of a random small image: ``(bytes, (H, W))``."""
    mode = draw(st.sampled_from(sorted(FORMATS)), label="mode")
    fmt = draw(st.sampled_from(FORMATS[mode]), label="format")
    height, width = draw(st.integers(1, 40), label="H"), draw(st.integers(1, 40), label="W")
    seed = draw(st.integers(0, 2**16), label="seed")
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    if mode == "I;16":
        image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
    elif mode == "I":
        image = Image.fromarray(pixels[..., 0].astype(np.int32) * 257)
    else:
        image = Image.fromarray(pixels).convert(mode)
    assert image.mode == mode
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue(), (height, width)


def decode_or_scene_error(data: bytes, target=None) -> torch.Tensor | None:
    """The decoded image (checked: ``(3, h, w)`` float32 in [0, 1]), or None after a one-line SceneError."""
    try:
        image = read_image(data, "fuzz", target=target)
    except SceneError as error:
        assert str(error).startswith("fuzz: ") and "\n" not in str(error)
        event("SceneError")
        return None
    event("decoded")
    assert image.dtype == torch.float32 and image.ndim == 3 and image.shape[0] == 3
    assert bool(((image >= 0) & (image <= 1)).all())
    return image


@FUZZ
@given(data=st.binary(max_size=512))
def test_random_bytes_decode_or_are_a_scene_error(data):
    decode_or_scene_error(data)


@FUZZ
@given(encoded=encoded_images(), target=st.none() | st.tuples(st.integers(1, 8), st.integers(1, 8)))
def test_every_mode_size_and_format_decodes_to_rgb_at_the_planned_size(encoded, target):
    data, (height, width) = encoded
    image = decode_or_scene_error(data, target)
    assert image is not None  # a valid encoding always decodes
    with Image.open(io.BytesIO(data)) as pil:  # alpha is composited at full size, never reduced
        alpha = "A" in pil.getbands() or "transparency" in pil.info
    scale = 1 if target is None or alpha else decoding_scale((height, width), target)
    assert image.shape[1:] == (height // scale, width // scale)


@pytest.mark.filterwarnings("ignore:.*:UserWarning:PIL")  # PIL's own notes on the damaged files
@FUZZ
@given(encoded=encoded_images(), data=st.data())
def test_damaged_encodings_decode_or_are_a_scene_error(encoded, data):
    raw = bytearray(encoded[0])
    if data.draw(st.booleans(), label="cut (else flip bytes)"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="cut at")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            raw[data.draw(st.integers(0, len(raw) - 1), label="at")] ^= data.draw(st.integers(1, 255), label="xor")
    decode_or_scene_error(bytes(raw), data.draw(st.none() | st.just((4, 4)), label="target"))


# ---------------------------------------------------------------- COLMAP camera models
NUMBERS = ["0", "-1", "0.5", "1", "12", "16", "1e-30", "1e30", "1e400", "nan", "inf", "-inf", "abc", "0x10", "1,5"]
MODELS = [*_MODELS, "FOV", "THIN_PRISM_FISHEYE", "SIMPLE_PINHOLE ", "pinhole", "EQUIRECTANGULAR", "42", ""]


@pytest.fixture(scope="module")
def colmap_scene(tmp_path_factory):
    root = tmp_path_factory.mktemp("colmap")
    K, E, _ = truth(70)
    write_colmap(root, K, E, view_images(70), models=("PINHOLE",) * V, header=False)
    return root


@st.composite
def camera_lines(draw) -> str:
    """A ``cameras.txt`` line for CAMERA_ID 7: a model, WIDTH, HEIGHT and parameters, each drawn
    from valid-looking and bad values."""
    model = draw(st.sampled_from(MODELS), label="model")
    count = len(_MODELS.get(model, ())) + draw(st.sampled_from([0, 0, 0, -1, 1]), label="extra params")
    plausible = st.floats(0.5, 40, allow_nan=False).map(repr)
    bad = st.one_of(st.sampled_from(NUMBERS), st.floats().map(repr))
    value = st.one_of(plausible, bad) if draw(st.booleans(), label="bad values") else plausible
    size = st.one_of(st.sampled_from(["16 12", "32 24", "8 6"]), st.tuples(value, value).map(" ".join))
    params = draw(st.lists(value, min_size=max(count, 0), max_size=max(count, 0)), label="params")
    distortion = st.floats(-0.3, 0.3, allow_nan=False).map(repr)
    for i, name in enumerate(_MODELS.get(model, ())):  # distortion mostly small: it is undistorted
        if i < len(params) and name[0] in "kp" and draw(st.booleans(), label=f"small {name}"):
            params[i] = draw(distortion)
    return " ".join(["7", model, draw(size, label="size"), *params])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=camera_lines())
def test_fuzzed_colmap_camera_models_load_or_are_a_scene_error(colmap_scene, tmp_path_factory, line):
    folder = tmp_path_factory.mktemp("fuzzed")
    for path in colmap_scene.rglob("*"):
        if path.is_file():
            (folder / path.relative_to(colmap_scene)).parent.mkdir(parents=True, exist_ok=True)
            (folder / path.relative_to(colmap_scene)).write_bytes(path.read_bytes())
    images = folder / "sparse/0/images.txt"
    images.write_text("\n".join(_with_camera_7(images.read_text().splitlines())) + "\n")
    (folder / "sparse/0/cameras.txt").write_text(f"# Camera list\n{line}\n")
    try:
        scene = load_scene(folder)
    except SceneError as error:
        assert "\n" not in str(error)
        event("SceneError")
        return
    event(f"loaded {line.split()[1]}")
    assert scene.num_views == V and bool(torch.isfinite(scene.images).all())
    K = scene.cameras.K
    assert bool(torch.isfinite(K).all()) and bool((K[..., 0, 0] > 0).all()) and bool((K[..., 1, 1] > 0).all())
    assert math.isfinite(float(scene.cameras.world_to_cam.abs().max()))


def _with_camera_7(lines: list[str]) -> list[str]:
    """``images.txt`` lines with every image's CAMERA_ID set to 7."""
    out = []
    for line in lines:
        tokens = line.split(" ")
        if len(tokens) >= 10 and tokens[-1].endswith(".png"):
            tokens[8] = "7"
        out.append(" ".join(tokens))
    return out
