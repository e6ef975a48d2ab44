"""Every config value is validated: types (a bool is never a number), ranges, choices, null; the
model section by ModelConfig; the rules across keys by RunConfig; the device where it is chosen;
fuzzed overrides and YAML files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hrope import get_encoding
from hrope.nvs.config import (
    SETTINGS,
    SHORTCUTS,
    SOURCE_OPTIONS,
    SOURCE_TARGETS,
    ConfigError,
    ExternalOptions,
    Field,
    LearnedOptions,
    OracleOptions,
    RunConfig,
    apply_overrides,
    check_device,
    defaults,
    load_config,
    parse_value,
    resolve,
    settings_of,
    source_options,
    update_config,
)
from hrope.nvs.config.schema import CAPTURE_KEYS, CAPTURES_KIND
from hrope.nvs.data import LOADERS
from hrope.nvs.data.synthetic import KINDS
from hrope.nvs.model import ModelConfig, ModelError
from hrope.nvs.sources import PredictorError, build_parameter_source, parameter_specs

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
CHECKED = ("data", "train", "eval")  # the sections resolve checks (model: ModelConfig)
KEYS = [f"{section}.{key}" for section in CHECKED for key in SETTINGS[section]]
DEFAULTS = defaults()

# the resolved default config, written out: configs are hashed and saved, so its keys, their order and
# the values must stay exactly these
RESOLVED_DEFAULTS = {
    "model": {"preset": "tiny", "encoding": "none", "predictor": "learned"},
    "data": {
        "kind": "room",
        "root": None,
        "eval_root": None,
        "eval_index": None,
        "context_gap": None,
        "num_scenes": 256,
        "num_context": 2,
        "num_target": 1,
        "seed": 0,
        "cache": True,
        "prefetch": True,
        "synthetic": {},
        "depth": "none",
        "depth_scale": 0.001,
        "image_factor": None,
        "undistort": True,
        "cache_dir": None,
        "workers": 0,
    },
    "train": {
        "out": "runs/default",
        "steps": 1000,
        "batch_size": 4,
        "lr": 4e-4,
        "min_lr_ratio": 0.1,
        "warmup": 100,
        "weight_decay": 0.05,
        "grad_clip": 1.0,
        "bf16": False,
        "seed": 0,
        "device": "auto",
        "log_every": 10,
        "image_every": 200,
        "checkpoint_every": 250,
        "perceptual_weight": 0.0,
        "parameter_lr_scale": 1.0,
        "threads": 0,
        "max_nonfinite_steps": 20,
        "dist_timeout": 600,
        "init_from": None,
    },
    "eval": {"num_scenes": 16, "batch_size": 4, "lpips_weights": None, "num_grid_scenes": 4, "split": "eval"},
}


def field_of(key: str) -> Field:
    section, name = key.split(".")
    return SETTINGS[section][name].check


def test_the_resolved_defaults_are_exactly_the_saved_ones():
    plain = resolve().to_dict()
    assert json.dumps(plain) == json.dumps(RESOLVED_DEFAULTS)  # keys, order, values and their types
    assert resolve() is not resolve() and resolve().data.synthetic is not resolve().data.synthetic
    assert plain is not resolve().to_dict() and plain["data"]["synthetic"] is not resolve().data.synthetic


def test_every_default_passes_its_check():
    for section, entries in SETTINGS.items():
        for key, declared in entries.items():
            assert declared.check.accepts(declared.default), f"{section}.{key}"
    for name, options in SOURCE_OPTIONS.items():  # every source's defaults, targets included
        assert options.source == name and options().targets == SOURCE_TARGETS[name][0]
        for key, declared in settings_of(options).items():
            assert declared.check.accepts(declared.default), f"{name}: {key}"
    assert sum(len(settings_of(options)) for options in SOURCE_OPTIONS.values()) == 29  # 4 + 7 + 15 + 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    config = load_config(path)
    assert isinstance(config, RunConfig) and isinstance(config.model, ModelConfig)
    assert resolve(config.to_dict()) == config and resolve(config.to_dict()).to_dict() == config.to_dict()


# (override, key named in the error): the cases first
BAD_OVERRIDES = [
    (["--train.grad_clip", "-1"], "train.grad_clip must be a finite number > 0, got -1"),
    (["--train.grad_clip", "0"], "train.grad_clip must be a finite number > 0, got 0"),
    (["--lr", "nan"], "train.lr must be a finite number > 0, got nan"),
    (["--lr", "abc"], "train.lr must be a finite number > 0, got 'abc'"),
    (["--lr", ".inf"], "train.lr must be a finite number > 0, got inf"),
    (["--lr", "1e400"], "train.lr must be a finite number > 0, got inf"),
    (["--steps", "true"], "train.steps must be a positive integer, got True"),
    (["--steps", "2.5"], "train.steps must be a positive integer, got 2.5"),
    (["--device", "tpu"], "train.device must be one of auto, cpu, cuda, got 'tpu'"),
    (["--data.num_context", "0"], "data.num_context must be a positive integer, got 0"),
    (["--data.num_target", "0"], "data.num_target must be a positive integer, got 0"),
    (["--data.num_scenes", "0"], "data.num_scenes must be null or a positive integer, got 0"),
    (["--eval.num_scenes", "-1"], "eval.num_scenes must be null or a positive integer, got -1"),
    (["--data.context_gap", "[5, 2]"], "data.context_gap must be null or a list [low, high] of integers"),
    (["--data.context_gap", "[-1, 2]"], "data.context_gap must be null or a list [low, high]"),
    (["--data.context_gap", "[1, 2, 3]"], "data.context_gap must be null or a list [low, high]"),
    (["--data.context_gap", "[0, 9]"], r"data.context_gap [0, 9] must have low >= data.num_context - 1 = 1"),
    (["--data.seed", "-1"], "data.seed must be an integer in [0, 9223372036854775807], got -1"),
    (["--data.cache", "1"], "data.cache must be true or false, got 1"),
    (["--data.synthetic", "[1]"], "data.synthetic must be null or a mapping, got [1]"),
    (["--data.kind", "7"], "data.kind must be a non-empty string, got 7"),
    (["--train.min_lr_ratio", "1.5"], "train.min_lr_ratio must be a finite number in [0, 1], got 1.5"),
    (["--train.warmup", "-1"], "train.warmup must be a non-negative integer, got -1"),
    (["--train.weight_decay", "-0.1"], "train.weight_decay must be a finite number >= 0, got -0.1"),
    (["--train.perceptual_weight", "-1"], "train.perceptual_weight must be a finite number >= 0"),
    (["--train.threads", "-1"], "train.threads must be a non-negative integer, got -1"),
    (["--batch-size", "0"], "train.batch_size must be a positive integer, got 0"),
    (["--eval.batch_size", "false"], "eval.batch_size must be a positive integer, got False"),
    (["--train.max_nonfinite_steps", "0"], "train.max_nonfinite_steps must be a positive integer, got 0"),
    (["--train.init_from", "5"], "train.init_from must be null or a path (a non-empty string), got 5"),
    (["--out", "''"], "train.out must be a path (a non-empty string), got ''"),
    (["--train.bf16", "maybe"], "train.bf16 must be true or false, got 'maybe'"),
]


@pytest.mark.parametrize("args,message", BAD_OVERRIDES, ids=[" ".join(a) for a, _ in BAD_OVERRIDES])
def test_bad_values_are_one_line_errors_naming_the_key(args, message):
    with pytest.raises(ConfigError) as error:
        apply_overrides(resolve(), args)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_accepted_values():
    config = apply_overrides(
        resolve(),
        [
            "--lr",
            "1",
            "--train.grad_clip",
            "0.5",
            "--data.num_scenes",
            "null",  # all scenes: real data only
            "--data.kind",
            "colmap",
            "--data.root",
            "scenes",
            "--data.context_gap",
            "[1, 5]",
            "--train.init_from",
            "runs/x",
            "--train.min_lr_ratio",
            "0",
            "--train.image_every",
            "0",
        ],
    )
    assert config.train.lr == 1 and config.train.grad_clip == 0.5  # an int is a number
    assert config.data.num_scenes is None and config.data.context_gap == [1, 5]


def test_every_entry_point_validates(tmp_path):
    with pytest.raises(ConfigError, match="train.lr must be"):
        resolve({"train": {"lr": -1}})
    with pytest.raises(ConfigError, match="eval.num_scenes must be"):
        update_config(resolve(), {"eval": {"num_scenes": 0}})
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  grad_clip: -1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.grad_clip must be a finite number > 0, got -1$"):
        load_config(path)
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML") as error:
        load_config(path)
    assert "\n" not in str(error.value)  # yaml's own message spans lines
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        load_config(path)


def test_check_device(monkeypatch):
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, cuda, got 'tpu'"):
        check_device("tpu", "--device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"train.device is 'cuda' but torch.cuda.is_available\(\) is False"):
        check_device("cuda")
    assert check_device("auto") == torch.device("cpu") == check_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert check_device("auto") == torch.device("cuda") == check_device("cuda")
    assert check_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(
    "values,message",
    [
        ({"dim": True}, "model.dim must be a positive integer, got True"),
        ({"layers": -1}, "model.layers must be a positive integer, got -1"),
        ({"heads": 0}, "model.heads must be a positive integer, got 0"),
        ({"dim": "abc"}, "model.dim must be a positive integer, got 'abc'"),
        ({"mlp_ratio": float("nan")}, "model.mlp_ratio must be a finite number > 0, got nan"),
        ({"qk_norm": 1}, "model.qk_norm must be true or false, got 1"),
        ({"rays": "sideways"}, "model.rays must be one of auto, world, camera, got 'sideways'"),
        ({"predictor": ["learned"]}, "model.predictor must be a non-empty string, got ['learned']"),
        ({"encoding_options": 5}, "model.encoding_options must be a mapping, got 5"),
        ({"preset": ["tiny"]}, "unknown model preset ['tiny']"),
    ],
)
def test_model_values_are_one_line_model_errors(values, message):
    with pytest.raises(ModelError) as error:
        ModelConfig.from_dict({"preset": "tiny", **values})
    assert str(error.value).startswith(message)


# ----------------------------------------------------------------------------- fuzz
def valid_values(field: Field) -> st.SearchStrategy:
    """Values ``field`` accepts, drawn from its declared kind and bounds."""
    if field.kind == "int":
        values = st.integers(field.low, field.high)
    elif field.kind == "float":
        low, exclusive = (field.low, False) if field.above is None else (field.above, True)
        integers = st.integers(
            math.floor(low) + 1 if exclusive else math.ceil(low),
            10**6 if field.high is None else math.floor(field.high),
        )
        values = integers | st.floats(low, field.high, exclude_min=exclusive, allow_nan=False, allow_infinity=False)
    elif field.kind == "bool":
        values = st.booleans()
    elif field.choices:
        values = st.sampled_from(field.choices)
    elif field.kind in ("str", "path"):
        values = st.from_regex(r"[a-z][a-z0-9_/]{0,12}", fullmatch=True).filter(
            lambda s: isinstance(parse_value(s), str)
        )  # not a YAML keyword (true, null, ...) or nan / inf
    elif field.kind == "mapping":
        values = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), max_size=2)
    elif field.kind == "names":
        values = st.lists(st.sampled_from(["a", "b", "scan24"]), max_size=3, unique=True)
    elif field.kind == "color":
        values = st.lists(st.sampled_from([0, 0.25, 1.0]), min_size=3, max_size=3)
    else:  # range
        values = st.tuples(st.integers(0, 50), st.integers(0, 50)).map(sorted)
    return st.none() | values if field.nullable else values


def as_text(value) -> str:
    """The command-line text of ``value`` (parsed back by parse_value)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


