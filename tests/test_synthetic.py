"""Synthetic scenes: exact rendering against an independent ray caster, geometry, determinism."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import hrope
from hrope.nvs.data import Scene, SyntheticConfig, make_scene
from hrope.nvs.data.synthetic import scene_setup
from hrope.nvs.data.synthetic.preview import main as preview_main
from hrope.nvs.data.synthetic.render import Quads, render
from hrope.nvs.data.synthetic.textures import MipTextures

SIZE = (24, 32)


def pixel_rays(K: torch.Tensor, image_size) -> torch.Tensor:
    """Camera-frame rays ``(H, W, 3)`` (z = 1) through pixel centres."""
    H, W = image_size
    ys, xs = torch.meshgrid(
        torch.arange(H, dtype=torch.float64) + 0.5, torch.arange(W, dtype=torch.float64) + 0.5, indexing="ij"
    )
    return torch.stack([(xs - K[0, 2]) / K[0, 0], (ys - K[1, 2]) / K[1, 1], torch.ones_like(xs)], -1)


def ray_cast(quads: Quads, world_to_cam: torch.Tensor, rays: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent reference: nearest quad id and z-depth for camera-frame rays ``(..., 3)``."""
    E = world_to_cam.double()
    R, t = E[:3, :3], E[:3, 3]
    origin = -R.T @ t
    directions = rays @ R  # world directions (R^T r)
    best_z = torch.full(rays.shape[:-1], math.inf, dtype=torch.float64)
    best_id = torch.full(rays.shape[:-1], -1, dtype=torch.long)
    for p in range(quads.count):
        c, a, b = quads.centre[p], quads.axis_u[p], quads.axis_v[p]
        n = torch.linalg.cross(a, b)
        if not quads.two_sided[p] and float(n @ (origin - c)) <= 0:
            continue
        s = (n @ (c - origin)) / (directions @ n)
        X = origin + s[..., None] * directions
        gram = torch.stack([torch.stack([a @ a, a @ b]), torch.stack([a @ b, b @ b])])
        coeff = torch.linalg.solve(gram, torch.stack([(X - c) @ a, (X - c) @ b], -1)[..., None]).squeeze(-1)
        z = s * rays[..., 2]
        hit = (coeff.abs().amax(-1) <= 1) & (z > 1e-3) & (z < best_z)
        best_z = torch.where(hit, z, best_z)
        best_id = torch.where(hit, p, best_id)
    return best_id, best_z


@pytest.fixture(scope="module", params=["room", "object"])
def rendered(request):
    layout, cameras, textures = scene_setup(3, 1, request.param, 3, SIZE, frames=[0, 30, 60])
    return layout, cameras, render(layout.quads, textures, cameras)


def test_render_matches_independent_ray_caster(rendered):
    layout, cameras, out = rendered
    for v in range(cameras.num_views):
        ids, z = ray_cast(layout.quads, cameras.world_to_cam[0, v], pixel_rays(cameras.K[0, v].double(), SIZE))
        agree = ids == out.plane_id[v]
        assert agree.double().mean() > 0.99  # only exact ties (shared box edges) may differ
        torch.testing.assert_close(out.depth[v][agree].double(), z[agree], rtol=1e-4, atol=0)


def test_depth_reprojects_onto_the_pixel_that_sees_the_same_point(rendered):
    layout, cameras, out = rendered
    K, E = cameras.K[0].double(), cameras.world_to_cam[0].double()
    H, W = SIZE
    checked = 0
    for i, j in [(0, 1), (1, 0), (1, 2), (2, 1)]:
        seen = out.plane_id[i] >= 0
        X_cam = pixel_rays(K[i], SIZE)[seen] * out.depth[i][seen, None].double()
        X_world = (X_cam - E[i, :3, 3]) @ E[i, :3, :3]  # R^T (X - t)
        X_j = X_world @ E[j, :3, :3].T + E[j, :3, 3]
        p_j = X_j @ K[j].T
        p_j = p_j[:, :2] / p_j[:, 2:]
        inside = (X_j[:, 2] > 0) & (p_j[:, 0] > 0) & (p_j[:, 0] < W) & (p_j[:, 1] > 0) & (p_j[:, 1] < H)
        # Visibility in view j from the independent ray caster, at the exact reprojected position.
        ray_j = torch.cat([(p_j - K[j, :2, 2]) / K[j].diagonal()[:2], torch.ones_like(p_j[:, :1])], -1)
        ids, z = ray_cast(layout.quads, E[j], ray_j)
        visible = inside & (ids == out.plane_id[i][seen]) & ((z - X_j[:, 2]).abs() < 1e-4 * X_j[:, 2])
        landing = p_j.floor().long()
        x, y = landing[:, 0].clamp(0, W - 1), landing[:, 1].clamp(0, H - 1)
        # Only where the reference sees the same quad at the landing pixel's centre (not across an edge).
        centre_ids, _ = ray_cast(layout.quads, E[j], pixel_rays(K[j], SIZE)[y, x])
        check = visible & (centre_ids == ids)
        # The landing pixel sees the same quad, and its exact plane contains the reprojected point.
        assert torch.equal(out.plane_id[j, y, x][check], out.plane_id[i][seen][check])
        m_j = out.plane_m[j, :, y, x].T.double()
        torch.testing.assert_close(
            (m_j * X_j).sum(-1)[check], torch.ones(int(check.sum()), dtype=torch.float64), rtol=0, atol=1e-4
        )
        checked += int(check.sum())
    assert checked > 200


