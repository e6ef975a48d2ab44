"""`SyntheticConfig`: every range the synthetic scene generator draws from (each field declared with its
check and doc, :func:`hrope.nvs.config.setting`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.fields import Field, check_fields, setting

__all__ = ["SyntheticConfig"]

Range = tuple[float, float]
_LENGTHS = Field("pair", above=0)
_JITTER = Field("float", low=0, below=0.5)
_PROBABILITY = Field("float", low=0, high=1)


@dataclass(frozen=True)
class SyntheticConfig:
    """Ranges for :func:`hrope.nvs.data.synthetic.make_scene`; lengths in metres, angles in degrees
    (each field's doc says what it draws; ``data.synthetic`` overrides them in a run config).

    The world frame has OpenCV-like axes: y points down (the floor is y = 0, "up" is -y). Rooms are
    walked forward along a corridor, heading oscillating and looking around; objects (boxes, some
    tumbled, plus slanted boards) are orbited once on a sphere cap. A video has one camera unless
    ``per_view_intrinsics``.
    """

    fov_deg: Range = setting((50.0, 80.0), Field("pair", above=0, below=170), "horizontal field of view (degrees)")
    focal_aspect_jitter: float = setting(0.05, _JITTER, "fy = fx (1 + U(-j, j))")
    principal_point_jitter: float = setting(0.05, _JITTER, "cx, cy offset by U(-j, j) times W, H")
    per_view_intrinsics: bool = setting(False, Field("bool"), "draw the intrinsics per view (false: per scene)")
    num_frames: int = setting(200, Field("int", low=2), "frames of a scene's virtual video")
    room_width: Range = setting((3.6, 6.0), _LENGTHS, "room width (metres; >= 2 (corridor + 1))")
    room_length: Range = setting((8.0, 12.0), _LENGTHS, "room length (metres)")
    room_height: Range = setting((2.5, 3.2), _LENGTHS, "room height (metres)")
    camera_height: Range = setting((1.2, 1.7), _LENGTHS, "camera height above the floor (metres; below the ceiling)")
    corridor: float = setting(0.5, Field("float"), "half-width of the rooms' camera corridor (metres)")
    room_speed: Range = setting((0.012, 0.03), _LENGTHS, "room walk speed (metres per frame)")
    room_turn_deg: float = setting(25.0, Field("float"), "largest heading oscillation of a room walk (degrees)")
    room_look_deg: float = setting(20.0, Field("float"), "largest look-around angle of a room walk (degrees)")
    object_elevation_deg: Range = setting(
        (10.0, 45.0), Field("pair", above=0, below=85), "orbit elevation of object scenes (degrees)"
    )
    object_distance: Range = setting(
        (1.6, 2.6), Field("pair", above=1.2), "orbit distance in object radii (> 1.2: cameras stay outside the object)"
    )
    object_boxes: tuple[int, int] = setting((2, 4), Field("range", low=1), "boxes per object (inclusive count range)")
    object_box_half_size: Range = setting((0.1, 0.35), _LENGTHS, "box half-sizes (metres)")
    object_tumble_probability: float = setting(0.4, _PROBABILITY, "probability that a box tumbles (a random rotation)")
    object_spread: float = setting(0.35, Field("float", low=0), "box centres within this distance of the origin")
    object_boards: tuple[int, int] = setting((0, 2), Field("range"), "slanted boards leaning into the cluster")
    texture_size: int | None = setting(
        None,
        Field("int", low=8, nullable=True),
        "texture side, a power of two (null: 2 x the larger image side, in 64..512)",
    )
    photo_probability: float = setting(0.4, _PROBABILITY, "probability of a photograph instead of a pattern")

    def __post_init__(self) -> None:
        check_fields(self, "SyntheticConfig", ValueError)
        if self.room_width[0] / 2 - self.corridor < 1.0:
            raise ValueError(
                f"SyntheticConfig.room_width {self.room_width} leaves no space beside the camera "
                f"corridor (half-width {self.corridor}); need width >= 2 * (corridor + 1)"
            )
        if self.camera_height[1] >= self.room_height[0] - 0.2:
            raise ValueError(
                f"SyntheticConfig.camera_height {self.camera_height} does not fit under the ceiling {self.room_height}"
            )
        size = self.texture_size
        if size is not None and size & (size - 1):
            raise ValueError(f"SyntheticConfig.texture_size must be a power of two >= 8, got {size}")