ANY_VALUE = st.one_of(
    st.text(max_size=12),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.floats(),
    st.lists(st.integers(-5, 60) | st.text(max_size=3), max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS + ["--" + s for s in SHORTCUTS]), ANY_VALUE, st.booleans()), max_size=6))
def test_fuzzed_overrides_only_raise_config_errors(draws):
    args, last = [], {}
    for key, value, inline in draws:
        option = key if key.startswith("--") else "--" + key
        text = value if isinstance(value, str) else as_text(value)
        args += [f"{option}={text}"] if inline else [option, text]
        last[SHORTCUTS.get(option[2:], option[2:])] = text
    try:
        config = apply_overrides(resolve(), args)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    for key, text in last.items():  # accepted: the config holds the last value given for each key
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        assert value == parse_value(text) and field_of(key).accepts(value)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(KEYS), max_size=8, unique=True).flatmap(
        lambda keys: st.tuples(*(st.tuples(st.just(k), valid_values(field_of(k))) for k in keys))
    )
)
def test_fuzzed_valid_overrides_pass(draws):
    args = [text for key, value in draws for text in ("--" + key, as_text(value))]
    broken = breaks_a_rule_across_keys(dict(draws))
    if broken:
        with pytest.raises(ConfigError, match=broken):
            apply_overrides(resolve(), args)
        return
    if broken is None:  # a real-data kind: its own rules (tests/test_real_data_pipeline.py)
        return
    config = apply_overrides(resolve(), args)
    for key, value in draws:
        section, name = key.split(".")
        assert getattr(getattr(config, section), name) == parse_value(as_text(value)) == value


