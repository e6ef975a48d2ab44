"""mkdocs hooks of the docs site (``mkdocs.yml``): the repository's Markdown, served as it is written.

The Markdown files keep the relative links a reader of the repository follows. For the site:

- ``README.md`` is the home page (``index.md``) and ``CONTRIBUTING.md`` a page (``contributing.md``),
  generated from the files at the repository root (nothing is copied into ``docs/``);
- a link between pages points to the page on the site (``docs/model.md`` from the README is
  ``model.md``);
- a link from a page to any other file of the repository (a figure under ``benchmarks/results/``,
  a source file) is served from the site as ``repo/<its path in the repository>``.

A link to a file that does not exist is left as written, so that ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
REPO_PREFIX = "repo"
# [text](target) and ![alt](target), with an optional "title"; the target has no spaces
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _source(file: File, config: MkDocsConfig) -> Path:
    """The file in the repository a site page is read from."""
    for name, uri in ROOT_PAGES.items():
        if file.src_uri == uri:
            return _root(config) / name
    return Path(file.abs_src_path or "").resolve()


def _site_uri(target: Path, config: MkDocsConfig) -> str | None:
    """Where the repository file ``target`` is on the site (None: outside the repository or missing)."""
    root, docs = _root(config), Path(config.docs_dir).resolve()
    if not target.exists() or not target.is_relative_to(root):
        return None
    if target.is_relative_to(docs):
        return target.relative_to(docs).as_posix()
    relative = target.relative_to(root).as_posix()
    if relative in ROOT_PAGES:
        return ROOT_PAGES[relative]
    return f"{REPO_PREFIX}/{relative}" if target.is_file() else None


def _targets(markdown: str, source: Path):
    """``(link match, resolved repository path, anchor)`` of every relative link in ``markdown``."""
    for match in LINK.finditer(markdown):
        link = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith(("#", "/")):
            continue
        path, _, anchor = link.partition("#")
        yield match, (source.parent / path).resolve(), anchor


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the root pages and every other repository file a page links to."""
    for name, uri in ROOT_PAGES.items():
        files.append(File.generated(config, uri, abs_src_path=str(_root(config) / name)))
    served = set()
    for file in list(files.documentation_pages()):
        source = _source(file, config)
        for _, target, _ in _targets(source.read_text(encoding="utf-8"), source):
            uri = _site_uri(target, config)
            if uri is not None and uri.startswith(f"{REPO_PREFIX}/") and uri not in served:
                served.add(uri)
                files.append(File.generated(config, uri, abs_src_path=str(target)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the page's relative links to where their targets are on the site."""
    source = _source(page.file, config)
    here = posixpath.dirname(page.file.src_uri) or "."
    pieces, last = [], 0
    for match, target, anchor in _targets(markdown, source):
        uri = _site_uri(target, config)
        if uri is None:
            continue
        link = posixpath.relpath(uri, here) + (f"#{anchor}" if anchor else "")
        pieces += [markdown[last : match.start(2)], link]
        last = match.end(2)
    return "".join(pieces) + markdown[last:]
