"""The real-capture benchmark's planned comparisons (experiments/real_captures.py runs them).

A set's rows are *arms*: a model row (:class:`experiments.rows.Row`) trained on a data variant
(:class:`Data`: the geometry the context views carry, the background, synthetic pre-training).

The sets, written down before any run (the planned comparisons):

- ``curve`` (validation split, ``--steps 600 3000``, seeds 0 1 2): ``prope``, ``urope``, the
  learned-plane HRoPE row (``hrope-lift`` learning its planes, transferred to the targets, camera
  rays) and the best depth row decided from the synthetic results, ``hrope-lift-uv`` with SfM depth
  (external, targets transfer, robust fit, camera rays: the best row on synthetic ``object``, whose
  views differ widely, as a capture's do). **Budget rule**: the curve supports the smallest budget B
  such that at B and at every larger budget (i) the rows have the order by mean validation PSNR they
  have at the largest budget and (ii) every row's paired difference to ``prope`` lies inside the 95%
  interval of the same difference at the largest budget; when no smaller budget passes, the largest.
- ``choices`` (validation split, 600 steps, seeds 0 1 2, ``prope``): the photo's background against
  the masked object composited over a plain colour, and training from scratch against starting from
  ``prope`` pre-trained on the synthetic ``object`` scenes (the ``full`` budget, same seed; photo
  background). The better of each pair is the choice for the planned sets. A composited row is
  scored against composited targets (the object over the plain colour), so its PSNR is of other
  images than the photo row's: the report says so beside the table. Chosen (the committed cells in
  ``benchmarks/results/real_captures/choices``): the photo's background, and pre-training, +0.45 dB
  [−0.03, +1.24]; so every arm of ``planned``, ``priors`` and ``held-out`` starts from its own row
  pre-trained on the synthetic ``object`` scenes (:data:`PRETRAIN`, :func:`synthetic_row`: a depth
  row reads the synthetic scenes' rendered depth there). ``--from-scratch`` trains them without
  (:func:`from_scratch`), as a check that the choice changes no conclusion.
- ``planned`` (test split, scored once; reference ``prope``): ``prope``, ``prope`` with world rays,
  ``urope``, ``urope`` at the token's depth (``worldrope`` footprint False), ``hrope-lift`` with
  depth (world rays), ``hrope-lift-uv`` with depth (camera rays), the learned-plane HRoPE row and
  ``rayrope`` known depth; the depth rows are experiments/plane_evidence.py's planned rows with SfM
  depth (``fit: robust``, targets transfer).
- ``priors`` (give it scan24 alone; ``test_every`` 4, test split; reference the learned-plane row):
  the three depth rows (``hrope-lift``, ``hrope-lift-uv``, ``urope`` at the token's depth) with SfM
  depth, the same rows with the priors (geometry ``priors``, ``use_normals: true``) and the
  learned-plane row. Each priors row is also paired with its SfM twin.
- ``held-out`` (protocol ``captures``, test split): train on every view of the other captures, test
  on the captures named in :data:`HELD_OUT` (``maryRose`` and ``mother_child``, named before any
  run); ``prope`` (reference), ``urope``, the learned-plane row, ``hrope-lift-uv`` with SfM depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .plane_evidence import PLANNED_ROWS, TRANSFER, WORLD
from .rows import Row

__all__ = [
    "SETS",
    "HELD_OUT",
    "TEST_EVERY_BY_CAPTURE",
    "Data",
    "Arm",
    "CaptureSet",
    "PROPE",
    "UROPE",
    "LEARNED",
    "BEST_DEPTH",
    "with_geometry",
    "PRETRAIN",
    "synthetic_row",
    "pretrained",
    "from_scratch",
]

HELD_OUT = ("maryRose", "mother_child")  # the held-out captures of the `held-out` set, named before any run
TEST_EVERY_BY_CAPTURE = {"scan24": 4}  # every 4th of scan24's 49 views is a test target, in every set
SFM = (("fit", "robust"),)  # sparse SfM depth: planes by the robust fit
PRIORS = (("use_normals", True),)  # aligned dense priors: the prior normals orient the planes
PRETRAIN = "object"  # the synthetic scenes the planned sets' rows are pre-trained on (chosen by `choices`)


@dataclass(frozen=True)
class Data:
    """What the context views carry and how the model starts: ``geometry`` none | sfm | priors,
    ``background`` photo | composite, ``pretrain``: the synthetic kind the row (its
    :func:`synthetic_row`) was pre-trained on (the ``full`` budget, the same seed) before training on
    the captures, or None (from scratch)."""

    geometry: str = "none"
    background: str = "photo"
    pretrain: str | None = None

    @property
    def name(self) -> str:
        """The cells' dataset name (their first folder under the cache)."""
        return f"{self.geometry}-{self.background}" + (f"-pretrained-{self.pretrain}" if self.pretrain else "")


@dataclass(frozen=True)
class Arm:
    """One row of a set: a model row trained on a data variant."""

    row: Row
    data: Data = Data()

    @property
    def label(self) -> str:
        tags = [f"{self.data.geometry} depth"] if self.data.geometry != "none" else []
        tags += [f"background {self.data.background}"] if self.data.background != "photo" else []
        tags += [f"pre-trained on {self.data.pretrain}"] if self.data.pretrain else []
        return self.row.label + (f" [{', '.join(tags)}]" if tags else "")


