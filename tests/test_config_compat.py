"""The typed run config keeps every saved form: config hashes, config files and committed cells.

``RunConfig.to_dict()`` is the plain form that ``config.yaml``, checkpoint metadata, saved models and
config hashes hold. The hashes below were computed by the code before the config had types (the
plain dict that ``resolve`` returned then), so a change to the plain form shows up here as a
changed hash; the committed experiment cells must keep the keys they were stored under, and their
configs must still build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

import experiments.plane_evidence as plane_evidence
import experiments.rows as nvs_rows
from experiments.rows import Budget, Cell, cell_config, cell_settings, tables
from experiments.store import CELLS_NAME
from hrope.nvs.config import ModelConfig, RunConfig, load_config, resolve
from hrope.nvs.model import build_model
from hrope.nvs.running.runs import config_hash

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# config_hash of the resolved configs, computed before the config had types
HASHES = {
    "defaults": "c171c45b4e57ae957f7b9415c9c24d96abc626bd9cdae5a13d082419f0d9074e",
    "co3d.yaml": "7fc3de39d588ddf04ba41bf96aa8b329a5f314ad657dd40c4cb6d2e48f65d898",
    "dl3dv.yaml": "aa82f9c841e58eb90763f2a1e1c8609f170d62cd931b6a38554e6f52b2564175",
    "folder.yaml": "02947b10d92ca5e6049387e456b4f5dda4a2ad07d7e12ed229558e6b85934260",
    "paper.yaml": "93b581bc4d97e033bbc43a89726bc6a53a182f8b406601484fcf7ef44f181703",
    "re10k.yaml": "beda8bf9676010c77cf647d1615fc3c3ce8fa8ce76d7783afce52f91cce2a75e",
    "tiny.yaml": "26c2ebd4f3528d3b3f8003eebad67e966d1d40b5667ce02e3075e00c3b8de0f7",
}

# configs that name model keys, predictor options, encoding options and data.synthetic, and the sha256
# of json.dumps of their resolved plain form (key order included), computed before the config had types
RICH = {
    "model keys": (
        {"model": {"rays": "world", "encoding": "hrope-lift", "layers": 2, "preset": "small"}},
        "a1a61585331c399734b430f4e58b38f244dc8788dadff49668327596a1a42665",
    ),
    "options": (
        {
            "model": {
                "encoding": "hrope-lift",
                "predictor": "external",
                "predictor_options": {"targets": "transfer", "use_normals": False, "max_inverse_distance": 2.0},
            },
            "data": {"synthetic": {"fov_deg": [40, 60]}, "context_gap": [1, 5]},
            "train": {"lr": 1, "steps": 7},
        },
        "45197f477c3c6480fbfe2263f489cc402b606ef8e36312c8d4a4f8754c86b29e",
    ),
    "every model field": (
        {
            "model": {
                "preset": None,
                "image_size": 32,
                "patch_size": 8,
                "dim": 64,
                "layers": 2,
                "heads": 2,
                "mlp_ratio": 4.0,
                "qk_norm": True,
                "encoding": "urope",
                "encoding_options": {"anchors": [1000.0]},
                "rays": "auto",
                "predictor": "learned",
                "predictor_options": {"per_head": True},
                "depth_init": 1.0,
                "additive": None,
                "transform_backend": "torch",
                "folded_attention": False,
            }
        },
        "1b2f78082be79aa0fd5aed7cca6d745a40e8c59cdb0b084f846c4933f65a07e5",
    ),
    "additive": (
        {
            "model": {
                "encoding": "prope",
                "additive": "hrope-lift",
                "predictor": "oracle",
                "predictor_options": {"scope": "all"},
            },
            "eval": {"split": "val", "num_scenes": 8},
        },
        "fbc26238c426402a4d17d06c5bf134602b20568036bd35e1fed6334c273932f6",
    ),
}


@pytest.mark.parametrize("name", sorted(HASHES))
def test_the_defaults_and_the_shipped_configs_hash_as_before(name):
    config = resolve() if name == "defaults" else load_config(ROOT / "configs" / name)
    assert config_hash(config) == HASHES[name]
    assert resolve(config.to_dict()).to_dict() == config.to_dict()  # the plain form reads back as itself


@pytest.mark.parametrize("name", sorted(RICH))
def test_the_plain_form_is_the_resolved_dict_of_before_key_for_key(name):
    values, digest = RICH[name]
    config = resolve(values)
    assert hashlib.sha256(json.dumps(config.to_dict()).encode()).hexdigest() == digest
    assert resolve(config.to_dict()).to_dict() == config.to_dict()


def test_the_tree_is_typed_and_frozen():
    config = resolve(RICH["options"][0])
    assert isinstance(config, RunConfig) and isinstance(config.model, ModelConfig)
    assert (config.model.heads, config.model.predictor_options.targets, config.train.steps) == (4, "transfer", 7)
    assert config.model.predictor_options.fit == "least-squares"  # the options not given take their defaults
    for section, name in ((config, "train"), (config.train, "lr"), (config.model, "dim")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.predictor_options.targets = "neutral"


def _rows() -> dict[str, nvs_rows.Row]:
    """Every row the NVS table and the plane-evidence sets define, by folder name."""
    found = {row.key: row for table in tables(nvs_rows.BUDGETS["quick"]).values() for row in table.rows}
    found.update({row.key: row for rows in plane_evidence.SETS.values() for row in rows})
    return found


# (experiment, its report): runs of the NVS table, of plane_evidence's sets, a validation-scored one
COMMITTED = [
    ("nvs_quick", "nvs_table.json"),
    ("plane_evidence", "plane_evidence.json"),
    ("near_camera_cap_val", "near_camera_cap_val.json"),
    ("depth_noise", "depth_noise.json"),
]


@pytest.mark.parametrize("experiment, report", COMMITTED, ids=[e for e, _ in COMMITTED])
def test_committed_cells_keep_their_config_hashes_and_their_configs_build(experiment, report, monkeypatch, tmp_path):
    recorded = json.loads((RESULTS / experiment / report).read_text())
    budget = Budget(**recorded["budget"])
    monkeypatch.setattr(nvs_rows, "RESULTS_VERSION", recorded["provenance"]["results_version"])
    rows, checked, built = _rows(), 0, set()
    for line in (RESULTS / experiment / CELLS_NAME).read_text().splitlines():
        cell_id, record = json.loads(line)["cell"], json.loads(line)["record"]
        dataset, key, _ = cell_id.split("/")
        if key not in rows:
            continue
        cell = Cell(dataset, rows[key], record["seed"])
        split = record.get("split", "eval")
        stored_under = cell_id.rsplit("-", 1)[1]  # the store's key: <dataset>/<row key>/seed<k>-<config hash>
        assert nvs_rows.config_hash(cell_settings(budget, cell, split=split)) == stored_under, cell_id
        config = cell_config(budget, cell, tmp_path / "run", split=split)  # the config of a resumed cell
        if key not in built:  # each row's model builds from it (once per row)
            assert build_model(config).config == config.model
            built.add(key)
        checked += 1
    assert checked >= 12, f"only {checked} cells of {experiment} matched a known row"
