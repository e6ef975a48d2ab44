"""The 3D viewer: the scene it builds (pure data), its viser page in a real browser, its CLI."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from _lvsm_helpers import small_config
from PIL import Image

from hrope.nvs.config import update_config
from hrope import Planes
from hrope.geometry import patch_rays
from hrope.nvs import cli
from hrope.nvs.running.checkpoints import save_checkpoint
from hrope.nvs.data.synthetic import make_scene
from hrope.nvs.model import build_model
from hrope.nvs.pretrained import export_run
from hrope.nvs.viz.scene3d import (
    CORNERS,
    QUAD_SHRINK,
    TARGET_COLOUR,
    Scene3D,
    _data_scene,
    build_scene,
    capture_scene,
    is_run,
    patch_quads,
    rotation_to_wxyz,
    run_scene,
)
from hrope.nvs.viz.figures import VizError
from hrope.testing import random_rotation

GRID = (4, 4)
P = GRID[0] * GRID[1]


@pytest.fixture(scope="module")
def scene():
    """A synthetic room, 3 views (2 context, the target last) at 32x32: 4x4 patches of 8 pixels."""
    return make_scene(0, 0, "room", num_views=3, image_size=(32, 32))


def truth(scene) -> torch.Tensor:
    return scene.planes(8).m(scene.cameras, GRID, torch.float64)[0]


def quaternion_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def test_quaternions_reproduce_their_rotations():
    rotations = [*random_rotation(64, generator=torch.Generator().manual_seed(0)).numpy(), np.eye(3)]
    rotations += [np.diag([1.0, -1, -1]), np.diag([-1.0, 1, -1]), np.diag([-1.0, -1, 1])]  # 180 degrees: trace -1
    for R in rotations:
        q = rotation_to_wxyz(R)
        assert abs(np.linalg.norm(q) - 1) < 1e-12 and q[0] >= 0
        np.testing.assert_allclose(quaternion_matrix(q), R, atol=1e-12)


def test_quads_lie_on_their_planes_and_cover_their_patches(scene):
    m = truth(scene)
    corners, valid = patch_quads(m, scene.cameras, GRID)
    assert corners.shape == (3 * P, 4, 3) and valid.sum() > P  # most patches see a surface in front
    E = np.linalg.inv(scene.cameras.to(dtype=torch.float64).cam_to_world()[0].numpy())  # the transform the quads used
    K = scene.cameras.normalized_K(torch.float64)[0]
    patch_corners = torch.stack([patch_rays(K[None], GRID, c)[0] for c in CORNERS], 2).numpy()  # (V, P, 4, 3)
    for token in np.flatnonzero(valid):
        view = token // P
        local = corners[token] @ E[view, :3, :3].T + E[view, :3, 3]  # camera frame
        np.testing.assert_allclose(local @ m[token].numpy(), 1.0, atol=1e-9)  # m·X = 1: on the plane
        centre = local.mean(0)
        unshrunk = centre + (local - centre) / QUAD_SHRINK
        np.testing.assert_allclose(unshrunk / unshrunk[:, 2:], patch_corners[view, token % P], atol=1e-9)


def test_the_plane_at_infinity_and_planes_behind_get_no_quad(scene):
    m = truth(scene).clone()
    m[:P] = 0  # view 0: planes at infinity
    m[P : 2 * P] = -m[P : 2 * P]  # view 1: crossed behind the camera
    _, valid = patch_quads(m, scene.cameras, GRID)
    assert not valid[: 2 * P].any() and valid[2 * P :].any()


def test_build_scene_frusta_colours_and_target(scene):
    m = truth(scene)
    built = build_scene(scene.images, scene.cameras, GRID, 2, m[: 2 * P], m[2 * P :], m, colour="normal")
    assert [f.name for f in built.frusta] == ["context 0", "context 1", "target"]
    assert built.frusta[-1].target and built.frusta[-1].colour == TARGET_COLOUR
    to_world = scene.cameras.cam_to_world().double()[0].numpy()
    for v, frustum in enumerate(built.frusta):
        np.testing.assert_allclose(quaternion_matrix(frustum.wxyz), to_world[v, :3, :3], atol=1e-6)
        np.testing.assert_allclose(frustum.position, to_world[v, :3, 3], atol=1e-6)
        assert frustum.image.shape == (32, 32, 3) and frustum.image.dtype == np.uint8
    assert [q.name for q in built.quads] == ["context planes", "target planes"]
    context = built.quads[0]
    normals, _ = Planes.from_m(m[None, : 2 * P]).normal_and_depth(
        scene.cameras.select_views([0, 1]).to(dtype=torch.float64), GRID
    )
    expected = ((normals[0].numpy()[context.tokens] + 1) / 2 * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(context.colours, expected)
    assert context.faces.shape == (4 * len(context.corners), 3)
    assert context.face_colours(0.5).shape == (4 * len(context.corners), 4)


def test_error_colours_are_zero_error_for_the_truth_and_change_with_the_normal(scene):
    m = truth(scene)
    exact = build_scene(scene.images, scene.cameras, GRID, 2, m[: 2 * P], None, m, colour="error")
    colours = exact.quads[0].colours
    assert (colours == colours[0]).all()  # every quad at 0 degrees: one colour, viridis' low end (dark)
    assert colours[0].sum() < 300
    tilted = m.clone()
    tilted[: 2 * P, 0] += 0.3 * tilted[: 2 * P].norm(dim=-1)  # turn every context normal
    wrong = build_scene(scene.images, scene.cameras, GRID, 2, tilted[: 2 * P], None, m, colour="error")
    assert (wrong.quads[0].colours.astype(int).sum(-1) > colours[0].astype(int).sum()).all()
    with pytest.raises(VizError, match="ground-truth"):
        build_scene(scene.images, scene.cameras, GRID, 2, m[: 2 * P], colour="error")
    with pytest.raises(VizError, match="colour"):
        build_scene(scene.images, scene.cameras, GRID, 2, colour="depth")


def test_data_scene_carries_the_context_planes_into_the_target(scene):
    built = _data_scene(scene.images, scene.cameras, GRID, 2, truth(scene), "error")
    target = built.quads[1]
    assert len(target.corners) > P // 2  # the target sees mostly surfaces the context views see


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory) -> Path:
    """An (untrained) hrope-lift run with oracle planes carried into the target: a checkpoint to read."""
    folder = tmp_path_factory.mktemp("oracle_run")
    config = small_config(encoding="hrope-lift", predictor="oracle", predictor_options={"targets": "transfer"})
    config = update_config(config, {"train": {"out": str(folder)}})
    save_checkpoint(folder / "checkpoint.safetensors", build_model(config), None, 0, config)
    return folder


def test_run_scene_shows_the_models_planes(oracle_run):
    built = run_scene(oracle_run, colour="error")
    assert [f.name for f in built.frusta] == ["context 0", "context 1", "target"]
    assert [q.name for q in built.quads] == ["context planes", "target planes"]
    assert all(len(q.corners) for q in built.quads)
    context = built.quads[0].colours
    assert (context == context[0]).all()  # oracle context planes are the truth: zero error everywhere
    with pytest.raises(VizError, match="scene 99"):
        run_scene(oracle_run, scene=99)


def test_a_saved_model_folder_shows_the_same_scene_as_its_run(oracle_run, tmp_path):
    saved = export_run(oracle_run, tmp_path / "saved")
    assert is_run(saved)
    from_run, from_saved = run_scene(oracle_run), run_scene(saved)
    assert [q.name for q in from_saved.quads] == [q.name for q in from_run.quads]
    for a, b in zip(from_run.quads, from_saved.quads):
        np.testing.assert_array_equal(a.corners, b.corners)


def write_capture(folder: Path, scene) -> None:
    """``scene`` as a nerfstudio capture with .npy depth maps."""
    frames = []
    for v in range(scene.num_views):
        image = (scene.images[v].permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)
        (folder / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / "images" / f"{v}.png")
        np.save(folder / f"depth{v}.npy", scene.depth[v].numpy().astype(np.float32))
        c2w = torch.linalg.inv(scene.cameras.world_to_cam[0, v].double())
        c2w_gl = torch.stack([c2w[:, 0], -c2w[:, 1], -c2w[:, 2], c2w[:, 3]], 1)  # OpenGL axes
        frames.append(
            {"file_path": f"images/{v}.png", "depth_file_path": f"depth{v}.npy", "transform_matrix": c2w_gl.tolist()}
        )
    K = scene.cameras.K[0, 0]
    meta = {
        "w": 32,
        "h": 32,
        "fl_x": float(K[0, 0]),
        "fl_y": float(K[1, 1]),
        "cx": float(K[0, 2]),
        "cy": float(K[1, 2]),
    }
    (folder / "transforms.json").write_text(json.dumps({**meta, "frames": frames}))


def test_capture_scene_reads_cameras_and_fits_planes_to_depth(tmp_path, scene):
    write_capture(tmp_path, scene)
    without = capture_scene(tmp_path, image_size=32, patch_size=8)
    assert len(without.frusta) == 3 and not without.quads  # no depth read: cameras only
    to_world = scene.cameras.cam_to_world().double()[0].numpy()
    np.testing.assert_allclose(without.frusta[1].position, to_world[1, :3, 3], atol=1e-4)
    with_depth = capture_scene(tmp_path, views=[0, 1, 2], image_size=32, patch_size=8, depth="maps")
    assert [q.name for q in with_depth.quads] == ["context planes", "target planes"]
    with pytest.raises(VizError, match="two views"):
        capture_scene(tmp_path, views=[0])


# ------------------------------------------------------------------ the page in a browser
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-gl=swiftshader",
    "--enable-unsafe-swiftshader",
    "--window-size=900,600",
]
CANVAS = (slice(160, 560), slice(60, 540))  # below the notice, left of viser's control panel
# share of the canvas area that differs from the background: 0.000 measured on the page of an empty
# scene (only the small world axes), 0.49 on this test's scene
MIN_SCENE_SHARE = 0.05


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


class DevTools:
    """A headless Chromium driven over the DevTools protocol (its websocket, through the ``websockets``
    package that viser brings): open a page and take screenshots while it runs, in real time."""

    def __init__(self, profile: Path) -> None:
        self.log = open(profile.with_suffix(".log"), "w")  # a file: a full pipe would stall the browser
        command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0"]
        self.process = subprocess.Popen([*command, "about:blank"], stdout=self.log, stderr=subprocess.STDOUT)
        active = profile / "DevToolsActivePort"  # Chromium writes its port and browser path there
        deadline = time.time() + 60
        while not (active.exists() and len(active.read_text().split()) == 2):
            assert self.process.poll() is None and time.time() < deadline, "chromium did not start"
            time.sleep(0.2)
        port, path = active.read_text().split()
        from websockets.sync.client import connect

        self.socket = connect(f"ws://127.0.0.1:{port}{path}", max_size=None)
        self.calls = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.calls += 1
        message = {"id": self.calls, "method": method, "params": params or {}}
        self.socket.send(json.dumps(message | ({"sessionId": session} if session else {})))
        while True:
            reply = json.loads(self.socket.recv(timeout=120))
            if reply.get("id") == self.calls:
                assert "error" not in reply, reply
                return reply["result"]

    def open(self, url: str) -> str:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 900, "height": 600, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        return session

    def screenshot(self, session: str, path: Path) -> np.ndarray:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session)["data"]))
        return np.asarray(Image.open(path).convert("RGB")).astype(int)

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def scene_share(pixels: np.ndarray) -> float:
    canvas = pixels[CANVAS]
    return float((np.abs(canvas - canvas[0, 0]).sum(-1) > 30).mean())


def wait_for_page(url: str, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            assert urllib.request.urlopen(url, timeout=5).status == 200
            return
        except OSError:
            assert process.poll() is None, "the viewer exited before serving its page"
            if time.time() > deadline:
                raise
            time.sleep(0.3)


def drawn_share(browser: DevTools, url: str, path: Path, seconds: float = 120) -> float:
    """Open ``url`` and screenshot it every 2 s until the scene is drawn (or ``seconds`` pass); returns
    the last screenshot's :func:`scene_share`."""
    session, deadline, share = browser.open(url), time.time() + seconds, 0.0
    while share <= MIN_SCENE_SHARE and time.time() < deadline:  # WebGL in software: a few seconds
        time.sleep(2)
        share = scene_share(browser.screenshot(session, path))
    return share