def breaks_a_rule_across_keys(given: dict) -> str | None | bool:
    """The key named by the first rule across keys (RunConfig) that ``given`` (``{"section.key":
    value}`` over the defaults) breaks; False when it breaks none, None for a real-data kind."""

    def value(key):
        section, name = key.split(".")
        return given.get(key, SETTINGS[section][name].default)

    gap = value("data.context_gap")
    if gap is not None and gap[0] < value("data.num_context") - 1:
        return "data.context_gap"
    if (
        value("train.perceptual_weight")
        and value("train.perceptual_loss") == "vgg19"
        and not value("train.vgg19_weights")
    ):
        return "train.vgg19_weights"
    if (
        value("train.perceptual_weight")
        and value("train.perceptual_loss") == "lpips"
        and not value("eval.lpips_weights")
    ):
        return "train.perceptual_weight"
    if value("data.kind") != CAPTURES_KIND:
        changed = [key for key in CAPTURE_KEYS if value(f"data.{key}") != SETTINGS["data"][key].default]
        if changed:
            return f"data.{changed[0]}"
    if value("data.kind") not in KINDS:
        return "data.kind" if value("data.kind") not in (*LOADERS, CAPTURES_KIND) else None
    if any(value(f"data.{key}") for key in ("root", "eval_root", "eval_index")) or value("data.depth") != "none":
        return "data.root"
    if value("data.num_scenes") is None or value("eval.num_scenes") is None:
        return "num_scenes must be a number"
    return "data.synthetic" if value("data.synthetic") else False


