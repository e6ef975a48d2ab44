"""The core install: ``pip install hrope`` into a fresh virtualenv brings torch and nothing of the
toolkit (torch and numpy only), the README's quick start runs there, and the ``hrope`` command says what to install.
The wheel ships the ``py.typed`` marker (PEP 561)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from hrope.nvs import REQUIREMENTS

ROOT = Path(__file__).resolve().parents[1]


def readme_quick_start() -> str:
    """The first python code block of the README's quick start section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_core_dependencies_are_torch_and_numpy_and_the_toolkit_extra_matches_its_imports():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [re.split(r"[<>=!]", d)[0] for d in project["dependencies"]] == ["torch", "numpy"]
    nvs = {re.split(r"[<>=!]", d)[0] for d in project["optional-dependencies"]["nvs"]}
    assert nvs == set(REQUIREMENTS.values())
    assert project["scripts"]["hrope"] == "hrope.nvs:main"


def package_copy(tmp_path: Path) -> Path:
    """A copy of what a build reads (pyproject.toml, README, LICENSE, src/), so a build leaves nothing in
    the working tree."""
    package = tmp_path / "package"
    package.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, package / name)
    shutil.copytree(ROOT / "src", package / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    return package


def test_the_wheel_ships_the_py_typed_marker(tmp_path):
    package, wheels = package_copy(tmp_path), tmp_path / "wheels"
    build = "import sys, setuptools.build_meta as backend; print(backend.build_wheel(sys.argv[1]))"
    built = (
        subprocess.run(
            [sys.executable, "-c", build, str(wheels)], cwd=package, check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    names = zipfile.ZipFile(wheels / built).namelist()
    assert "hrope/py.typed" in names and "hrope/__init__.py" in names, names
    assert (ROOT / "src" / "hrope" / "py.typed").read_bytes() == b""


@pytest.mark.slow
def test_core_install_in_a_fresh_virtualenv_runs_the_quick_start(tmp_path):
    package = package_copy(tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    torch_spec = os.environ.get("TORCH_SPEC") or f"torch=={torch.__version__}"

    def pip(*args):
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True, capture_output=True)

    pip(torch_spec)  # first, as the README says, so the core install keeps this build
    pip(str(package))
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True, text=True
    ).stdout.lower()
    installed = {line.split("==")[0] for line in listed.split()}
    assert "hrope" in installed and "torch" in installed
    assert not installed & set(REQUIREMENTS.values()), installed
    has_marker = "import hrope, pathlib; print(pathlib.Path(hrope.__file__).with_name('py.typed').is_file())"
    marker = subprocess.run([str(python), "-c", has_marker], capture_output=True, text=True, cwd=tmp_path)
    assert marker.stdout.strip() == "True", marker.stderr
    quick_start = subprocess.run(
        [str(python), "-c", readme_quick_start()], capture_output=True, text=True, cwd=tmp_path
    )
    assert quick_start.returncode == 0, quick_start.stderr
    command = subprocess.run(
        [str(env_dir / "bin" / "hrope"), "train", "configs/tiny.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert command.returncode == 2
    lines = command.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'hrope[nvs]'" in lines[0], command.stderr
    for command in ("--version", "info"):  # the library alone answers these
        answer = subprocess.run([str(env_dir / "bin" / "hrope"), command], capture_output=True, text=True)
        assert answer.returncode == 0 and answer.stdout.startswith("hrope "), answer.stderr
    assert "NVS toolkit: missing" in answer.stdout and "hrope-lift" in answer.stdout


# torch releases users have: the oldest supported, the one `make` installs, and the newest ones
TORCH_RELEASES = ("2.4.0", "2.5.1", "2.13.0", "2.14.1", "2.15.0")


def declared_torch() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "torch")


def test_the_declared_torch_range_admits_the_installed_torch_and_current_releases():
    torch_range = declared_torch().specifier
    assert torch_range.contains(torch.__version__, prereleases=True), (torch.__version__, str(torch_range))
    for release in TORCH_RELEASES:
        assert torch_range.contains(release), (release, str(torch_range))
    assert not torch_range.contains("2.3.1")  # nn.RMSNorm (the model's QK-norm) arrived in 2.4


def test_the_readme_and_the_makefile_state_the_declared_range():
    """The README states the range pyproject declares, and the Makefile's default TORCH_SPEC is in it."""
    readme = (ROOT / "README.md").read_text()
    assert f"accepts any torch `{declared_torch().specifier}`" in readme
    default = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert declared_torch().specifier.contains(default)