@pytest.mark.slow
def test_the_viewer_page_and_its_export_show_the_scene_in_a_browser(tmp_path, oracle_run):
    """``hrope viz 3d RUN --port P`` serves the page, and ``--export`` writes one that needs no server;
    headless Chromium draws the scene of both (WebGL in software) within two minutes. Real time, not
    ``--virtual-time-budget``: the page's websocket can hold virtual time still, and Chromium then never
    takes its screenshot."""
    from hrope.nvs.viz.viewer3d import HOST, _free_port

    chromium()
    exported = tmp_path / "scene.html"
    assert cli.run(["viz", "3d", str(oracle_run), "--export", str(exported)]) == 0
    port = _free_port()
    command = [sys.executable, "-m", "hrope.nvs.cli", "viz", "3d", str(oracle_run), "--port", str(port)]
    with open(tmp_path / "server.log", "w") as log:  # a file: a full pipe would stall the server
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://{HOST}:{port}/"
        wait_for_page(url, server)
        browser = DevTools(tmp_path / "profile")
        try:
            served = drawn_share(browser, url, tmp_path / "served.png")
            snapshot = drawn_share(browser, exported.as_uri(), tmp_path / "exported.png")
        finally:
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    for name, share in (("served", served), ("exported", snapshot)):
        assert share > MIN_SCENE_SHARE, (
            f"the {name} page looks blank: {share:.3f} of the canvas differs from the background"
        )


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on ``port`` (Linux)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the socket table of Linux")
def test_the_server_binds_localhost_only(scene):
    from hrope.nvs.viz.viewer3d import HOST, _free_port, serve

    assert HOST == "127.0.0.1"
    empty = Scene3D([], [], np.array([0, 0, 1.0]), np.zeros(3), np.ones(3), 0.3)
    port = _free_port()
    server = serve(empty, port)
    try:
        deadline = time.time() + 10
        while True:
            try:
                assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).status == 200
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        assert listening_addresses(port) == ["0100007F"]  # 127.0.0.1 (little-endian hex), IPv4 only
    finally:
        server.stop()