YAML_SCALARS = st.one_of(st.text(max_size=8), st.integers(-(10**6), 10**6), st.floats(), st.booleans(), st.none())
YAML_VALUES = st.recursive(
    YAML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
SECTION_KEYS = st.sampled_from([k.split(".")[1] for k in KEYS] + ["dim", "preset", "nope"])


@settings(max_examples=120, deadline=None)
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from([*SETTINGS, "optim"]),
            st.dictionaries(SECTION_KEYS, YAML_VALUES, max_size=4) | YAML_SCALARS,
            max_size=4,
        ),
        YAML_VALUES,
    ).map(lambda doc: yaml.safe_dump(doc))
    | st.text(max_size=60)
)
def test_fuzzed_yaml_files_only_raise_config_errors(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(path)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    document, plain = yaml.safe_load(text) or {}, config.to_dict()
    for section in CHECKED:  # accepted: the file's values, the defaults elsewhere
        for key, declared in SETTINGS[section].items():
            expected = document.get(section, {}).get(key, declared.default)
            value = getattr(getattr(config, section), key)
            assert value == expected and declared.check.accepts(expected)
            # the plain form: every key; a sparse one (a newer setting) only off its default
            assert (key in plain[section]) == (not declared.sparse or value != declared.default)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train.step", "3"], "unknown config key 'train.step'; did you mean train.steps? known in 'train': ["),
        (["--trian.steps", "3"], "unknown config section 'trian'; did you mean train? known: ["),
        (["--stepz", "3"], "unknown option --stepz; did you mean --steps? use --section.key"),
        (["--data.num_contxt", "3"], "unknown config key 'data.num_contxt'; did you mean data.num_context?"),
        (["--train.zzz", "3"], "unknown config key 'train.zzz'; known in 'train': ["),  # nothing close: no guess
    ],
)
def test_unknown_keys_sections_and_options_suggest_the_closest(args, message):
    with pytest.raises(ConfigError) as error:
        apply_overrides(resolve(), args)
    assert str(error.value).startswith(message)


