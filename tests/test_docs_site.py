"""The docs site (mkdocs.yml, mkdocs_hooks.py): every page is in the nav, README / CONTRIBUTING links
work on the site, and a broken link or anchor fails the strict build (``make test`` builds the real site)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


class _Loader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose ``!!python/...`` tags (the slug function) become None."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)


def _nav_pages(nav) -> set[str]:
    pages = set()
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_docs_page_is_in_the_nav():
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")}
    nav = _nav_pages(_config()["nav"])
    assert pages - nav == set(), "docs pages missing from mkdocs.yml's nav"
    assert nav - pages == {"index.md", "contributing.md"}  # generated from README.md and CONTRIBUTING.md


def test_the_site_fetches_nothing_at_build_time():
    config = _config()
    assert config["theme"]["font"] is False  # no web fonts
    assert config["strict"] is True
    assert {name for entry in config["plugins"] for name in (entry if isinstance(entry, dict) else {entry: 0})} == {
        "search",
        "mkdocstrings",
    }


def _project(tmp_path: Path, page_a: str) -> Path:
    """A small site with the repository's theme, validation and hooks (no API pages)."""
    config = (ROOT / "mkdocs.yml").read_text().split("\nplugins:")[0]
    config = config.replace("  - mkdocs_hooks.py", f"  - {ROOT / 'mkdocs_hooks.py'}")
    nav = "\nnav:\n  - index.md\n  - a.md\n  - sub/b.md\n  - contributing.md\n"
    (tmp_path / "mkdocs.yml").write_text(config + "\nplugins: [search]\n" + nav)
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "plot.png").write_bytes(b"\x89PNG")
    (tmp_path / "README.md").write_text("# Home\n\nSee [a](docs/a.md#a-section) and [how](CONTRIBUTING.md).\n")
    (tmp_path / "CONTRIBUTING.md").write_text("# Contributing\n\nBack [home](README.md).\n")
    (tmp_path / "docs" / "a.md").write_text(page_a)
    (tmp_path / "docs" / "sub" / "b.md").write_text("# B\n\n![plot](../../figures/plot.png) [a](../a.md)\n")
    return tmp_path


def _build(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"],
        cwd=project,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )


@pytest.mark.slow
def test_root_pages_and_repository_files_are_linked_on_the_site(tmp_path):
    project = _project(tmp_path, "# A\n\n## A section\n\n[home](../README.md)\n")
    result = _build(project)
    assert result.returncode == 0, result.stderr
    site = project / "site"
    assert 'href="a.html#a-section"' in (site / "index.html").read_text()
    assert 'href="contributing.html"' in (site / "index.html").read_text()
    assert 'href="index.html"' in (site / "contributing.html").read_text()
    assert 'src="../repo/figures/plot.png"' in (site / "sub" / "b.html").read_text()
    assert (site / "repo" / "figures" / "plot.png").read_bytes() == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize(
    "link, complaint",
    [("sub/b.md#no-such-anchor", "does not contain an anchor"), ("../figures/missing.png", "not found")],
)
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path, link, complaint):
    project = _project(tmp_path, f"# A\n\n## A section\n\n[broken]({link})\n")
    result = _build(project)
    assert result.returncode != 0
    assert complaint in result.stderr
