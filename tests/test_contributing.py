"""CONTRIBUTING.md's "Add an encoding" steps, followed literally on a copy of the repository: the
file it shows, the two diffs it shows (``git apply``), then the suite's registry-wide encoding tests
on the toy encoding (fast path against the float64 reference, gradients, low precision, extremes,
mixed tokens, the model's forward and backward, validation, the import layers)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"
REGISTRY_TESTS = [
    "test_encodings.py",
    "test_precision_gradients.py",
    "test_numerics_extremes.py",
    "test_special_tokens.py",
    "test_model.py",
    "test_validation.py",
    "test_imports.py",
]


def unindent(block: str, indent: str) -> str:
    """``block`` without the list item's ``indent`` (a diff's lone-space context lines kept)."""
    return "\n".join(line[len(indent) :] if line.startswith(indent) else line.strip() for line in block.split("\n"))


def encoding_steps() -> tuple[str, str, list[str], str]:
    """``(new file's path, its code, [diffs])`` of the guide's "Add an encoding" section, and the toy's name."""
    section = GUIDE.read_text().split("## Add an encoding", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"\n( *)```(python|diff)\n(.*?)\n\1```", section, flags=re.S)
    code = [unindent(body, indent) for indent, kind, body in blocks if kind == "python"]
    diffs = [unindent(body, indent) + "\n" for indent, kind, body in blocks if kind == "diff"]
    assert len(code) == 1 and len(diffs) == 2, "the section shows one new file and two diffs"
    path, _, source = code[0].partition("\n")
    name = re.search(r'^\s*name = "([^"]+)"', source, flags=re.M).group(1)
    return path.removeprefix("# ").strip(), source, diffs, name


@pytest.mark.slow
def test_the_add_an_encoding_steps_give_a_working_encoding(tmp_path):
    path, source, diffs, name = encoding_steps()
    for part in ("src", "tests", "pyproject.toml"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(
            ROOT / part,
            tmp_path / part,
            **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")} if (ROOT / part).is_dir() else {}),
        )
    assert not (tmp_path / path).exists(), f"{path} exists already: the guide's toy must be a new file"
    (tmp_path / path).write_text(source)
    for diff in diffs:
        applied = subprocess.run(["git", "apply", "-"], input=diff, cwd=tmp_path, capture_output=True, text=True)
        assert applied.returncode == 0, f"a diff of CONTRIBUTING.md no longer applies: {applied.stderr}"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    words = " and ".join(name.split("-"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            words,
            "-rA",
            *[f"tests/{test}" for test in REGISTRY_TESTS],
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", run.stdout, flags=re.M))
    assert any("test_fast_path_matches_float64_reference" in test and name in test for test in passed), run.stdout[
        -2000:
    ]
    assert any("test_gradcheck_through_fast_path" in test and name in test for test in passed)
    assert any("test_forward_backward_every_encoding" in test and name in test for test in passed)
    assert len(passed) >= 30, sorted(passed)