def test_normals_are_unit_and_face_the_camera(rendered):
    _, cameras, out = rendered
    seen = out.plane_id >= 0
    normals = out.normals.permute(0, 2, 3, 1)[seen]
    torch.testing.assert_close(normals.norm(dim=-1), torch.ones(len(normals)))
    points = torch.stack([pixel_rays(cameras.K[0, v].double(), SIZE) for v in range(cameras.num_views)])
    points = (points * out.depth[..., None].double())[seen]
    assert ((normals.double() * points).sum(-1) < 0).all()
    m = out.plane_m.permute(0, 2, 3, 1)[seen].double()
    torch.testing.assert_close((m * points).sum(-1), torch.ones(len(m), dtype=torch.float64), rtol=0, atol=1e-4)


def test_fitted_patch_planes_match_ground_truth():
    layout, cameras, textures = scene_setup(5, 2, "object", 2, (64, 64), frames=[0, 40])
    out = render(layout.quads, textures, cameras)
    scene = Scene(out.images, cameras, depth=out.depth, normals=out.normals, plane_m=out.plane_m)
    truth = scene.planes(8).m(cameras, (8, 8))[0]
    fitted = hrope.Planes.from_depth(out.depth[None], cameras, 8).m(cameras, (8, 8))[0]
    ids = out.plane_id.reshape(2, 8, 8, 8, 8).permute(0, 1, 3, 2, 4).reshape(128, 64)
    single = (ids == ids[:, :1]).all(-1)
    assert single.sum() > 40
    error = (fitted - truth).norm(dim=-1) / truth.norm(dim=-1)
    assert error[single].max() < 2e-5  # float32 depth: measured <= 2.2e-6; 10x margin
    assert error[~single].max() > 1e-3  # mixed patches differ, so the comparison can fail


def test_pixels_that_see_nothing_are_marked():
    quad = Quads(
        centre=torch.tensor([[0.0, 0.0, 3.0]], dtype=torch.float64),
        axis_u=torch.tensor([[0.5, 0.0, 0.0]], dtype=torch.float64),
        axis_v=torch.tensor([[0.0, 0.5, 0.0]], dtype=torch.float64),
        two_sided=torch.tensor([True]),
        texture=torch.tensor([0]),
        texture_scale=torch.ones(1, 2, dtype=torch.float64),
        texture_offset=torch.zeros(1, 2, dtype=torch.float64),
        brightness=torch.ones(1, dtype=torch.float64),
    )
    K = torch.tensor([[[[20.0, 0, 16], [0, 20, 16], [0, 0, 1]]]])
    cameras = hrope.Cameras(K, torch.eye(4)[None, None], (32, 32))
    out = render(quad, MipTextures(torch.rand(1, 3, 16, 16)), cameras, background=0.25)
    seen = out.plane_id[0] >= 0
    assert 0 < seen.sum() < 32 * 32
    assert torch.isinf(out.depth[0][~seen]).all() and (out.images[0][:, ~seen] == 0.25).all()
    assert (out.normals[0][:, ~seen] == 0).all() and (out.plane_m[0][:, ~seen] == 0).all()
    torch.testing.assert_close(out.depth[0][seen], torch.full((int(seen.sum()),), 3.0))
    torch.testing.assert_close(out.normals[0][:, seen].T, torch.tensor([[0.0, 0.0, -1.0]]).expand(int(seen.sum()), 3))