# ------------------------------------------------------------------ the command
def test_cli_export_writes_a_self_contained_page(oracle_run, tmp_path, capsys):
    out = tmp_path / "docs" / "scene.html"
    assert cli.run(["viz", "3d", str(oracle_run), "--export", str(out), "--colour", "error"]) == 0
    html = out.read_text()
    assert "__VISER_EMBED_DATA__" in html and "</html>" in html.lower()
    assert not list(out.parent.glob("*.tmp"))


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["no/such/run"], "not found"),
        (["{run}", "--export", "{tmp}/scene.png"], "*.html"),
        (["{run}", "--colour", "depth", "--export", "{tmp}/s.html"], "colour"),
        (["{run}", "--views", "a,b", "--export", "{tmp}/s.html"], "--views"),
    ],
)
def test_cli_errors_are_one_line(oracle_run, tmp_path, capsys, arguments, message):
    arguments = [a.format(run=oracle_run, tmp=tmp_path) for a in arguments]
    assert cli.run(["viz", "3d", *arguments]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hrope viz: error:") and message in lines[0], lines


def test_without_viser_the_viewer_names_the_extra(monkeypatch):
    from hrope.nvs.viz.viewer3d import serve

    monkeypatch.setitem(sys.modules, "viser", None)  # `import viser` now raises ImportError
    empty = Scene3D([], [], np.array([0, 0, 1.0]), np.zeros(3), np.ones(3), 0.3)
    with pytest.raises(VizError, match=r"pip install 'hrope\[viz3d\]'"):
        serve(empty)
