"""The ``model`` section of a run config: :class:`ModelConfig`, the LVSM's hyper-parameters and its
parameter source, checked once, with every rule across them.

Encodings: any registry name (``hrope.ENCODINGS``) or ``<name>-ape`` for one of
:data:`APE_ENCODINGS`; :data:`PRESETS` give the architecture of ``model.preset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ...encodings import ENCODINGS, Encoding, get_encoding
from ...errors import EncodingError
from .fields import ModelError, PredictorError, check_fields, did_you_mean, given_field, plain_values
from .options import PREDICTORS, LearnedOptions, SourceOptions, source_options
from .schema import ModelSettings

__all__ = ["ModelConfig", "PRESETS", "APE_ENCODINGS", "APE_SUFFIX", "encoding_names"]

APE_SUFFIX = "-ape"

PRESETS: dict[str, dict] = {
    "tiny": dict(image_size=64, patch_size=8, dim=128, layers=4, heads=4),
    "small": dict(image_size=128, patch_size=8, dim=384, layers=6, heads=8),
    "paper": dict(image_size=256, patch_size=8, dim=768, layers=6, heads=16),
    "lvsm": dict(image_size=256, patch_size=8, dim=768, layers=24, heads=12),  # LVSM's RE10K decoder-only model
}

# Encodings whose ``<name>-ape`` variant is a distinct model: every encoding with per-token inputs
# except hrope-pf, whose APE variant would embed hrope's planes with hrope's decoder (hrope-ape),
# and hrope-lift-uv, whose would embed hrope-lift's planes with hrope-lift's decoder (hrope-lift-ape).
APE_ENCODINGS = ("hrope-lift", "hrope", "hrope-depth", "hrope-so3", "hrope-se3", "hrope-full", "rayrope", "worldrope")

# the keys a resolved config always writes into its model section (SETTINGS: shown)
SHOWN = ("encoding", "predictor")


def encoding_names() -> list[str]:
    """Registry names plus ``<name>-ape`` for every name in :data:`APE_ENCODINGS`."""
    return list(ENCODINGS) + [name + APE_SUFFIX for name in APE_ENCODINGS]


@dataclass(frozen=True)
class ModelConfig(ModelSettings):
    """LVSM hyper-parameters: the fields of :class:`hrope.nvs.config.ModelSettings` (defaults, what
    each accepts, docs), checked, with the encoding and predictor names checked against their
    registries and every rule across the fields (shapes, additive encodings, the parameter source
    and its options). ``predictor_options`` is the :class:`~hrope.nvs.config.SourceOptions` of
    ``predictor`` (a mapping given here is read into it). ``rays``: ``auto`` (world for ``none``
    and ``*-ape``, camera frame for relative encodings), ``world`` or ``camera``. ``predictor`` is
    used only by encodings that need per-token parameters. ``transform_backend``: how the
    encoding's transforms are applied (:data:`hrope.encodings.base.BACKENDS`; ``auto`` uses the
    fused Triton kernel on CUDA; ``torch`` by default). ``folded_attention``: the attention layers
    (:class:`hrope.nn.MultiviewAttention` either way) fold the encoding's per-view factor into the
    projection weights (``fold=True``; same parameters and outputs up to float rounding; off by
    default). ``checkpoint_blocks``: in training, each block's activations are recomputed in the
    backward pass instead of kept (the same gradients, less memory, one more forward per block).

    ``preset`` and ``given`` say how a config file wrote the section (:meth:`from_dict`): the preset
    its architecture defaults to and the keys it named (None: every field); neither changes the model.
    """

    preset: str | None = field(default=None, kw_only=True, compare=False)
    given: tuple[str, ...] | None = given_field()

    def __post_init__(self) -> None:
        options: Any = self.predictor_options
        given = options.to_dict() if isinstance(options, SourceOptions) else options  # read back below
        object.__setattr__(self, "predictor_options", given)
        check_fields(self, "model", ModelError)
        if self.image_size % self.patch_size:
            raise ModelError(f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ModelError(f"dim {self.dim} must split into {self.heads} heads of even size")
        if self.encoding not in encoding_names():
            raise ModelError(f"unknown encoding {self.encoding!r}; available: {', '.join(encoding_names())}")
        if self.predictor not in PREDICTORS:
            raise ModelError(f"unknown predictor {self.predictor!r}; available: {', '.join(PREDICTORS)}")
        if self.additive is not None:
            if self.additive not in APE_ENCODINGS:
                raise ModelError(
                    f"model.additive {self.additive!r} is not an encoding with embeddable per-token values; "
                    f"available: {', '.join(APE_ENCODINGS)}"
                )
            if self.is_ape or ENCODINGS[self.encoding].takes_token_inputs():
                raise ModelError(
                    f"model.additive needs an encoding without per-token inputs, got {self.encoding!r} "
                    "(its values and the added ones would need two parameter sources)"
                )
        object.__setattr__(self, "predictor_options", source_options(self.predictor, given))
        self._check_parameter_source()

    def _check_parameter_source(self) -> None:
        """The rules across the encoding (with its options), the parameter source and its options."""
        base = self.encoding_module()
        if self.is_ape and base.data_param_names:
            raise ModelError(
                f"{self.encoding} adds its per-token values to the tokens and attends with no encoding, so "
                f"{list(base.data_param_names)} would go unused: use model.encoding {self.base_encoding!r}"
            )
        parameterised = self.parameterised_encoding(base)
        if not parameterised.takes_token_inputs():  # no parameter source is built
            return
        options, data_params = self.predictor_options, parameterised.data_param_names
        if data_params and self.predictor != "external":
            raise PredictorError(
                f"the encoding reads {list(data_params)} from depth maps (rayrope's depth 'known' modes): "
                f"that needs model.predictor 'external', got {self.predictor!r}"
            )
        if (
            options.targets == "transfer"
            and self.predictor in ("learned", "backbone")
            and not parameterised.needs_planes
        ):
            raise PredictorError(
                "predictor_options.targets 'transfer' carries planes over from the context views: it "
                "needs an encoding that takes planes"
            )
        if self.attention_heads_of_source > 1 and self.folded_attention:
            raise ModelError(
                "model.folded_attention folds one transform per view into the weights; "
                "predictor_options.per_head prepares one per head: turn one of them off"
            )
        if self.attention_heads_of_source > 1 and self.embedded_encoding is not None:
            raise ModelError(
                f"predictor_options.per_head needs a relative encoding; {self.embedded_encoding!r} adds its "
                "parameters to the tokens, once for all heads"
            )

    def encoding_module(self) -> Encoding:
        """The encoding ``base_encoding`` built with ``encoding_options`` (a :class:`ModelError` for
        options it refuses or does not know)."""
        try:
            return get_encoding(self.base_encoding, **self.encoding_options)
        except EncodingError as error:
            raise ModelError(str(error)) from None
        except TypeError as error:  # an option the constructor does not take
            raise ModelError(f"model.encoding_options do not fit encoding {self.base_encoding!r}: {error}") from None

    def parameterised_encoding(self, base: Encoding) -> Encoding:
        """The encoding whose per-token values the parameter source gives: ``base`` (the encoding
        ``base_encoding`` built), or the ``additive`` one."""
        embedded = self.embedded_encoding
        return base if embedded is None or self.is_ape else get_encoding(embedded)

    @property
    def attention_heads_of_source(self) -> int:
        """Sets of per-token values the parameter source gives: ``heads`` for a ``learned`` source
        with ``per_head``, else 1."""
        per_head = isinstance(self.predictor_options, LearnedOptions) and self.predictor_options.per_head
        return self.heads if per_head else 1

    @property
    def is_ape(self) -> bool:
        return self.encoding.endswith(APE_SUFFIX)

    @property
    def base_encoding(self) -> str:
        return self.encoding[: -len(APE_SUFFIX)] if self.is_ape else self.encoding

    @property
    def embedded_encoding(self) -> str | None:
        """The encoding whose per-token values are added to the tokens (``<name>-ape``: ``<name>``;
        else ``additive``), or None."""
        return self.base_encoding if self.is_ape else self.additive

    @property
    def ray_frame(self) -> str:
        if self.rays != "auto":
            return self.rays
        # camera-frame rays need an encoding that carries the relative pose; none and rope2d do not
        return "world" if self.is_ape or not ENCODINGS[self.encoding].encodes_pose else "camera"

    @property
    def grid(self) -> tuple[int, int]:
        side = self.image_size // self.patch_size
        return side, side

    def fields_dict(self) -> dict:
        """Every field, ``predictor_options`` as given (what resume compares)."""
        return {f.name: self._plain(f.name) for f in fields(ModelSettings)}

    def to_dict(self) -> dict:
        """Every field but a sparse one at its default (:func:`~hrope.nvs.config.fields.plain_values`),
        ``predictor_options`` as given: what saved models store."""
        return {name: self._plain(name) for name in plain_values(self)}

    def section(self) -> dict:
        """The model section as a resolved config writes it: ``preset``, ``encoding``, ``predictor``
        and the keys given (None: those of :meth:`to_dict`)."""
        names = list(plain_values(self)) if self.given is None else self.given
        return {"preset": self.preset, **{name: self._plain(name) for name in (*SHOWN, *names)}}

    def _plain(self, name: str) -> Any:
        value = getattr(self, name)
        return value.to_dict() if isinstance(value, SourceOptions) else value

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        """The model section of a config file: ``preset`` (:data:`PRESETS`) and the fields it sets."""
        known = {f.name for f in fields(ModelSettings)}
        unknown = set(values) - known - {"preset"}
        if unknown:
            suggestion = did_you_mean(min(unknown), sorted(known), "model.")
            raise ModelError(
                f"unknown model options {sorted(unknown)}; {suggestion}known: {sorted(known | {'preset'})}"
            )
        values = dict(values)
        preset = values.pop("preset", None)
        given = tuple(values)
        if preset is not None:
            if not isinstance(preset, str) or preset not in PRESETS:
                raise ModelError(f"unknown model preset {preset!r}; available: {', '.join(PRESETS)}")
            values = {**PRESETS[preset], **values}
        return cls(**values, preset=preset, given=given)
