"""Size limits that keep the code readable: library, toolkit and benchmark files under 500 lines and
functions under 60 lines. Exempt: the dense float64 reference (one file holding every encoding's
independent reference, so that it imports nothing of the fast path) and the Triton kernel (one
kernel body; splitting it would cost launches or registers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src" / "hrope").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
FILE_LIMIT_EXEMPT = {"src/hrope/reference.py"}
FUNCTION_LIMIT_EXEMPT = {"src/hrope/reference.py", "src/hrope/encodings/fused_triton.py:_transform_kernel"}


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", SOURCES, ids=relative)
def test_file_length(path):
    if relative(path) in FILE_LIMIT_EXEMPT:
        return
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{relative(path)} has {lines} lines (limit {MAX_FILE_LINES}): split it"


@pytest.mark.parametrize("path", SOURCES, ids=relative)
def test_function_length(path):
    if relative(path) in FUNCTION_LIMIT_EXEMPT:
        return
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        and f"{relative(path)}:{node.name}" not in FUNCTION_LIMIT_EXEMPT
    ]
    assert not long, f"{relative(path)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
