"""Which code produced a result: the git commit of a run or a benchmark, and a fingerprint of the source.

:func:`code_provenance` is what every training run records in ``segments.jsonl``; :func:`provenance`
(the same plus the torch version) is recorded in every benchmark and experiment JSON, and
:func:`describe` is its commit line in Markdown. :func:`source_fingerprint` identifies the library
and toolkit source (``src/hrope/**/*.py``) up to comments, docstrings and formatting; the
experiment harness uses it to tell whether a cached cell was trained by the current code.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path

import torch

__all__ = ["code_provenance", "provenance", "describe", "source_fingerprint"]


def code_provenance(source: Path = Path(__file__)) -> dict:
    """``{"commit", "dirty"}`` of the git checkout that tracks the file ``source`` (both None when no
    checkout tracks it, or without git): ``commit`` = ``git rev-parse HEAD``; ``dirty`` = tracked files
    have uncommitted changes (untracked files do not count). Read-only git commands only."""
    folder = source.resolve().parent

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    if git("ls-files", "--error-unmatch", source.name) is None:
        return {"commit": None, "dirty": None}
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def provenance() -> dict:
    """``{"commit", "dirty", "torch"}``: :func:`code_provenance` of the checkout that tracks this
    package (what training runs record too; both None outside one) and ``torch.__version__``."""
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
    package = Path(package or Path(__file__).parents[2])
    digest = hashlib.sha256()
    for relative in sorted((p.relative_to(package) for p in package.rglob("*.py")), key=Path.as_posix):
        if any(part.startswith(".") for part in relative.parts):
            continue  # hidden folders, editor lock files
        source = (package / relative).read_text(encoding="utf-8")
        digest.update(f"{relative.as_posix()}\0{_normalised(source, str(package / relative))}\0".encode())
    return digest.hexdigest()[:16]