def test_unknown_nested_keys_suggest_the_closest():
    with pytest.raises(ModelError, match=r"unknown model options \['dimm'\]; did you mean model.dim\? known"):
        ModelConfig.from_dict({"dimm": 4})
    with pytest.raises(ConfigError, match=r"keys \['fov'\]; did you mean data.synthetic.fov_deg"):
        resolve({"data": {"synthetic": {"fov": [1, 2]}}})
    specs = parameter_specs(get_encoding("hrope-lift"))
    with pytest.raises(
        PredictorError,
        match=r"\['per_layers'\] for predictor 'learned'; did you mean "
        r"predictor_options.per_layer\?",
    ):
        build_parameter_source("learned", specs, dim=4, num_layers=1, patch_size=8, options={"per_layers": False})


# (source, options, message): every predictor option is checked, the seven without a choice list too
BAD_PREDICTOR_OPTIONS = [
    ("learned", {"plane_decoder": "flat"}, "predictor_options.plane_decoder must be null or one of direct, normal-"),
    ("backbone", {"module": 5, "feature_dim": 8}, "predictor_options.module must be null or an nn.Module or an import"),
    ("backbone", {"module": "m:f", "module_kwargs": [1]}, "predictor_options.module_kwargs must be a mapping, got [1]"),
    ("external", {"checkpoint": ""}, "predictor_options.checkpoint must be null or a path (a non-empty string)"),
    ("backbone", {"module": "m:f", "feature_dim": 2.5}, "predictor_options.feature_dim must be null or a positive"),
    ("backbone", {"module": "m:f", "hidden_dim": 0}, "predictor_options.hidden_dim must be a positive integer, got 0"),
    ("oracle", {"targets": "hidden"}, "predictor_options.targets must be one of ['neutral', 'transfer'] for predictor"),
    ("external", {"min_points": 2}, "predictor_options.min_points must be an integer >= 3, got 2"),
    ("external", {"align": "mean"}, "predictor_options.align must be one of median, none, got 'mean'"),
    ("external", {"use_normals": "no"}, "predictor_options.use_normals must be true or false, got 'no'"),
]


@pytest.mark.parametrize(
    "source, options, message", BAD_PREDICTOR_OPTIONS, ids=[f"{s}-{next(iter(o))}" for s, o, _ in BAD_PREDICTOR_OPTIONS]
)
def test_every_predictor_option_is_checked(source, options, message):
    with pytest.raises(PredictorError) as error:
        source_options(source, options)
    assert str(error.value).startswith(message)
    with pytest.raises(PredictorError) as error:  # the same through a run config
        resolve({"model": {"encoding": "hrope-lift", "predictor": source, "predictor_options": options}})
    assert str(error.value).startswith(message)