@dataclass(frozen=True)
class CaptureSet:
    """A planned comparison: its arms (the first is the reference), the split scored, the protocol,
    ``test_every`` (of every capture not in :data:`TEST_EVERY_BY_CAPTURE`), the held-out captures (protocol
    ``captures``), the default steps and extra ``pairs`` (a, b) of arm indices compared beside the
    reference."""

    name: str
    title: str
    arms: tuple[Arm, ...]
    split: str = "val"
    protocol: str = "views"
    test_every: int = 8
    held_out: tuple[str, ...] = ()
    steps: tuple[int, ...] = (600,)
    pairs: tuple[tuple[int, int], ...] = field(default=())


def _planned(label: str) -> Row:
    """A row of experiments/plane_evidence.py's PLANNED_ROWS by its label."""
    return next(row for row in PLANNED_ROWS if row.label == label)


def with_geometry(row: Row, geometry: str) -> Arm:
    """A depth row (``external``, targets transfer) on SfM depth (robust fit) or on the priors (their normals)."""
    return Arm(replace(row, options=row.options + (SFM if geometry == "sfm" else PRIORS)), Data(geometry))


def synthetic_row(row: Row) -> Row:
    """The row a capture row is pre-trained as on synthetic scenes: the same model without the capture
    geometry's options (a depth row reads the synthetic scenes' rendered depth, fitted by least squares)."""
    return replace(row, options=tuple(option for option in row.options if option not in SFM + PRIORS))


def pretrained(arms: tuple[Arm, ...], kind: str = PRETRAIN) -> tuple[Arm, ...]:
    """``arms``, each starting from its :func:`synthetic_row` pre-trained on the synthetic ``kind``."""
    return tuple(replace(arm, data=replace(arm.data, pretrain=kind)) for arm in arms)


def from_scratch(spec: CaptureSet) -> CaptureSet:
    """``spec`` with every arm trained from scratch; refused for a set that compares pre-training itself
    or has no pre-trained arm."""
    if any(arm.data.pretrain is None for arm in spec.arms):
        raise ValueError(f"--from-scratch: the set {spec.name!r} does not pre-train every row")
    return replace(spec, arms=tuple(replace(arm, data=replace(arm.data, pretrain=None)) for arm in spec.arms))


PROPE, PROPE_WORLD, UROPE = Arm(Row("prope")), Arm(Row("prope", model_options=WORLD)), Arm(Row("urope"))
LEARNED = Arm(Row("hrope-lift", options=TRANSFER))  # the learned-plane HRoPE row (camera rays)
DEPTH_ROWS = {  # the planned set's depth rows, as plane_evidence defines them
    "hrope-lift": _planned("hrope-lift (external, targets transfer, rays world)"),
    "hrope-lift-uv": _planned("hrope-lift-uv (external, targets transfer)"),
    "urope at the token's depth": _planned("worldrope (external, targets transfer, footprint False)"),
    "rayrope known depth": _planned("rayrope (external, targets transfer, depth known)"),
}
BEST_DEPTH = with_geometry(DEPTH_ROWS["hrope-lift-uv"], "sfm")
PRIOR_ROWS = ("hrope-lift", "hrope-lift-uv", "urope at the token's depth")

SETS = {
    "curve": CaptureSet(
        "curve",
        "Learning curve on the validation views: which budget",
        (PROPE, UROPE, LEARNED, BEST_DEPTH),
        steps=(600, 3000),
    ),
    "choices": CaptureSet(
        "choices",
        "Data choices on the validation views: background, synthetic pre-training",
        (PROPE, Arm(PROPE.row, Data(background="composite")), Arm(PROPE.row, Data(pretrain=PRETRAIN))),
    ),
    "planned": CaptureSet(
        "planned",
        "Planned comparisons on real captures (held-out views, test split)",
        pretrained(
            (PROPE, PROPE_WORLD, UROPE)
            + tuple(with_geometry(DEPTH_ROWS[n], "sfm") for n in ("urope at the token's depth", "hrope-lift"))
            + (BEST_DEPTH, LEARNED, with_geometry(DEPTH_ROWS["rayrope known depth"], "sfm"))
        ),
        split="eval",
    ),
    "priors": CaptureSet(
        "priors",
        "SfM points against the foundation model's priors against learned planes (scan24, test split)",
        pretrained((LEARNED,) + tuple(with_geometry(DEPTH_ROWS[n], g) for g in ("sfm", "priors") for n in PRIOR_ROWS)),
        split="eval",
        test_every=4,
        pairs=((4, 1), (5, 2), (6, 3)),
    ),
    "held-out": CaptureSet(
        "held-out",
        f"Held-out captures ({', '.join(HELD_OUT)}), test split",
        pretrained((PROPE, UROPE, LEARNED, BEST_DEPTH)),
        split="eval",
        protocol="captures",
        held_out=HELD_OUT,
    ),
}
