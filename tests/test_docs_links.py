"""Every relative link in the Markdown docs (README.md, DESIGN.md, docs/**/*.md) resolves: the
file exists and, for ``#anchor`` links, the target has a heading with that GitHub anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "DESIGN.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2``, ... for repeats)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*#*$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(FENCE.sub("", path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)
    ]  # http:, https:, mailto: ...


def test_anchor_rule():
    # "## Training (`hrope.nvs.running.train.train`, `hrope train`)"
    assert "training-hropenvsrunningtraintrain-hrope-train" in anchors(ROOT / "docs" / "model.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: " + ", ".join(broken)
