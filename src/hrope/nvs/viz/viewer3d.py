"""The viser layer of ``hrope viz 3d``: draws a :class:`hrope.nvs.viz.scene3d.Scene3D` in a browser.

viser (the ``viz3d`` extra) serves a web page with the scene over a websocket; :func:`serve`
binds it to 127.0.0.1 only, so the page is reachable from this machine alone (forward the port
over ssh to look from elsewhere). :func:`export_html` writes a self-contained HTML snapshot of the
same scene (viser's serialised scene inside its client page), which opens without a server.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..running.atomic import write_text
from .scene3d import Scene3D
from .figures import VizError

__all__ = ["HOST", "serve", "show", "export_html", "populate", "load_scene3d"]

HOST = "127.0.0.1"
QUAD_OPACITY = 0.85


def _viser():
    try:
        import viser
    except ImportError as error:
        raise VizError("hrope viz 3d needs viser: pip install 'hrope[viz3d]'") from error
    return viser


def populate(server, scene: Scene3D) -> None:
    """Add ``scene``'s frusta, quads and viewpoint to a ``viser.ViserServer``."""
    import trimesh

    server.scene.set_up_direction(tuple(float(x) for x in scene.up))
    server.initial_camera.position = tuple(float(x) for x in scene.eye)
    server.initial_camera.look_at = tuple(float(x) for x in scene.look_at)
    server.initial_camera.up = tuple(float(x) for x in scene.up)
    for frustum in scene.frusta:
        name = "/cameras/" + frustum.name.replace(" ", "_")
        server.scene.add_camera_frustum(
            name,
            fov=frustum.fov,
            aspect=frustum.aspect,
            scale=scene.frustum_scale * (1.3 if frustum.target else 1.0),
            thickness=scene.frustum_scale * (0.06 if frustum.target else 0.03),
            color=frustum.colour,
            image=frustum.image,
            format="png",
            wxyz=frustum.wxyz,
            position=frustum.position,
        )
        server.scene.add_label(name + "/label", frustum.name, position=(0.0, 0.0, 0.0))
    for group in scene.quads:
        if not len(group.corners):
            continue
        mesh = trimesh.Trimesh(
            vertices=group.corners.reshape(-1, 3),
            faces=group.faces,
            face_colors=group.face_colours(QUAD_OPACITY),
            process=False,
        )
        server.scene.add_mesh_trimesh("/planes/" + group.name.replace(" ", "_"), mesh)


def serve(scene: Scene3D, port: int = 8080):
    """A running ``viser.ViserServer`` on 127.0.0.1:``port`` showing ``scene`` (call ``.stop()``)."""
    viser = _viser()
    server = viser.ViserServer(host=HOST, port=port, verbose=False)
    populate(server, scene)
    return server


def export_html(scene: Scene3D, path: str | Path, port: int = 0) -> Path:
    """Write a self-contained HTML snapshot of ``scene`` to ``path`` (atomically); returns it.

    viser records the scene through a server, started on 127.0.0.1 (``port`` 0: a free one) and
    stopped once the snapshot is taken.
    """
    path = Path(path)
    if path.suffix != ".html":
        raise VizError(f"--export {str(path)!r}: the snapshot is an HTML page; name it *.html")
    server = serve(scene, port or _free_port())
    try:
        html = server.scene.as_html()
    finally:
        server.stop()
    write_text(path, html)
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def load_scene3d(path: str | Path, **options) -> Scene3D:
    """The :class:`Scene3D` of a run (a folder with a checkpoint, or the checkpoint file: options
    ``scene``, ``layer``, ``colour``, ``device`` of :func:`hrope.nvs.viz.scene3d.run_scene`) or of a
    capture (a scene folder: ``views``, ``image_size``, ``patch_size``, ``colour``, ``depth`` of
    :func:`hrope.nvs.viz.scene3d.capture_scene`); options the other kind takes are ignored."""
    from .scene3d import capture_scene, is_run, run_scene

    if not Path(path).exists():
        raise VizError(f"run or capture not found: {path}")
    if is_run(Path(path)):
        return run_scene(path, **_pick(options, "scene", "layer", "colour", "device"))
    return capture_scene(path, **_pick(options, "views", "image_size", "patch_size", "colour", "depth"))


def _pick(options: dict, *keys: str) -> dict:
    return {k: v for k, v in options.items() if k in keys}


def show(scene: Scene3D, port: int = 8080, log=print) -> None:
    """Serve ``scene`` on 127.0.0.1:``port`` until interrupted (Ctrl-C)."""
    server = serve(scene, port)
    log(f"viewer on http://{HOST}:{port} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
