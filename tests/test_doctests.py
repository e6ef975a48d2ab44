"""The docstring examples (``>>>``) of ``src/hrope`` run as doctests.

Only the modules whose source holds an example are imported, so modules of optional integrations
without examples never are. An example states its shapes, runs in well under a second and reads
no file and no network."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(
    ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
    for path in (SRC / "hrope").rglob("*.py")
    if ">>>" in path.read_text(encoding="utf-8")
)


def test_the_public_entry_points_have_examples():
    assert {"hrope.attention", "hrope.encodings", "hrope.nn", "hrope.nn.attention"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    tests = doctest.DocTestFinder().find(module, module.__name__)
    for test in tests:
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{name}: no example found"
    assert result.failed == 0, "".join(report)
