"""`SyntheticConfig`: every range the synthetic scene generator draws from (validated)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SyntheticConfig"]

Range = tuple[float, float]


@dataclass(frozen=True)
class SyntheticConfig:
    """Ranges for :func:`hrope.nvs.data.synthetic.make_scene`; lengths in metres, angles in degrees.

    The world frame has OpenCV-like axes: y points down (the floor is y = 0, "up" is -y).

    Cameras: ``fov_deg`` is the horizontal field of view; ``focal_aspect_jitter`` draws
    fy = fx (1 + U(-j, j)); ``principal_point_jitter`` offsets cx, cy by U(-j, j) times W, H;
    ``per_view_intrinsics`` draws them per view instead of per scene (a video has one camera).
    Trajectories: ``num_frames`` frames of a virtual video. Rooms walk forward along a corridor of
    half-width ``corridor`` at ``room_speed`` metres per frame, heading oscillating by up to
    ``room_turn_deg`` and looking around by up to ``room_look_deg``. Objects are orbited once on a
    sphere cap: elevation in ``object_elevation_deg``, distance ``object_distance`` times the
    object's radius. An object is ``object_boxes`` (inclusive count range) boxes of half-sizes in
    ``object_box_half_size``, tumbled (a random rotation instead of a yaw) with probability
    ``object_tumble_probability``, centred within ``object_spread`` of the origin, plus
    ``object_boards`` slanted boards leaning into the cluster.
    Textures: ``texture_size`` (power of two; None picks 2 x the larger image side, clamped to
    64..512), ``photo_probability`` of a photograph instead of a procedural pattern.
    """

    fov_deg: Range = (50.0, 80.0)
    focal_aspect_jitter: float = 0.05
    principal_point_jitter: float = 0.05
    per_view_intrinsics: bool = False
    num_frames: int = 200
    room_width: Range = (3.6, 6.0)
    room_length: Range = (8.0, 12.0)
    room_height: Range = (2.5, 3.2)
    camera_height: Range = (1.2, 1.7)
    corridor: float = 0.5
    room_speed: Range = (0.012, 0.03)
    room_turn_deg: float = 25.0
    room_look_deg: float = 20.0
    object_elevation_deg: Range = (10.0, 45.0)
    object_distance: Range = (1.6, 2.6)
    object_boxes: tuple[int, int] = (2, 4)
    object_box_half_size: Range = (0.1, 0.35)
    object_tumble_probability: float = 0.4
    object_spread: float = 0.35
    object_boards: tuple[int, int] = (0, 2)
    texture_size: int | None = None
    photo_probability: float = 0.4

    def __post_init__(self) -> None:
        for name in ("fov_deg", "room_width", "room_length", "room_height", "camera_height",
                     "room_speed", "object_elevation_deg", "object_distance", "object_box_half_size"):
            low, high = getattr(self, name)
            if not (0 < low <= high):
                raise ValueError(f"SyntheticConfig.{name} must satisfy 0 < low <= high, got {(low, high)}")
        if self.fov_deg[1] >= 170:
            raise ValueError(f"SyntheticConfig.fov_deg must stay below 170 degrees, got {self.fov_deg}")
        if self.object_elevation_deg[1] >= 85:
            raise ValueError(f"SyntheticConfig.object_elevation_deg must stay below 85, got "
                             f"{self.object_elevation_deg}")
        if self.object_distance[0] <= 1.2:
            raise ValueError("SyntheticConfig.object_distance must exceed 1.2 object radii (cameras would "
                             f"enter the object), got {self.object_distance}")
        if not 1 <= self.object_boxes[0] <= self.object_boxes[1]:
            raise ValueError(f"SyntheticConfig.object_boxes must satisfy 1 <= low <= high, got {self.object_boxes}")
        if not 0 <= self.object_boards[0] <= self.object_boards[1]:
            raise ValueError(f"SyntheticConfig.object_boards must satisfy 0 <= low <= high, got {self.object_boards}")
        if not 0 <= self.object_tumble_probability <= 1 or self.object_spread < 0:
            raise ValueError("SyntheticConfig.object_tumble_probability must be in [0, 1] and object_spread >= 0, got "
                             f"{self.object_tumble_probability}, {self.object_spread}")
        if self.num_frames < 2:
            raise ValueError(f"SyntheticConfig.num_frames must be >= 2, got {self.num_frames}")
        if self.room_width[0] / 2 - self.corridor < 1.0:
            raise ValueError(f"SyntheticConfig.room_width {self.room_width} leaves no space beside the camera "
                             f"corridor (half-width {self.corridor}); need width >= 2 * (corridor + 1)")
        if self.camera_height[1] >= self.room_height[0] - 0.2:
            raise ValueError(f"SyntheticConfig.camera_height {self.camera_height} does not fit under the "
                             f"ceiling {self.room_height}")
        for name in ("focal_aspect_jitter", "principal_point_jitter"):
            if not 0 <= getattr(self, name) < 0.5:
                raise ValueError(f"SyntheticConfig.{name} must be in [0, 0.5), got {getattr(self, name)}")
        if not 0 <= self.photo_probability <= 1:
            raise ValueError(f"SyntheticConfig.photo_probability must be in [0, 1], got {self.photo_probability}")
        size = self.texture_size
        if size is not None and (size < 8 or size & (size - 1)):
            raise ValueError(f"SyntheticConfig.texture_size must be a power of two >= 8, got {size}")