def test_source_options_complete_the_defaults_per_source():
    learned = source_options("learned", None)
    assert learned == LearnedOptions(plane_decoder=None, per_layer=True, per_head=False, targets="hidden")
    assert learned.to_dict() == {}  # only the options given are written back
    oracle = source_options("oracle", {"scope": "all"})
    assert (oracle.targets, oracle.scope, oracle.max_inverse_distance) == ("neutral", "all", 2.0)
    assert isinstance(oracle, OracleOptions) and oracle.to_dict() == {"scope": "all"}
    backbone = source_options("backbone", {"module": "pkg.mod:factory", "feature_dim": 8})
    assert backbone.hidden_dim == 64 and backbone.module_kwargs == {} and backbone.checkpoint is None
    external = resolve({"model": {"predictor": "external", "predictor_options": {"fit": "robust"}}})
    assert isinstance(external.model.predictor_options, ExternalOptions)
    assert external.model.predictor_options.fit == "robust" and external.model.predictor_options.min_points == 5
    assert external.to_dict()["model"]["predictor_options"] == {"fit": "robust"}


# (values over the defaults, the error's class, its message): the rules across keys, checked when the config is built
RULES_ACROSS_KEYS = [
    ({"data": {"kind": "xyz"}}, ConfigError, "unknown data.kind 'xyz'; expected room, object, captures or one of ["),
    ({"data": {"root": "x"}}, ConfigError, "data.root, data.eval_root, data.eval_index and data.depth are for real"),
    ({"data": {"num_scenes": None}}, ConfigError, "data.num_scenes must be a number for synthetic data"),
    ({"eval": {"num_scenes": None}}, ConfigError, "eval.num_scenes must be a number for synthetic data"),
    ({"data": {"kind": "colmap"}}, ConfigError, "data.root is required for data.kind 'colmap' (the dataset folder)"),
    (
        {"data": {"kind": "colmap", "root": "x", "eval_index": "i.json"}},
        ConfigError,
        "data.eval_index is for data.kind",
    ),
    ({"data": {"kind": "re10k", "root": "x", "depth": "maps"}}, ConfigError, "data.depth 'maps' is for scene folders"),
    ({"data": {"kind": "re10k", "root": "x", "image_factor": 2}}, ConfigError, "data.image_factor is for the scene-"),
    ({"data": {"kind": "re10k", "root": "x"}, "eval": {"split": "val"}}, ConfigError, "eval.split 'val' (validation"),
    ({"train": {"perceptual_weight": 0.5}}, ConfigError, "train.perceptual_weight > 0 needs local LPIPS weights"),
    ({"model": {"encoding": "rayrope", "encoding_options": {"anchors": [1.0]}}}, ModelError, "model.encoding_options"),
    (
        {"model": {"encoding": "rayrope", "encoding_options": {"numerics": "x"}}},
        ModelError,
        "rayrope: numerics must be one of",
    ),
    (
        {"model": {"encoding": "hrope-lift", "folded_attention": True, "predictor_options": {"per_head": True}}},
        ModelError,
        "model.folded_attention folds one transform per view",
    ),
    (
        {"model": {"encoding": "hrope-depth", "predictor_options": {"targets": "transfer"}}},
        PredictorError,
        "predictor_options.targets 'transfer' carries planes",
    ),
    (
        {"model": {"encoding": "hrope", "predictor": "backbone"}},
        PredictorError,
        "the 'backbone' predictor needs predictor_options.module",
    ),
]


@pytest.mark.parametrize("values, error, message", RULES_ACROSS_KEYS, ids=[m[:30] for _, _, m in RULES_ACROSS_KEYS])
def test_rules_across_keys_are_checked_when_the_config_is_built(values, error, message):
    with pytest.raises(error) as caught:
        resolve(values)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # every config error is one, for the command and load_config