def test_mipmapping_prevents_aliasing_on_a_minified_floor():
    """A fine checker floor seen at a grazing angle: close to a 4x supersampled reference only with mip-mapping."""
    y, x = torch.meshgrid(torch.arange(256), torch.arange(256), indexing="ij")
    texture = ((x // 4 + y // 4) % 2).float().expand(3, 256, 256)
    floor = Quads(
        centre=torch.tensor([[0.0, 0.0, 20.0]], dtype=torch.float64),
        axis_u=torch.tensor([[20.0, 0.0, 0.0]], dtype=torch.float64),
        axis_v=torch.tensor([[0.0, 0.0, 19.0]], dtype=torch.float64),
        two_sided=torch.tensor([True]),
        texture=torch.tensor([0]),
        texture_scale=torch.full((1, 2), 4.0, dtype=torch.float64),
        texture_offset=torch.zeros(1, 2, dtype=torch.float64),
        brightness=torch.ones(1, dtype=torch.float64),
    )
    E = torch.eye(4)
    E[1, 3] = 1.0  # camera centre at y = -1: 1 m above the floor (y points down)

    def view(scale: int, mip: bool) -> torch.Tensor:
        textures = MipTextures(texture[None])
        if not mip:
            textures.num_levels = 1  # level 0 only: point-sampled minification
        K = torch.tensor([[[[16.0 * scale, 0, 16 * scale], [0, 16 * scale, 16 * scale], [0, 0, 1]]]])
        cameras = hrope.Cameras(K, E[None, None], (32 * scale, 32 * scale))
        return render(floor, textures, cameras).images

    reference = F.avg_pool2d(view(4, True), 4)
    below = slice(17, 32)  # the floor half of the image
    error_mip = (view(1, True) - reference)[..., below, :].abs().mean()
    error_naive = (view(1, False) - reference)[..., below, :].abs().mean()
    assert error_mip < 0.5 * error_naive, (error_mip, error_naive)


def test_same_seed_is_bit_identical_and_seeds_differ():
    a = make_scene(7, 3, "room", 2, SIZE)
    b = make_scene(7, 3, "room", 2, SIZE)
    for field in ("images", "depth", "normals", "plane_m"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert torch.equal(a.cameras.K, b.cameras.K) and torch.equal(a.cameras.world_to_cam, b.cameras.world_to_cam)
    for other in (make_scene(8, 3, "room", 2, SIZE), make_scene(7, 4, "room", 2, SIZE)):
        assert not torch.equal(a.images, other.images)
        assert not torch.equal(a.cameras.world_to_cam, other.cameras.world_to_cam)


def test_frame_subsets_show_the_same_scene():
    few = make_scene(2, 0, "object", 2, SIZE, frames=[10, 70])
    more = make_scene(2, 0, "object", 3, SIZE, frames=[0, 70, 150])
    assert torch.equal(few.images[1], more.images[1]) and torch.equal(few.depth[1], more.depth[1])


def test_intrinsics_are_jittered_within_the_configured_range():
    config = SyntheticConfig(fov_deg=(40.0, 70.0), principal_point_jitter=0.1, per_view_intrinsics=True)
    Ks = torch.cat([scene_setup(0, i, "room", 3, (30, 40), config=config)[1].K[0] for i in range(4)])
    fov = 2 * torch.atan(20 / Ks[:, 0, 0]).rad2deg()
    assert fov.min() >= 40 - 1e-3 and fov.max() <= 70 + 1e-3 and fov.std() > 1
    assert ((Ks[:, 1, 1] / Ks[:, 0, 0] - 1).abs() <= config.focal_aspect_jitter + 1e-6).all()
    assert (Ks[:, 1, 1] != Ks[:, 0, 0]).all()
    assert ((Ks[:, 0, 2] - 20).abs() <= 4 + 1e-4).all() and (Ks[:, 0, 2] - 20).abs().max() > 0.5
    assert len({float(k) for k in Ks[:3, 0, 0]}) == 3  # per-view draws


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_scene(0, 0, num_views=0), "num_views"),
        (lambda: make_scene(0, 0, image_size=(30, 32), patch_size=8), "not divisible by patch size"),
        (lambda: make_scene(0, 0, kind="forest"), "kind"),
        (lambda: make_scene(0, 0, num_views=2, frames=[0, 500]), "outside"),
        (lambda: make_scene(0, 0, config=SyntheticConfig(room_speed=(0.2, 0.3))), "impossible trajectory"),
        (
            lambda: make_scene(0, 0, "object", config=SyntheticConfig(object_distance=(20.0, 30.0))),
            "impossible trajectory",
        ),
        (lambda: SyntheticConfig(fov_deg=(80.0, 50.0)), "fov_deg"),
        (lambda: SyntheticConfig(texture_size=100), "texture_size"),
    ],
)
def test_bad_configuration_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_preview_cli_writes_a_grid(tmp_path):
    from PIL import Image

    out = tmp_path / "preview.png"
    preview_main([str(out), "--kind", "object", "--scenes", "1", "--views", "2", "--size", "16", "24"])
    image = Image.open(out)
    assert image.size == (2 * 24, 3 * 16)


def test_textures_and_mip_levels():
    from hrope.nvs.data.rng import Rng
    from hrope.nvs.data.synthetic.textures import make_texture

    for kind in ("photo", "procedural", "any"):
        texture = make_texture(Rng(kind), 64, kind)
        assert texture.shape == (3, 64, 64) and 0 <= float(texture.min()) and float(texture.max()) <= 1
        assert float(texture.std()) > 0.01
    stack = torch.rand(2, 3, 32, 32)
    mip = MipTextures(stack)
    assert mip.num_levels == 4  # 32, 16, 8, 4
    s = torch.tensor([0.3, 1.7, -0.3])  # mirrored repeat: 1.7 -> 0.3, -0.3 -> 0.3
    colour = mip.sample(torch.tensor([1, 1, 1]), s, torch.full((3,), 0.5), torch.ones(3))
    torch.testing.assert_close(colour[:, 1], colour[:, 0])
    torch.testing.assert_close(colour[:, 2], colour[:, 0])
    coarse = mip.sample(torch.tensor([1]), torch.tensor([0.5]), torch.tensor([0.5]), torch.tensor([1e4]))
    torch.testing.assert_close(coarse[:, 0], stack[1].mean((1, 2)), atol=0.1, rtol=0)
    with pytest.raises(ValueError, match="power of two"):
        MipTextures(torch.rand(1, 3, 24, 24))
