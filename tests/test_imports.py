"""The import graph: the library never imports the toolkit, and every import points down a layer.

The layers (``LAYERS`` below; the README's "Layout" section draws them): a module may import
modules of a lower layer, and modules of its own package inside the same layer
(``hrope.encodings.*``, ``hrope.nvs.data.*``), never above.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"

# module (or package prefix ending in ".") -> layer; the library is layers 0-6, the toolkit 10-19
LAYERS = {
    "hrope.errors": 0,
    "hrope.geometry": 0,
    "hrope.shapes": 0.5,
    "hrope.cameras": 1,
    "hrope.planes": 2,
    "hrope.rays": 2,
    "hrope.encodings.": 3,
    "hrope.tokens": 4,
    "hrope.attention": 5,
    "hrope.about": 5,
    "hrope.reference": 5,
    "hrope.testing": 5,
    "hrope": 6,
    "hrope.nn.": 6,
    "hrope.integrations.": 7,
    # the toolkit: hrope.nvs and its rooms (running, evaluation, viz, sources), each module at its own layer
    "hrope.nvs.running": 9,
    "hrope.nvs.evaluation": 9,
    "hrope.nvs.viz": 9,
    "hrope.nvs.running.atomic": 9,
    "hrope.nvs.running.provenance": 9,
    "hrope.nvs.running.tensor_files": 10,
    "hrope.nvs.running.folder_lock": 10,
    # the settings (fields, schema, the model section) below the data, which declares its own with them;
    # the run config above it, since it checks data.kind against the data registries
    "hrope.nvs.config.fields": 10,
    "hrope.nvs.config.options": 10.1,
    "hrope.nvs.config.schema": 10.2,
    "hrope.nvs.config.model_config": 10.4,
    "hrope.nvs.evaluation.vgg": 9,
    "hrope.nvs.evaluation.metrics": 10.3,  # the LPIPS backbones' names come from the config schema
    "hrope.nvs.running.perceptual": 11,
    "hrope.nvs.data.": 11,
    "hrope.nvs.running.distributed": 11,
    "hrope.nvs.config.": 11.5,
    "hrope.nvs.sources.": 12,  # the plane sources with the geometry they use (plane fitting, transfer, user depth)
    "hrope.nvs.config_docs": 12,
    "hrope.nvs.model_folder": 12.8,  # the saved-model folder: LVSM.from_pretrained / save_pretrained
    "hrope.nvs.model": 13,
    "hrope.nvs.running.runs": 14,
    "hrope.nvs.build_data": 14,
    "hrope.nvs.running.checkpoints": 14,
    "hrope.nvs.running.train_step": 14,
    "hrope.nvs.evaluation.plane_accuracy": 14,
    "hrope.nvs.lvsm_official": 14.2,  # official LVSM checkpoints into the model
    "hrope.nvs.pretrained": 14.5,  # reads checkpoints; viz and evaluate load through it
    "hrope.nvs.running.train": 15,
    "hrope.nvs.viz.figures": 15,
    "hrope.nvs.evaluation.evaluate": 16,
    "hrope.nvs.evaluation.protocol_report": 16,
    "hrope.nvs.evaluation.attention_probe": 16,
    "hrope.nvs.viz.demo_figures": 16,
    "hrope.nvs.viz.scene3d": 16,
    "hrope.nvs.evaluation.protocols": 17,
    "hrope.nvs.demo": 17,
    "hrope.nvs.viz.viewer3d": 17,
    "hrope.nvs.viz.attention": 17,
    "hrope.nvs.cli": 18,
    "hrope.nvs": 19,
}
LIBRARY_THIRD_PARTY = {"torch"}
# optional imports made inside functions only (the module imports without them)
OPTIONAL_THIRD_PARTY = {"hrope.encodings.fused_triton": {"triton"}}
# the integrations (layer 7, opt-in: nothing imports them by default) may import their own library at module
# level; the package hrope.integrations itself imports nothing
INTEGRATION_THIRD_PARTY = {
    "hrope.integrations.transformers": {"transformers"},
    "hrope.integrations.diffusers": {"diffusers"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> tuple[str, int]:
    """(group, layer) of ``module``: the longest matching entry of LAYERS."""
    for key in sorted(LAYERS, key=len, reverse=True):
        if module == key.rstrip(".") or (key.endswith(".") and module.startswith(key)) or module == key:
            return key, LAYERS[key]
    raise KeyError(f"{module} is not in the LAYERS table of tests/test_imports.py: add it")


def imports(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (module level and inside functions)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            # "from . import x" / "from .encodings import base": the imported names may be modules
            found.update(
                f"{name}.{alias.name}"
                for alias in node.names
                if (SOURCE / Path(*f"{name}.{alias.name}".split("."))).with_suffix(".py").exists()
            )
    return found


def module_level_imports(path: Path) -> set[str]:
    """Top-level package names imported by the module body itself (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
    return names


MODULES = {module_name(p): p for p in sorted((SOURCE / "hrope").rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_import_points_down(module):
    group, level = layer(module)
    for target in imports(MODULES[module]):
        top = target.split(".")[0]
        if top != "hrope":
            if level < 10:  # the library: torch and the standard library only (optional ones inside functions)
                optional = top in OPTIONAL_THIRD_PARTY.get(module, ()) and top not in module_level_imports(
                    MODULES[module]
                )
                integration = top in INTEGRATION_THIRD_PARTY.get(module, ())
                assert top in LIBRARY_THIRD_PARTY or top in sys.stdlib_module_names or optional or integration, (
                    f"library module {module} imports third-party {target}"
                )
            continue
        target_group, target_level = layer(target)
        same_package = target_group == group and group.endswith(".")
        assert target_level < level or same_package, (
            f"{module} (layer {level}) imports {target} (layer {target_level}): imports must point down"
        )
        if level < 10:
            assert target_level < 10, f"library module {module} imports the toolkit ({target})"


# inside hrope.nvs.data: the shared modules, the two floors on them (which never import each other), the wrappers
DATA_LEVELS = {
    "hrope.nvs.data.synthetic": 1,
    "hrope.nvs.data.real": 1,
    "hrope.nvs.data.dataset": 2,
    "hrope.nvs.data": 3,
}


def data_level(module: str) -> tuple[str, int]:
    """(group, level) of a module of ``hrope.nvs.data``: a floor, the wrappers, the package, else a shared module."""
    for group, level in DATA_LEVELS.items():
        if module == group or (level == 1 and module.startswith(group + ".")):
            return group, level
    return "shared", 0


def in_data(module: str) -> bool:
    return module == "hrope.nvs.data" or module.startswith("hrope.nvs.data.")


@pytest.mark.parametrize("module", sorted(filter(in_data, MODULES)))
def test_data_floors_point_down(module):
    group, level = data_level(module)
    for target in imports(MODULES[module]):
        if in_data(target):
            target_group, target_level = data_level(target)
            assert target_level < level or target_group == group, (
                f"{module} (data level {level}) imports {target} (data level {target_level}): imports must point down"
            )


def test_the_layer_table_covers_every_module():
    for module in MODULES:
        layer(module)


def test_import_hrope_loads_the_library_only():
    """``import hrope`` (and ``import hrope.integrations``) adds only library modules to what ``import torch``
    loads by itself: no integration module and none of their libraries."""
    code = (
        "import sys, torch; before = set(sys.modules); import hrope, hrope.integrations; "
        "print(sorted(m for m in set(sys.modules) - before))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = ast.literal_eval(result.stdout)  # the printed list of module names
    assert added and all(m.split(".")[0] == "hrope" for m in added), added
    assert not [m for m in added if m.startswith("hrope.nvs") or m == "hrope.reference"], added
    assert not [m for m in added if m.startswith("hrope.integrations.")], added
    assert not {m.split(".")[0] for m in added} & set().union(*INTEGRATION_THIRD_PARTY.values()), added


def test_benchmarks_import_nothing_from_tests():
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text()
        names = imports_of_file(path)
        assert not names & {"helpers", "_lvsm_helpers", "conftest"}, f"{path.name} imports from tests/"
        assert '"tests"' not in text and "'tests'" not in text, f"{path.name} puts tests/ on sys.path"


def imports_of_file(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def module_edges(path: Path) -> set[str]:
    """The hrope modules ``path`` imports. ``from package import module`` is an edge to that module
    alone (Python loads the package first, but the package's own imports are its edges)."""
    edges = set()
    for target in imports(path):
        if target not in MODULES:
            continue
        is_package = MODULES[target].name == "__init__.py"
        if not (is_package and any(other.startswith(target + ".") for other in imports(path))):
            edges.add(target)
    return edges


def test_no_import_cycles():
    """Depth-first search over every import of every module (function-level ones too)."""
    graph = {module: module_edges(path) - {module} for module, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [module, target] if target in path else [module, target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
