"""Provenance of benchmark results: the code that produced them (shared by every benchmark script).

:func:`provenance` is recorded in every result JSON (``commit``, ``dirty``, ``torch``) and
:func:`describe` is the commit line of the Markdown. :func:`source_fingerprint` identifies the
library + toolkit source (``src/hrope/**/*.py``) up to comments, docstrings and formatting; the
NVS benchmark uses it to tell whether a cached cell was trained by the current code.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import torch

import hrope
from hrope.nvs.runs import code_provenance

__all__ = ["provenance", "describe", "source_fingerprint"]


def provenance() -> dict:
    """``{"commit", "dirty", "torch"}``: :func:`hrope.nvs.runs.code_provenance` of the checkout that
    tracks the benchmarks (what training runs record too; both None outside one) and
    ``torch.__version__``."""
    return {**code_provenance(Path(__file__)), "torch": torch.__version__}


def describe(record: dict | None, short: bool = False) -> str:
    """The commit of a :func:`provenance` dict in words: ``"<sha> + uncommitted changes"``,
    ``"unknown (not a git checkout)"`` or ``"not recorded"`` (no provenance). ``short``: the
    first 10 hex digits of the commit."""
    if not record or "commit" not in record:
        return "not recorded"
    if record["commit"] is None:
        return "unknown (not a git checkout)"
    commit = record["commit"][:10] if short else record["commit"]
    return commit + (" + uncommitted changes" if record.get("dirty") else "")


def _normalised(source: str, filename: str) -> str:
    """The module without comments, docstrings or formatting (``ast.unparse`` of its tree)."""
    tree = ast.parse(source, filename=filename)
    for node in list(ast.walk(tree)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:]
    return ast.unparse(tree)


def source_fingerprint(package: str | Path | None = None) -> str:
    """Hash of every ``*.py`` under ``package`` (default: the imported ``hrope`` package, i.e.
    ``src/hrope``), normalised so that comments, docstrings and formatting do not count, over the
    sorted relative paths. Any other edit (code, a default value, a renamed or added module)
    changes it."""
    package = Path(package or Path(hrope.__file__).parent)
    digest = hashlib.sha256()
    for relative in sorted((p.relative_to(package) for p in package.rglob("*.py")), key=Path.as_posix):
        if any(part.startswith(".") for part in relative.parts):
            continue  # hidden folders, editor lock files
        source = (package / relative).read_text(encoding="utf-8")
        digest.update(f"{relative.as_posix()}\0{_normalised(source, str(package / relative))}\0".encode())
    return digest.hexdigest()[:16]
